package dev.caudal.bench.flink;

import java.time.Duration;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.AggregateFunction;
import org.apache.flink.api.common.functions.FilterFunction;
import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.windowing.ProcessWindowFunction;
import org.apache.flink.streaming.api.windowing.assigners.TumblingEventTimeWindows;
import org.apache.flink.streaming.api.windowing.windows.TimeWindow;
import org.apache.flink.util.Collector;

/**
 * Caudal's {@code temperature} job (jobs/src/temperature.rs) in the DataStream API:
 * generator → °F→°C → filter −50 &lt; °C &lt; 60 → key by sensor → 1-minute tumbling
 * event-time windows (count, min, max, mean °C) → counting sink; the converted readings go
 * to a second counting sink.
 */
final class TemperaturePipeline {
    private TemperaturePipeline() {}

    /** Adds the pipeline to {@code env}. */
    static void build(StreamExecutionEnvironment env, SensorModel model) {
        windowsAndSinks(celsius(env, model));
    }

    /**
     * The generator's readings with the job's watermarks: bounded out-of-orderness of 1 s on
     * the reading's ts per source split, idleness 30 s (also the input of the count, timers
     * and alerts pipelines).
     */
    static DataStream<SensorReading> readings(StreamExecutionEnvironment env, SensorModel model) {
        WatermarkStrategy<SensorReading> watermarks = WatermarkStrategy
                .<SensorReading>forBoundedOutOfOrderness(Duration.ofSeconds(1))
                .withTimestampAssigner((r, previous) -> r.ts)
                .withIdleness(Duration.ofSeconds(30));
        return env.fromSource(new GeneratorSource(model), watermarks, "sensor-generator",
                TypeInformation.of(SensorReading.class));
    }

    /** The generator's readings converted to °C (before the anomaly filter). */
    static DataStream<ProcessedReading> celsius(StreamExecutionEnvironment env, SensorModel model) {
        return readings(env, model).map(new ToCelsius()).name("to-celsius");
    }

    /** anomaly filter → windows → sinks, and the filtered readings → their sink. */
    static void windowsAndSinks(DataStream<ProcessedReading> celsius) {
        DataStream<ProcessedReading> readings = celsius.filter(new IsPlausible()).name("anomaly-filter");
        DataStream<WindowStats> windows = readings
                .keyBy(new BySensor())
                .window(TumblingEventTimeWindows.of(Duration.ofMinutes(1)))
                .aggregate(new TempStats(), new ToWindowStats()).name("window-stats");
        readings.sinkTo(new CountingSink<>(CountingSink.READINGS)).name("readings-sink");
        windows.sinkTo(new CountingSink<>(CountingSink.WINDOWS)).name("windows-sink");
    }

    static final class ToCelsius implements MapFunction<SensorReading, ProcessedReading> {
        @Override
        public ProcessedReading map(SensorReading r) {
            return ProcessedReading.of(r);
        }
    }

    static final class IsPlausible implements FilterFunction<ProcessedReading> {
        @Override
        public boolean filter(ProcessedReading r) {
            return r.isPlausible();
        }
    }

    static final class BySensor implements KeySelector<ProcessedReading, Long> {
        @Override
        public Long getKey(ProcessedReading r) {
            return r.sensorId;
        }
    }

    /** count, min, max and sum of °C; the accumulator is updated in place. */
    static final class TempStats implements AggregateFunction<ProcessedReading, TempAcc, TempAcc> {
        @Override
        public TempAcc createAccumulator() {
            return new TempAcc();
        }

        @Override
        public TempAcc add(ProcessedReading r, TempAcc acc) {
            acc.count += 1;
            acc.min = Math.min(acc.min, r.tempC);
            acc.max = Math.max(acc.max, r.tempC);
            acc.sum += r.tempC;
            return acc;
        }

        @Override
        public TempAcc getResult(TempAcc acc) {
            return acc;
        }

        @Override
        public TempAcc merge(TempAcc a, TempAcc b) {
            a.count += b.count;
            a.min = Math.min(a.min, b.min);
            a.max = Math.max(a.max, b.max);
            a.sum += b.sum;
            return a;
        }
    }

    /** Adds the key and the window to the aggregate (runs once per fired window). */
    static final class ToWindowStats extends ProcessWindowFunction<TempAcc, WindowStats, Long, TimeWindow> {
        @Override
        public void process(Long sensor, Context ctx, Iterable<TempAcc> accs, Collector<WindowStats> out) {
            for (TempAcc acc : accs) {
                WindowStats w = new WindowStats();
                w.sensorId = sensor;
                w.windowStart = ctx.window().getStart();
                w.windowEnd = ctx.window().getEnd();
                w.count = acc.count;
                w.minC = acc.min;
                w.maxC = acc.max;
                w.meanC = acc.sum / Math.max(acc.count, 1);
                out.collect(w);
            }
        }
    }
}
