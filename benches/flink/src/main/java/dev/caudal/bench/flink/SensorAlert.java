package dev.caudal.bench.flink;

/**
 * A sensor went silent or recovered (a Flink POJO), the alerts pipeline's third output, as
 * Caudal's {@code SensorAlert} (schemas/src/records.rs).
 */
public class SensorAlert {
    /** SILENT: no reading for the silence; RECOVERED: the first reading after one. */
    public enum Kind { SILENT, RECOVERED }

    public long sensorId;
    public Kind kind;
    /** When the sensor went silent (last reading + silence) or recovered (that reading's ts). */
    public long ts;
    /** The sensor's latest reading before the alert. */
    public long lastSeen;

    public SensorAlert() {}

    public SensorAlert(long sensorId, Kind kind, long ts, long lastSeen) {
        this.sensorId = sensorId;
        this.kind = kind;
        this.ts = ts;
        this.lastSeen = lastSeen;
    }
}
