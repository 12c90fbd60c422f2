package dev.caudal.bench.flink;

import java.io.ByteArrayOutputStream;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.EncoderFactory;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The Kafka bench's test mode ({@code --produce N}): a small input topic without Caudal's
 * binaries, like {@code temperature produce --sensors S --rate 0 --records N --seed 1
 * --event-interval-ms 100}: the generator's readings (SensorModel, one shard, round-major,
 * 1 % faulty), Confluent Avro with SensorReading's schema registered for
 * {@code <topic>-value}, keyed by sensor id as decimal text, idempotent producer with
 * acks=all and lz4.
 */
final class ReadingsProducer {
    private ReadingsProducer() {}

    static Admin admin(String brokers) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
        return Admin.create(p);
    }

    static void createTopic(String brokers, String topic, int partitions) throws Exception {
        try (Admin admin = admin(brokers)) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
        }
    }

    static void produce(String brokers, SchemaRegistry registry, String topic, int partitions, long records,
            long sensors, long seed, long intervalMs) throws Exception {
        long t0 = System.nanoTime();
        createTopic(brokers, topic, partitions);
        int id = registry.register(topic + "-value", ConfluentAvro.SENSOR_READING_AVSC);
        byte[] header = {ConfluentAvro.MAGIC, (byte) (id >>> 24), (byte) (id >>> 16), (byte) (id >>> 8), (byte) id};
        SensorModel model = new SensorModel(seed, sensors, records, 0.01, 1);
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "lz4");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        AtomicReference<Exception> failed = new AtomicReference<>();
        ByteArrayOutputStream out = new ByteArrayOutputStream(64);
        BinaryEncoder enc = null;
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            for (long n = 0; n < records && failed.get() == null; n++) {
                long round = n / sensors;
                long sensor = n % sensors;
                SensorReading r = model.reading(sensor, round, SensorModel.START_MS + round * intervalMs);
                out.reset();
                out.write(header);
                enc = EncoderFactory.get().directBinaryEncoder(out, enc);
                enc.writeLong(r.sensorId);
                enc.writeLong(r.ts);
                enc.writeDouble(r.lat);
                enc.writeDouble(r.lon);
                enc.writeDouble(r.tempF);
                enc.flush();
                producer.send(new ProducerRecord<>(topic, ConfluentAvro.sensorKey(r.sensorId), out.toByteArray()),
                        (meta, e) -> {
                            if (e != null) {
                                failed.compareAndSet(null, e);
                            }
                        });
            }
            producer.flush();
        }
        if (failed.get() != null) {
            throw new IllegalStateException("producing into " + topic, failed.get());
        }
        System.out.printf("# produced %d readings (%d sensors, seed %d) into %s (%d partitions, schema id %d) in %.1f s%n",
                records, sensors, seed, topic, partitions, id, (System.nanoTime() - t0) / 1e9);
    }
}
