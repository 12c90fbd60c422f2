package dev.caudal.bench.flink;

/** A raw reading in °F (a Flink POJO: public fields, a no-argument constructor). */
public class SensorReading {
    public long sensorId;
    public long ts;
    public double lat;
    public double lon;
    public double tempF;

    public SensorReading() {}

    public SensorReading(long sensorId, long ts, double lat, double lon, double tempF) {
        this.sensorId = sensorId;
        this.ts = ts;
        this.lat = lat;
        this.lon = lon;
        this.tempF = tempF;
    }
}
