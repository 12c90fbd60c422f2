package dev.caudal.bench.flink;

/**
 * Caudal's sensor generator (operators/src/generator/), ported formula for formula so both
 * engines process the same readings: a pure function of (seed, sensor, round).
 *
 * <p>Sensors are divided into {@code splits} shards; split {@code k} owns the sensors
 * {@code s} with {@code s % splits == k}, and its n-th record is a function of (seed, k, n).
 * A bounded run takes the first {@code records} readings in round-major order.
 */
final class SensorModel implements java.io.Serializable {
    private static final long serialVersionUID = 1L;

    /** 2026-01-01T00:00:00Z: event time of the first reading of a bounded run. */
    static final long START_MS = 1_767_225_600_000L;
    /** Event time between two readings of a sensor when unthrottled. */
    static final long INTERVAL_MS = 1000;

    final long seed;
    final long sensors;
    final long records;
    final double faultyFraction;
    final int splits;

    SensorModel(long seed, long sensors, long records, double faultyFraction, int splits) {
        this.seed = seed;
        this.sensors = sensors;
        this.records = records;
        this.faultyFraction = faultyFraction;
        this.splits = (int) Math.min(splits, sensors);
    }

    /** SplitMix64. */
    static long mix(long z) {
        z += 0x9e3779b97f4a7c15L;
        z = (z ^ (z >>> 30)) * 0xbf58476d1ce4e5b9L;
        z = (z ^ (z >>> 27)) * 0x94d049bb133111ebL;
        return z ^ (z >>> 31);
    }

    static double unit(long seed, long a, long b, long salt) {
        return unitKeyed(seed, a, mix(b ^ mix(salt)));
    }

    /** {@link #unit} with its innermost mix (of b and the salt) done: what a round shares. */
    static double unitKeyed(long seed, long a, long bKey) {
        long h = mix(seed ^ mix(a ^ bKey));
        return (double) (h >>> 11) / (double) (1L << 53);
    }

    /** The true temperature in °C at lat/lon at UTC time ts (ms), without noise. */
    static double climateC(double lat, double lon, long ts) {
        return climateAt(28.0 - 0.45 * Math.abs(lat), lon / 15.0, utcHours(ts));
    }

    static double utcHours(long ts) {
        return Math.floorMod(ts, 86_400_000L) / 3_600_000.0;
    }

    /** {@link #climateC} from the sensor's base and offset (lon / 15) and the UTC hours. */
    static double climateAt(double base, double lonHours, double utcHours) {
        double local = hoursOfDay(utcHours + lonHours);
        double diurnal = 6.0 * Math.cos(2.0 * Math.PI * (local - 15.0) / 24.0);
        return base + diurnal;
    }

    /** Rust's {@code rem_euclid(24.0)}, to the bit; as Caudal's hours_of_day, no fmod for -24..48. */
    static double hoursOfDay(double h) {
        if (h >= 0.0 && h < 24.0) {
            return h;
        } else if (h >= 24.0 && h < 48.0) {
            return h - 24.0;
        } else if (h > -24.0 && h < 0.0) {
            return h + 24.0;
        }
        double r = h % 24.0;
        return r < 0.0 ? r + 24.0 : r;
    }

    /** A sensor's latitude. */
    double lat(long sensor) {
        return -60.0 + 130.0 * unit(seed, sensor, 0, 1);
    }

    /** A sensor's longitude. */
    double lon(long sensor) {
        return -180.0 + 360.0 * unit(seed, sensor, 0, 2);
    }

    /** The reading of {@code sensor} number {@code round} at time {@code ts}. */
    SensorReading reading(long sensor, long round, long ts) {
        return readingAt(sensor, lat(sensor), lon(sensor), round, ts);
    }

    /** {@link #reading} of a sensor whose position is known. */
    SensorReading readingAt(long sensor, double lat, double lon, long round, long ts) {
        return readingAt(sensor, lat, lon, 28.0 - 0.45 * Math.abs(lat), lon / 15.0, new Round(round, ts));
    }

