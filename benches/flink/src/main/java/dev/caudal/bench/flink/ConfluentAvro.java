package dev.caudal.bench.flink;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.util.HashMap;
import java.util.Map;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;

/**
 * Avro in the Confluent wire format (magic byte 0, the writer schema's registry id as 4
 * big-endian bytes, the Avro binary datum), as Caudal's schemas crate writes and reads it
 * (schemas/src/wire.rs), for Caudal's SensorReading (read) and ProcessedReading (written).
 *
 * <p>Two codecs: {@code specific} reads and writes the fields of the fixed schemas in order
 * with Avro's BinaryDecoder/BinaryEncoder (what Caudal's generated codec does when the
 * writer schema is its own), {@code generic} goes through GenericDatumReader (resolving the
 * writer schema into the reader's) and GenericDatumWriter, as Flink's Avro formats do.
 */
final class ConfluentAvro {
    private ConfluentAvro() {}

    /** schemas/avro/sensor_reading.avsc, verbatim (registered as such by Caudal). */
    static final String SENSOR_READING_AVSC = """
            {
              "type": "record",
              "name": "SensorReading",
              "namespace": "io.caudal",
              "doc": "A raw temperature reading in degrees Fahrenheit, as produced by a sensor.",
              "fields": [
                {"name": "sensor_id", "type": "long", "doc": "Sensor identifier; the Kafka record key."},
                {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}, "doc": "Event time, milliseconds since the Unix epoch (UTC)."},
                {"name": "lat", "type": "double", "doc": "Latitude in degrees."},
                {"name": "lon", "type": "double", "doc": "Longitude in degrees."},
                {"name": "temp_f", "type": "double", "doc": "Temperature in degrees Fahrenheit."}
              ]
            }
            """;

    /** schemas/avro/processed_reading.avsc, verbatim. */
    static final String PROCESSED_READING_AVSC = """
            {
              "type": "record",
              "name": "ProcessedReading",
              "namespace": "io.caudal",
              "doc": "A reading converted to degrees Celsius, the Fahrenheit value kept.",
              "fields": [
                {"name": "sensor_id", "type": "long", "doc": "Sensor identifier; the Kafka record key."},
                {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}, "doc": "Event time, milliseconds since the Unix epoch (UTC)."},
                {"name": "lat", "type": "double", "doc": "Latitude in degrees."},
                {"name": "lon", "type": "double", "doc": "Longitude in degrees."},
                {"name": "temp_c", "type": "double", "doc": "Temperature in degrees Celsius."},
                {"name": "temp_f", "type": "double", "doc": "Temperature in degrees Fahrenheit, as read."}
              ]
            }
            """;

    static final Schema SENSOR_READING = new Schema.Parser().parse(SENSOR_READING_AVSC);
    static final Schema PROCESSED_READING = new Schema.Parser().parse(PROCESSED_READING_AVSC);
    private static final long SENSOR_READING_FINGERPRINT = SchemaNormalization.parsingFingerprint64(SENSOR_READING);

    static final byte MAGIC = 0;
    static final int HEADER_LEN = 5;

    /** "specific" or "generic" (see the class comment). */
    static boolean isGeneric(String codec) {
        return switch (codec) {
            case "specific" -> false;
            case "generic" -> true;
            default -> throw new IllegalArgumentException("--avro must be specific or generic, got " + codec);
        };
    }

    /** The Kafka key of a record keyed by sensor id: the id as UTF-8 decimal text, like
     *  Caudal's {@code AvroSerializer::keyed(|r| r.sensor_id)}. */
    static byte[] sensorKey(long sensorId) {
        return Long.toString(sensorId).getBytes(java.nio.charset.StandardCharsets.US_ASCII);
    }

    /**
     * Reads framed SensorReading values. The writer schema of each id is fetched from the
     * registry once; with the specific codec it must be SensorReading's own (same parsing
     * canonical form), with the generic codec it is resolved into SensorReading.
     * Not thread-safe: one per subtask.
     */
    static final class ReadingDecoder {
        private final SchemaRegistry registry;
        private final boolean generic;
        private final Map<Integer, GenericDatumReader<GenericRecord>> readers = new HashMap<>();
        private int knownId = -1;
        private BinaryDecoder decoder;
        private GenericRecord reuse;

