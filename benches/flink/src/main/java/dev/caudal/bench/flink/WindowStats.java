package dev.caudal.bench.flink;

/** Count, min, max and mean °C of one sensor in one window (a Flink POJO), the second output. */
public class WindowStats {
    public long sensorId;
    public long windowStart;
    public long windowEnd;
    public long count;
    public double minC;
    public double maxC;
    public double meanC;

    public WindowStats() {}
}