    /** A round's share of the model, worked out once per round (as Caudal's model::Round). */
    static final class Round {
        final long ts;
        final double utcHours;
        final long faulty;
        final long faultyLow;
        final long noiseA;
        final long noiseB;

        Round(long round, long ts) {
            this.ts = ts;
            this.utcHours = utcHours(ts);
            this.faulty = mix(round ^ mix(3));
            this.faultyLow = mix(round ^ mix(4));
            this.noiseA = mix(round ^ mix(5));
            this.noiseB = mix(round ^ mix(6));
        }
    }

    /** {@link #reading} with the sensor's base and offset and the round worked out. */
    SensorReading readingAt(long sensor, double lat, double lon, double base, double lonHours, Round r) {
        boolean faulty = faultyFraction > 0.0 && unitKeyed(seed, sensor, r.faulty) < faultyFraction;
        double tempF;
        if (faulty) {
            // Impossible readings: below absolute zero or far above any weather on Earth.
            tempF = unitKeyed(seed, sensor, r.faultyLow) < 0.5 ? -500.0 : 400.0;
        } else {
            double noise = 1.5 * (unitKeyed(seed, sensor, r.noiseA) + unitKeyed(seed, sensor, r.noiseB) - 1.0);
            double c = climateAt(base, lonHours, r.utcHours) + noise;
            tempF = c * 9.0 / 5.0 + 32.0;
        }
        return new SensorReading(sensor, r.ts, lat, lon, tempF);
    }

    /** Sensors owned by split k. */
    long splitSensors(int k) {
        return Math.floorDiv(sensors - k + splits - 1, splits);
    }

    /** Records split k emits: its share of the first {@code records} readings, round-major. */
    long splitRecords(int k) {
        long fullRounds = records / sensors;
        long rem = records % sensors;
        long partial = rem > k ? Math.floorDiv(rem - k + splits - 1, splits) : 0;
        return fullRounds * splitSensors(k) + partial;
    }

    /**
     * A split's walk through its readings, as Caudal's SplitCursor: round and slot kept as
     * counters (no division per reading), the split's sensors' positions computed once, and
     * a round's share of the model once per round.
     */
    final class Cursor {
        private final int k;
        private final long sensorsInSplit;
        private final double[] lats;
        private final double[] lons;
        private final double[] bases;
        private final double[] lonHours;
        private long round;
        private Round at;
        private long slot;

        Cursor(int k, long next) {
            this.k = k;
            this.sensorsInSplit = splitSensors(k);
            int kept = (int) Math.min(sensorsInSplit, 1L << 20);
            lats = new double[kept];
            lons = new double[kept];
            bases = new double[kept];
            lonHours = new double[kept];
            for (int i = 0; i < kept; i++) {
                long sensor = k + (long) i * splits;
                lats[i] = lat(sensor);
                lons[i] = lon(sensor);
                bases[i] = 28.0 - 0.45 * Math.abs(lats[i]);
                lonHours[i] = lons[i] / 15.0;
            }
            round = next / sensorsInSplit;
            at = new Round(round, START_MS + round * INTERVAL_MS);
            slot = next % sensorsInSplit;
        }

        /** The reading at the cursor; the cursor moves on. */
        SensorReading next() {
            long sensor = k + slot * splits;
            int i = (int) slot;
            SensorReading r = slot < lats.length
                    ? readingAt(sensor, lats[i], lons[i], bases[i], lonHours[i], at)
                    : reading(sensor, round, at.ts);
            if (++slot == sensorsInSplit) {
                slot = 0;
                round++;
                at = new Round(round, START_MS + round * INTERVAL_MS);
            }
            return r;
        }
    }

    /** The n-th record of split k. */
    SensorReading record(int k, long n, long sensorsInSplit) {
        long round = n / sensorsInSplit;
        long sensor = k + (n % sensorsInSplit) * splits;
        long ts = START_MS + round * INTERVAL_MS;
        return reading(sensor, round, ts);
    }
}
