package dev.caudal.bench.flink;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;

/**
 * The {@code count} pipeline of Caudal's throughput runner (benches/src/bin/throughput.rs):
 * generator → key by sensor → a keyed process function keeping a running count per sensor
 * in a {@code ValueState<Long>}, read, incremented and written back per record; it emits
 * nothing → counting sink. Measures per-record keyed-state read-modify-write.
 */
final class CountPipeline {
    private CountPipeline() {}

    /** Adds the pipeline to {@code env}. */
    static void build(StreamExecutionEnvironment env, SensorModel model) {
        TemperaturePipeline.readings(env, model)
                .keyBy(new BySensor())
                .process(new Count()).name("count")
                .sinkTo(new CountingSink<>(CountingSink.OUTPUTS)).name("count-sink");
    }

    /** The sensor id of a raw reading (the key of the count and timers pipelines). */
    static final class BySensor implements KeySelector<SensorReading, Long> {
        @Override
        public Long getKey(SensorReading r) {
            return r.sensorId;
        }
    }

    /** A running count per key in ValueState "count"; emits nothing. */
    static final class Count extends KeyedProcessFunction<Long, SensorReading, Long> {
        private transient ValueState<Long> count;

        @Override
        public void open(OpenContext ctx) {
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.LONG));
        }

        @Override
        public void processElement(SensorReading r, Context ctx, Collector<Long> out) throws Exception {
            Long n = count.value();
            count.update(n == null ? 1L : n + 1);
        }
    }
}
