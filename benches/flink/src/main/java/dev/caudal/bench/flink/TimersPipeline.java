package dev.caudal.bench.flink;

import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;

/**
 * The {@code timers} pipeline of Caudal's throughput runner (benches/src/bin/throughput.rs):
 * generator → key by sensor → a keyed process function registering an event-time timer at
 * the reading's ts + 60 s per record; each firing emits one 1L → counting sink. Every timer
 * fires (the final watermark of the bounded input fires the rest), so the sink counts one
 * output per input record. Readings of a sensor are 1 s apart, so no two of its timers
 * coincide.
 */
final class TimersPipeline {
    /** Event time from a reading to its timer. */
    static final long DELAY_MS = 60_000;

    private TimersPipeline() {}

    /** Adds the pipeline to {@code env}. */
    static void build(StreamExecutionEnvironment env, SensorModel model) {
        TemperaturePipeline.readings(env, model)
                .keyBy(new CountPipeline.BySensor())
                .process(new TimerPerRecord()).name("timer-per-record")
                .sinkTo(new CountingSink<>(CountingSink.OUTPUTS)).name("timers-sink");
    }

    /** Registers a timer at ts + 60 s per record; emits 1 per firing. */
    static final class TimerPerRecord extends KeyedProcessFunction<Long, SensorReading, Long> {
        @Override
        public void processElement(SensorReading r, Context ctx, Collector<Long> out) {
            ctx.timerService().registerEventTimeTimer(r.ts + DELAY_MS);
        }

        @Override
        public void onTimer(long ts, OnTimerContext ctx, Collector<Long> out) {
            out.collect(1L);
        }
    }
}
