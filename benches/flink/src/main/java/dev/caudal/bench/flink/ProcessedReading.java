package dev.caudal.bench.flink;

/** A reading converted to °C (a Flink POJO), the job's first output. */
public class ProcessedReading {
    public long sensorId;
    public long ts;
    public double lat;
    public double lon;
    public double tempC;
    public double tempF;

    public ProcessedReading() {}

    /** °F → °C: (F − 32) × 5 / 9. */
    static ProcessedReading of(SensorReading r) {
        ProcessedReading p = new ProcessedReading();
        p.sensorId = r.sensorId;
        p.ts = r.ts;
        p.lat = r.lat;
        p.lon = r.lon;
        p.tempC = (r.tempF - 32.0) * 5.0 / 9.0;
        p.tempF = r.tempF;
        return p;
    }

    /** The anomaly filter: −50 < °C < 60. */
    boolean isPlausible() {
        return tempC > -50.0 && tempC < 60.0;
    }
}
