package dev.caudal.bench.flink;

import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

/**
 * The {@code alerts} pipeline of Caudal's throughput runner: Caudal's temperature job with
 * silent-sensor alerts (jobs/src/temperature.rs with a silence of 30 s). The temperature
 * pipeline as {@link TemperaturePipeline} builds it, plus, on the °C stream before the
 * anomaly filter (every reading shows the sensor is alive, a faulty one too), key by sensor
 * → {@link SilenceDetector} → a third counting sink. With no outages in the generated data
 * hardly any alert is emitted: what it measures is the per-record state and timer work.
 */
final class AlertsPipeline {
    /** Event time without a reading before a sensor counts as silent. */
    static final long SILENCE_MS = 30_000;

    private AlertsPipeline() {}

    /** Adds the pipeline to {@code env}. */
    static void build(StreamExecutionEnvironment env, SensorModel model) {
        DataStream<ProcessedReading> celsius = TemperaturePipeline.celsius(env, model);
        celsius.keyBy(new TemperaturePipeline.BySensor())
                .process(new SilenceDetector(SILENCE_MS)).name("silence-alerts")
                .sinkTo(new CountingSink<>(CountingSink.OUTPUTS)).name("alerts-sink");
        TemperaturePipeline.windowsAndSinks(celsius);
    }
}
