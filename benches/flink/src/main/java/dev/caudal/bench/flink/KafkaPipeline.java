package dev.caudal.bench.flink;

import java.io.IOException;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.RichFilterFunction;
import org.apache.flink.api.common.functions.RichMapFunction;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.api.common.state.CheckpointListener;
import org.apache.flink.api.common.typeinfo.PrimitiveArrayTypeInfo;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.util.Collector;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * Caudal's benches/src/bin/kafka_pipeline.rs in the DataStream API: Kafka (bounded: from the
 * earliest offsets to the end offsets at start, read_committed) → Confluent-Avro decode of
 * SensorReading → °F→°C → filter −50 &lt; °C &lt; 60 → ProcessedReading as Confluent Avro,
 * keyed by sensor id → Kafka, exactly-once (a transaction per checkpoint) or at-least-once.
 * One operator chain per subtask (source, decode, map, filter, sink), no shuffle.
 */
final class KafkaPipeline {
    /** Records decoded, records the filter kept (added by each subtask when it closes). */
    static final AtomicLong READ = new AtomicLong();
    static final AtomicLong KEPT = new AtomicLong();
    /** Highest checkpoint id a subtask saw completed. */
    static final AtomicLong CHECKPOINTS = new AtomicLong();

    private KafkaPipeline() {}

    /** Where the job reads and writes. */
    record Topics(String brokers, String input, String output, int outputSchemaId) {}

    /** Adds the pipeline to {@code env}. */
    static void build(StreamExecutionEnvironment env, Topics t, SchemaRegistry registry, boolean generic,
            DeliveryGuarantee delivery) {
        KafkaSource<byte[]> source = KafkaSource.<byte[]>builder()
                .setBootstrapServers(t.brokers())
                .setTopics(t.input())
                .setGroupId(t.output())
                .setStartingOffsets(OffsetsInitializer.earliest())
                .setBounded(OffsetsInitializer.latest())
                .setDeserializer(new RawValues())
                .setProperty("isolation.level", "read_committed")
                .setProperty("client.id.prefix", t.output() + "-source")
                .build();
        // The producer settings of Caudal's Kafka sink (operators/src/kafka/sink/producer.rs):
        // acks=all, lz4, linger 5 ms, a 15-minute transaction timeout; idempotent in both modes
        // (the Java producer's default with acks=all).
        KafkaSink<ProcessedReading> sink = KafkaSink.<ProcessedReading>builder()
                .setBootstrapServers(t.brokers())
                .setRecordSerializer(new ProcessedSerializer(t.output(), t.outputSchemaId(), generic))
                .setDeliveryGuarantee(delivery)
                .setTransactionalIdPrefix(t.output())
                .setProperty("transaction.timeout.ms", "900000")
                .setProperty("acks", "all")
                .setProperty("compression.type", "lz4")
                .setProperty("linger.ms", "5")
                .build();
        env.fromSource(source, WatermarkStrategy.noWatermarks(), "kafka")
                .map(new Decode(registry, generic)).name("avro-decode")
                .map(new TemperaturePipeline.ToCelsius()).name("to-celsius")
                .filter(new CountedPlausible()).name("anomaly-filter")
                .sinkTo(sink).name("kafka-out");
    }

    /** The record value as it is (decoding is the next operator, chained). */
    static final class RawValues implements KafkaRecordDeserializationSchema<byte[]> {
        private static final long serialVersionUID = 1L;

        @Override
        public void deserialize(ConsumerRecord<byte[], byte[]> record, Collector<byte[]> out) {
            out.collect(record.value());
        }

        @Override
        public TypeInformation<byte[]> getProducedType() {
            return PrimitiveArrayTypeInfo.BYTE_PRIMITIVE_ARRAY_TYPE_INFO;
        }
    }

    /** Confluent Avro → SensorReading; counts the records and the completed checkpoints. */
    static final class Decode extends RichMapFunction<byte[], SensorReading> implements CheckpointListener {
        private static final long serialVersionUID = 1L;
        private final SchemaRegistry registry;
        private final boolean generic;
        private transient ConfluentAvro.ReadingDecoder decoder;
        private transient long count;

        Decode(SchemaRegistry registry, boolean generic) {
            this.registry = registry;
            this.generic = generic;
        }

        @Override
        public void open(OpenContext ctx) {
            decoder = new ConfluentAvro.ReadingDecoder(registry, generic);
        }

        @Override
        public SensorReading map(byte[] value) throws IOException {
            count++;
            return decoder.decode(value);
        }

        @Override
        public void notifyCheckpointComplete(long checkpointId) {
            CHECKPOINTS.accumulateAndGet(checkpointId, Math::max);
        }

        @Override
        public void close() {
            READ.addAndGet(count);
        }
    }

    /** The anomaly filter (−50 &lt; °C &lt; 60), counting what it keeps. */
    static final class CountedPlausible extends RichFilterFunction<ProcessedReading> {
        private static final long serialVersionUID = 1L;
        private transient long kept;

        @Override
        public boolean filter(ProcessedReading r) {
            if (r.isPlausible()) {
                kept++;
                return true;
            }
            return false;
        }

        @Override
        public void close() {
            KEPT.addAndGet(kept);
        }
    }

    /**
     * ProcessedReading → a Kafka record: key = sensor id as decimal text, value = Confluent
     * Avro with the schema registered for {@code <topic>-value}; no timestamp (the producer
     * stamps the time of sending, as Caudal's sink does by default); the producer's
     * partitioner picks the partition from the key.
     */
    static final class ProcessedSerializer implements KafkaRecordSerializationSchema<ProcessedReading> {
        private static final long serialVersionUID = 1L;
        private final String topic;
        private final int schemaId;
        private final boolean generic;
        private transient ConfluentAvro.ProcessedEncoder encoder;

        ProcessedSerializer(String topic, int schemaId, boolean generic) {
            this.topic = topic;
            this.schemaId = schemaId;
            this.generic = generic;
        }

        @Override
        public void open(SerializationSchema.InitializationContext context, KafkaSinkContext sinkContext) {
            encoder = new ConfluentAvro.ProcessedEncoder(schemaId, generic);
        }

        @Override
        public ProducerRecord<byte[], byte[]> serialize(ProcessedReading r, KafkaSinkContext context, Long timestamp) {
            if (encoder == null) {
                encoder = new ConfluentAvro.ProcessedEncoder(schemaId, generic);
            }
            try {
                return new ProducerRecord<>(topic, null, null, ConfluentAvro.sensorKey(r.sensorId), encoder.encode(r));
            } catch (IOException e) {
                throw new IllegalStateException("encoding a ProcessedReading", e);
            }
        }
    }
}