        ReadingDecoder(SchemaRegistry registry, boolean generic) {
            this.registry = registry;
            this.generic = generic;
        }

        SensorReading decode(byte[] msg) throws IOException {
            if (msg == null || msg.length < HEADER_LEN) {
                throw new IOException("not the Confluent wire format: "
                        + (msg == null ? "no value" : msg.length + " bytes"));
            }
            if (msg[0] != MAGIC) {
                throw new IOException("not the Confluent wire format: magic byte " + msg[0]);
            }
            int id = ((msg[1] & 0xff) << 24) | ((msg[2] & 0xff) << 16) | ((msg[3] & 0xff) << 8) | (msg[4] & 0xff);
            decoder = DecoderFactory.get().binaryDecoder(msg, HEADER_LEN, msg.length - HEADER_LEN, decoder);
            SensorReading r;
            if (generic) {
                GenericDatumReader<GenericRecord> reader = readers.get(id);
                if (reader == null) {
                    reader = new GenericDatumReader<>(writerSchema(id), SENSOR_READING);
                    readers.put(id, reader);
                }
                GenericRecord g = reader.read(reuse, decoder);
                reuse = g;
                r = new SensorReading((Long) g.get(0), (Long) g.get(1), (Double) g.get(2), (Double) g.get(3),
                        (Double) g.get(4));
            } else {
                if (id != knownId) {
                    Schema writer = writerSchema(id);
                    if (SchemaNormalization.parsingFingerprint64(writer) != SENSOR_READING_FINGERPRINT) {
                        throw new IOException("schema id " + id + " is not SensorReading's schema (use --avro generic"
                                + " to resolve other writer schemas): " + writer);
                    }
                    knownId = id;
                }
                r = new SensorReading(decoder.readLong(), decoder.readLong(), decoder.readDouble(),
                        decoder.readDouble(), decoder.readDouble());
            }
            if (!decoder.isEnd()) {
                throw new IOException("schema id " + id + ": bytes left after the SensorReading");
            }
            return r;
        }

        private Schema writerSchema(int id) throws IOException {
            return new Schema.Parser().parse(registry.schemaById(id));
        }
    }

    /** Writes framed ProcessedReading values with a registered schema id. Not thread-safe. */
    static final class ProcessedEncoder {
        private final byte[] header;
        private final boolean generic;
        private final ByteArrayOutputStream out = new ByteArrayOutputStream(64);
        private final GenericDatumWriter<GenericRecord> writer;
        private final GenericData.Record record;
        private BinaryEncoder encoder;

        ProcessedEncoder(int schemaId, boolean generic) {
            this.header = new byte[] {MAGIC, (byte) (schemaId >>> 24), (byte) (schemaId >>> 16),
                (byte) (schemaId >>> 8), (byte) schemaId};
            this.generic = generic;
            this.writer = generic ? new GenericDatumWriter<>(PROCESSED_READING) : null;
            this.record = generic ? new GenericData.Record(PROCESSED_READING) : null;
        }

        byte[] encode(ProcessedReading p) throws IOException {
            out.reset();
            out.write(header);
            encoder = EncoderFactory.get().directBinaryEncoder(out, encoder);
            if (generic) {
                record.put(0, p.sensorId);
                record.put(1, p.ts);
                record.put(2, p.lat);
                record.put(3, p.lon);
                record.put(4, p.tempC);
                record.put(5, p.tempF);
                writer.write(record, encoder);
            } else {
                encoder.writeLong(p.sensorId);
                encoder.writeLong(p.ts);
                encoder.writeDouble(p.lat);
                encoder.writeDouble(p.lon);
                encoder.writeDouble(p.tempC);
                encoder.writeDouble(p.tempF);
            }
            encoder.flush();
            return out.toByteArray();
        }
    }
}
