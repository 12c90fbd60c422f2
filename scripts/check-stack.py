#!/usr/bin/env python3
"""Checks the running test stack end to end (run it with the stack's venv python):

    scripts/services.sh start
    "$(scripts/services.sh env | sed -n 's/^export CAUDAL_PYTHON=//p')" scripts/check-stack.py
    # or: . ~/.cache/caudal/stack/stack.env && "$CAUDAL_PYTHON" scripts/check-stack.py

Addresses come from the CAUDAL_* environment variables, else from $CAUDAL_STACK_DIR/stack.env
(default ~/.cache/caudal/stack/stack.env). Services absent from both are reported as skipped;
--require-all turns a missing service into a failure.

Checks:
  kafka     a transactional producer commits 10 records and aborts 10; a read_committed consumer
            sees exactly the 10 committed (and a read_uncommitted one sees all 20)
  registry  (official Confluent client) register under <topic>-value, set BACKWARD, an added
            defaulted field is accepted, a new required field is rejected (409); Avro records
            through Kafka with AvroSerializer / AvroDeserializer
  postgres  connect with psql, a table round trip, prepared transactions enabled
  redis     redis-cli PING and a hash round trip
  s3        put/get an object with boto3, conditional put (If-None-Match) refused
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import uuid

RESULTS = []  # (name, status, detail)


def load_env():
    env = {}
    stack = os.environ.get("CAUDAL_STACK_DIR", os.path.expanduser("~/.cache/caudal/stack"))
    path = os.path.join(stack, "stack.env")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("export ") and "=" in line:
                    k, v = line[len("export "):].split("=", 1)
                    env[k] = v
    for k, v in os.environ.items():
        if k.startswith("CAUDAL_"):
            env[k] = v
    return env


def check(name):
    def deco(fn):
        def run(env, *a):
            t0 = time.monotonic()
            try:
                detail = fn(env, *a)
                RESULTS.append((name, "ok", f"{detail} ({time.monotonic() - t0:.1f}s)"))
            except Skip as e:
                RESULTS.append((name, "skipped", str(e)))
            except Exception as e:  # noqa: BLE001 - report every failure, keep checking
                RESULTS.append((name, "FAILED", f"{type(e).__name__}: {e}"))
                if os.environ.get("CHECK_STACK_DEBUG"):
                    traceback.print_exc()
            print(f"{RESULTS[-1][1]:>8}  {name}: {RESULTS[-1][2]}", flush=True)
        return run
    return deco


class Skip(Exception):
    pass


def need(env, key, require_all):
    if key not in env:
        if require_all:
            raise RuntimeError(f"{key} not set and not in stack.env: is the service started?")
        raise Skip(f"{key} not set (service not started)")
    return env[key]


# --------------------------------------------------------------------------------------------
@check("kafka transactions (read_committed)")
def check_kafka(env, require_all):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    brokers = need(env, "CAUDAL_KAFKA_BROKERS", require_all)
    topic = f"caudal-check-txn-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": brokers})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)

    p = Producer({
        "bootstrap.servers": brokers,
        "transactional.id": f"{topic}-producer",
        "transaction.timeout.ms": 60000,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
    })
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, key=f"k{i}", value=f"committed-{i}")
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, key=f"k{i}", value=f"aborted-{i}")
    p.flush(30)
    p.abort_transaction(30)

    def consume(isolation):
        c = Consumer({
            "bootstrap.servers": brokers,
            "group.id": f"{topic}-{isolation}",
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        })
        tp = TopicPartition(topic, 0)
        _, high = c.get_watermark_offsets(tp, timeout=10, cached=False)
        c.assign([TopicPartition(topic, 0, 0)])
        seen, deadline = [], time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                seen.append(m.value().decode())
            pos = c.position([tp])[0].offset
            if pos >= high:  # past the abort marker: nothing more to read
                break
        c.close()
        return seen, high

    committed, high = consume("read_committed")
    want = [f"committed-{i}" for i in range(10)]
    if committed != want:
        raise AssertionError(f"read_committed saw {len(committed)} records: {committed[:12]}")
    everything, _ = consume("read_uncommitted")
    if len(everything) != 20:
        raise AssertionError(f"read_uncommitted saw {len(everything)} records, expected 20")
    admin.delete_topics([topic])
    return f"10 committed seen, 10 aborted hidden (high watermark {high}) on {brokers}"


# --------------------------------------------------------------------------------------------
@check("schema registry (Confluent client, BACKWARD)")
def check_registry(env, require_all):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    from confluent_kafka.serialization import MessageField, SerializationContext

    url = need(env, "CAUDAL_SCHEMA_REGISTRY", require_all)
    topic = os.environ.get("CHECK_STACK_TOPIC") or f"caudal-check-sr-{uuid.uuid4().hex[:8]}"
    subject = f"{topic}-value"
    sr = SchemaRegistryClient({"url": url})

    def rec(*fields):
        return json.dumps({"type": "record", "name": "Reading", "namespace": "caudal.check",
                           "fields": [{"name": "sensor_id", "type": "long"}, *fields]})

    v1 = rec()
    v2 = rec({"name": "unit", "type": "string", "default": "F"})     # BACKWARD-compatible
    bad = rec({"name": "required", "type": "string"})                # new field, no default

    global_level = sr.get_compatibility()  # Confluent's default, which services.sh sets
    if global_level != "BACKWARD":
        raise AssertionError(f"global compatibility is {global_level}, expected BACKWARD")
    id1 = sr.register_schema(subject, Schema(v1, "AVRO"))
    sr.set_compatibility(subject, "BACKWARD")
    level = sr.get_compatibility(subject)
    if level != "BACKWARD":
        raise AssertionError(f"compatibility is {level}")
    if not sr.test_compatibility(subject, Schema(v2, "AVRO")):
        raise AssertionError("added defaulted field judged incompatible")
    if sr.test_compatibility(subject, Schema(bad, "AVRO")):
        raise AssertionError("added required field judged compatible")
    id2 = sr.register_schema(subject, Schema(v2, "AVRO"))
    try:
        sr.register_schema(subject, Schema(bad, "AVRO"))
        raise AssertionError("incompatible schema was accepted")
    except SchemaRegistryError as e:
        if e.http_status_code != 409:
            raise AssertionError(f"expected HTTP 409, got {e.http_status_code}: {e}") from e
    versions = sr.get_versions(subject)

    # Avro over Kafka through the official serializers, when a broker is there too.
    roundtrip = "no broker: serde not checked"
    brokers = env.get("CAUDAL_KAFKA_BROKERS")
    if brokers:
        ser = AvroSerializer(sr, v2)
        de = AvroDeserializer(sr)
        ctx = SerializationContext(topic, MessageField.VALUE)
        p = Producer({"bootstrap.servers": brokers})
        records = [{"sensor_id": i, "unit": "C"} for i in range(3)]
        for r in records:
            p.produce(topic, value=ser(r, ctx))
        p.flush(30)
        c = Consumer({"bootstrap.servers": brokers, "group.id": f"{topic}-check",
                      "auto.offset.reset": "earliest"})
        c.subscribe([topic])
        got, deadline = [], time.monotonic() + 30
        while len(got) < len(records) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                if m.value()[0] != 0 or int.from_bytes(m.value()[1:5], "big") != id2:
                    raise AssertionError(f"not Confluent wire format with id {id2}: {m.value()[:5]!r}")
                got.append(de(m.value(), ctx))
        c.close()
        if got != records:
            raise AssertionError(f"Avro round trip: {got}")
        roundtrip = "Avro serde round trip through Kafka ok"
        from confluent_kafka.admin import AdminClient
        AdminClient({"bootstrap.servers": brokers}).delete_topics([topic])
    if not os.environ.get("CHECK_STACK_TOPIC"):
        sr.delete_subject(subject)
        sr.delete_subject(subject, permanent=True)
    return f"{subject}: ids {id1},{id2}, versions {versions}, incompatible rejected (409); {roundtrip}"


# --------------------------------------------------------------------------------------------
@check("postgres")
def check_postgres(env, require_all):
    url = need(env, "CAUDAL_POSTGRES_URL", require_all)
    psql = shutil.which("psql")
    if not psql:
        raise RuntimeError("psql not found")
    sql = ("CREATE TABLE IF NOT EXISTS caudal_check (k int PRIMARY KEY, v text);"
           "INSERT INTO caudal_check VALUES (1, 'one') ON CONFLICT (k) DO UPDATE SET v = excluded.v;"
           "SELECT v FROM caudal_check WHERE k = 1;"
           "SHOW max_prepared_transactions;"
           "DROP TABLE caudal_check;")
    out = subprocess.run([psql, "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", url, "-c", sql],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    lines = [x for x in out.stdout.split() if x]
    if lines[:1] != ["one"] or int(lines[1]) <= 0:
        raise AssertionError(f"unexpected output {lines}")
    version = subprocess.run([psql, "-X", "-tA", url, "-c", "SHOW server_version"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    return f"{url}: upsert round trip ok, PostgreSQL {version}, max_prepared_transactions={lines[1]}"


# --------------------------------------------------------------------------------------------
@check("redis")
def check_redis(env, require_all):
    url = need(env, "CAUDAL_REDIS_URL", require_all)
    hostport = url.split("://", 1)[1].split("/", 1)[0]
    host, port = hostport.rsplit(":", 1)
    cli = shutil.which("redis-cli")
    if not cli:
        raise RuntimeError("redis-cli not found")

    def r(*args):
        out = subprocess.run([cli, "-h", host, "-p", port, *args],
                             capture_output=True, text=True, timeout=10)
        if out.returncode != 0:
            raise RuntimeError(out.stderr.strip() or out.stdout.strip())
        return out.stdout.strip()

    if r("PING") != "PONG":
        raise AssertionError("PING did not answer PONG")
    key = f"caudal-check:{uuid.uuid4().hex[:8]}"
    r("HSET", key, "celsius", "21.5", "ts", "1700000000000")
    got = r("HGET", key, "celsius")
    r("DEL", key)
    if got != "21.5":
        raise AssertionError(f"HGET returned {got!r}")
    return f"{url}: PONG, hash round trip ok"


# --------------------------------------------------------------------------------------------
@check("s3 (moto)")
def check_s3(env, require_all):
    import boto3
    from botocore.exceptions import ClientError

    endpoint = need(env, "CAUDAL_S3_ENDPOINT", require_all)
    bucket = env.get("CAUDAL_S3_BUCKET", "caudal")
    s3 = boto3.client("s3", endpoint_url=endpoint,
                      aws_access_key_id=env.get("CAUDAL_S3_ACCESS_KEY_ID", "test"),
                      aws_secret_access_key=env.get("CAUDAL_S3_SECRET_ACCESS_KEY", "test"),
                      region_name=env.get("CAUDAL_S3_REGION", "us-east-1"))
    key = f"caudal-check/{uuid.uuid4().hex}.bin"
    body = os.urandom(1024)
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    if s3.get_object(Bucket=bucket, Key=key)["Body"].read() != body:
        raise AssertionError("object read back differs")
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x", IfNoneMatch="*")
        raise AssertionError("conditional put (If-None-Match: *) over an existing object succeeded")
    except ClientError as e:
        if e.response["ResponseMetadata"]["HTTPStatusCode"] != 412:
            raise
    s3.delete_object(Bucket=bucket, Key=key)
    return f"{endpoint} bucket {bucket}: put/get ok, If-None-Match refused (412)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--require-all", action="store_true",
                    help="fail (not skip) when a service's address is missing")
    ap.add_argument("only", nargs="*", help="kafka registry postgres redis s3 (default: all)")
    args = ap.parse_args()
    env = load_env()
    checks = {"kafka": check_kafka, "registry": check_registry, "postgres": check_postgres,
              "redis": check_redis, "s3": check_s3}
    for name in args.only or checks:
        if name not in checks:
            ap.error(f"unknown check {name}")
        checks[name](env, args.require_all)
    passed = sum(1 for r in RESULTS if r[1] == "ok")
    failed = sum(1 for r in RESULTS if r[1] == "FAILED")
    skipped = sum(1 for r in RESULTS if r[1] == "skipped")
    print(f"check-stack: {passed} passed, {failed} failed, {skipped} skipped")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
