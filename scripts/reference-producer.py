"""The reference design's producer of user interactions, for jobs/tests/user_interactions.rs:
confluent-kafka's SerializingProducer with its AvroSerializer and the design's own schema
(`com.mycompany.events.UserInteraction`, event time in `timestamp_ms`), idempotent, acks=all,
snappy — what a user's existing producers send, not Caudal's own producer.

    "$CAUDAL_PYTHON" scripts/reference-producer.py BROKERS REGISTRY_URL TOPIC COUNT SEED
"""
import random
import sys

from confluent_kafka import SerializingProducer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import StringSerializer

SCHEMA = """{"type": "record", "name": "UserInteraction", "namespace": "com.mycompany.events",
 "fields": [
  {"name": "user_id", "type": "string"},
  {"name": "event_type", "type": {"type": "enum", "name": "EventType", "symbols": ["CLICK", "VIEW", "PURCHASE"]}},
  {"name": "timestamp_ms", "type": "long"},
  {"name": "page_url", "type": ["null", "string"], "default": null}]}"""


def main():
    brokers, registry, topic, count, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    client = SchemaRegistryClient({"url": registry})
    producer = SerializingProducer({
        "bootstrap.servers": brokers,
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "snappy",
        "key.serializer": StringSerializer("utf_8"),
        "value.serializer": AvroSerializer(client, SCHEMA, lambda value, ctx: value),
    })
    rnd = random.Random(seed)
    start = 1767225600000  # 2026-01-01T00:00Z
    for i in range(count):
        user = "user-%d" % rnd.randrange(12)
        value = {
            "user_id": user,
            "event_type": rnd.choice(["CLICK", "VIEW", "PURCHASE"]),
            "timestamp_ms": start + i * 250,
            "page_url": rnd.choice([None, "/", "/cart"]),
        }
        producer.produce(topic=topic, key=user, value=value)
        if i % 500 == 0:
            producer.poll(0)
    if producer.flush(30) != 0:
        sys.exit("not every record was delivered")


if __name__ == "__main__":
    main()
