#!/usr/bin/env python3
"""The official Confluent client's half of the Avro interoperability test
(schemas/tests/confluent_interop.rs), run with the stack's venv python ($CAUDAL_PYTHON):

    "$CAUDAL_PYTHON" scripts/confluent-interop.py REGISTRY_URL TOPIC < request.json

The request is {"messages": [hex, ...], "records": [{...}, ...]}:
  messages  Confluent-framed Avro written by Caudal; decoded here with AvroDeserializer (the
            writer schema fetched from the registry by the id in each message)
  records   records to encode here with AvroSerializer, with the latest schema registered
            under TOPIC-value (not registering anything), for Caudal to decode
The answer on stdout is {"decoded": [{...}, ...], "encoded": [hex, ...]}. Timestamps
(timestamp-millis, which fastavro reads as datetimes) are answered as epoch milliseconds.
"""
import datetime
import json
import sys

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def plain(value):
    if isinstance(value, datetime.datetime):
        return (value - EPOCH) // datetime.timedelta(milliseconds=1)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def main():
    url, topic = sys.argv[1], sys.argv[2]
    request = json.load(sys.stdin)
    sr = SchemaRegistryClient({"url": url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    deserializer = AvroDeserializer(sr)
    decoded = [plain(deserializer(bytes.fromhex(m), ctx)) for m in request["messages"]]
    latest = sr.get_latest_version(f"{topic}-value")
    serializer = AvroSerializer(
        sr, latest.schema.schema_str, conf={"auto.register.schemas": False, "use.latest.version": True}
    )
    encoded = [serializer(r, ctx).hex() for r in request["records"]]
    json.dump({"decoded": decoded, "encoded": encoded}, sys.stdout)


if __name__ == "__main__":
    main()
