package dev.caudal.bench.flink;

/** The window accumulator: count, min, max and sum of °C (a Flink POJO). */
public class TempAcc {
    public long count;
    public double min = Double.POSITIVE_INFINITY;
    public double max = Double.NEGATIVE_INFINITY;
    public double sum;

    public TempAcc() {}
}
