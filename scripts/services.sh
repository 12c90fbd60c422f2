#!/usr/bin/env bash
# Caudal's test stack on loopback: Apache Kafka (KRaft, one node), a Confluent-compatible schema
# registry (Apicurio), PostgreSQL, Redis and an S3 server (moto).
# Kafka also listens on SASL_SSL (SCRAM-SHA-512 user `caudal`, a certificate of a CA the stack
# makes itself in $STACK/tls), and the registry is also served over HTTPS with basic auth
# (registry-tls); `env` exports CAUDAL_KAFKA_SECURE_BROKERS and CAUDAL_KAFKA_SECURE_CONFIG, a
# client.properties with everything a client of both needs.
#
#   scripts/services.sh start  [SERVICE...]   start (idempotent), wait until ready, print addresses
#   scripts/services.sh stop   [SERVICE...]   stop what this script started; leaves no process
#   scripts/services.sh status [SERVICE...]   up/down and address of each (exit 3 if one is down)
#   scripts/services.sh env                   print the exports of the running stack (stack.env)
#   scripts/services.sh restart [SERVICE...]  stop then start
#   scripts/services.sh purge  [SERVICE...]   stop, then delete their data (PostgreSQL's too)
#
# SERVICE: kafka registry registry-tls postgres redis s3 (default: all), or kafka1 kafka2 kafka3 (a 3-broker
# cluster), trino (Trino with an Iceberg catalog on the stack's PostgreSQL and S3) and
# iceberg-rest (an Iceberg REST catalog on the same), only when named. See scripts/README.md.
#
# PostgreSQL and Redis keep nothing durable by default (fsync off, no Redis persistence): fast
# for the suite. CAUDAL_DURABLE=1 makes a stack whose data survives a restart as a production
# server's does (PostgreSQL fsync and synchronous commit on, Redis appending every write to its
# log and syncing it): what the tests that restart a server use.
set -euo pipefail

SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${CAUDAL_CACHE:-$HOME/.cache/caudal}
STACK=${CAUDAL_STACK_DIR:-$HOME/.cache/caudal/stack}
VENV=${CAUDAL_VENV:-$CACHE/venv}
HOST=127.0.0.1
TIMEOUT=${CAUDAL_STACK_TIMEOUT:-180}          # seconds per service to become ready

KAFKA_PORT=${CAUDAL_KAFKA_PORT:-19092}
KAFKA_CONTROLLER_PORT=${CAUDAL_KAFKA_CONTROLLER_PORT:-19093}
KAFKA_SECURE_PORT=${CAUDAL_KAFKA_SECURE_PORT:-19094}  # SASL_SSL (SCRAM-SHA-512, the stack's CA)
KAFKA_USER=caudal
REGISTRY_PORT=${CAUDAL_REGISTRY_PORT:-18081}
REGISTRY_TLS_PORT=${CAUDAL_REGISTRY_TLS_PORT:-18443}  # HTTPS + basic auth in front of the registry
REGISTRY_USER=caudal
POSTGRES_PORT=${CAUDAL_POSTGRES_PORT:-15432}
REDIS_PORT=${CAUDAL_REDIS_PORT:-16379}
REDIS_TLS_PORT=${CAUDAL_REDIS_TLS_PORT:-16380}  # TLS (the stack's CA), ACL user caudal_tls with a password
REDIS_TLS_USER=caudal_tls
DURABLE=${CAUDAL_DURABLE:-0}
S3_PORT=${CAUDAL_S3_PORT:-19000}
S3_BUCKET=${CAUDAL_S3_BUCKET:-caudal}

KAFKA_VERSION=${CAUDAL_KAFKA_VERSION:-4.1.1}
KAFKA_HEAP=${CAUDAL_KAFKA_HEAP:-512m}
APICURIO_VERSION=2.4.2.Final                  # must match scripts/registry/pom.xml
REGISTRY_DB_KIND=postgresql                   # Apicurio's storage (see registry_launch)
REGISTRY_DATABASE=registry                    # its database in the stack's PostgreSQL
KAFKA_HOME=$CACHE/kafka-$KAFKA_VERSION
REGISTRY_HOME=$CACHE/apicurio-registry-$APICURIO_VERSION
M2=$CACHE/m2
MVN_SETTINGS=$SCRIPTS_DIR/maven-settings.xml

ALL_SERVICES=(postgres redis s3 kafka registry registry-tls)
# Started only when named: a 3-broker KRaft cluster (combined broker + controller nodes,
# replication factor 3, min.insync.replicas 2, the transaction state log replicated) for the
# broker failover tests. Ports: CAUDAL_KAFKA_NODE_PORTS / CAUDAL_KAFKA_NODE_CONTROLLER_PORTS
# (three each, comma-separated).
NODE_SERVICES=(kafka1 kafka2 kafka3)
IFS=, read -r -a KAFKA_NODE_PORTS <<<"${CAUDAL_KAFKA_NODE_PORTS:-19192,19202,19212}"
IFS=, read -r -a KAFKA_NODE_CONTROLLER_PORTS <<<"${CAUDAL_KAFKA_NODE_CONTROLLER_PORTS:-19193,19203,19213}"
KAFKA_NODE_HEAP=${CAUDAL_KAFKA_NODE_HEAP:-384m}
# Started only when named: Trino (from Maven Central; it needs Java 24+) with one catalog,
# `lake`: Iceberg tables of the JDBC catalog `caudal` in the stack's PostgreSQL, files on its
# S3 server. Needs postgres and s3 running.
EXTRA_SERVICES=(trino iceberg-rest)
TRINO_VERSION=${CAUDAL_TRINO_VERSION:-476}
TRINO_PORT=${CAUDAL_TRINO_PORT:-18090}
TRINO_HEAP=${CAUDAL_TRINO_HEAP:-1g}
TRINO_HOME=$CACHE/trino-server-$TRINO_VERSION
# Started only when named: an Iceberg REST catalog (Apache Iceberg's REST servlet, assembled by
# scripts/iceberg-rest/pom.xml) over the JDBC catalog `caudal_rest` in the database
# `iceberg_rest` of the stack's PostgreSQL (fresh at each start), files on its S3 server.
# Needs postgres and s3 running.
ICEBERG_REST_VERSION=1.10.1                    # must match scripts/iceberg-rest/pom.xml
ICEBERG_REST_PORT=${CAUDAL_ICEBERG_REST_PORT:-18181}
ICEBERG_REST_DATABASE=iceberg_rest
ICEBERG_REST_CATALOG=caudal_rest
ICEBERG_REST_HOME=$CACHE/iceberg-rest-$ICEBERG_REST_VERSION

# ---------------------------------------------------------------------------------------------
say()  { printf '%s\n' "$*"; }
info() { printf 'services: %s\n' "$*"; }
warn() { printf 'services: %s\n' "$*" >&2; }
die()  { printf 'services: ERROR: %s\n' "$*" >&2; exit 1; }

read_pid() { [[ -f $1 ]] && head -n1 "$1" | tr -dc '0-9' || true; }
alive()    { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }
cmdline()  { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null || true; }
port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }
port_owner() { # pid listening on the port, if ss can tell
  command -v ss >/dev/null 2>&1 || return 0
  ss -ltnpH "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n1 | cut -d= -f2 || true
}

svc_port() {
  case $1 in
    kafka) echo "$KAFKA_PORT" ;; registry) echo "$REGISTRY_PORT" ;; postgres) echo "$POSTGRES_PORT" ;;
    registry-tls) echo "$REGISTRY_TLS_PORT" ;;
    redis) echo "$REDIS_PORT" ;; s3) echo "$S3_PORT" ;;
    kafka[123]) echo "${KAFKA_NODE_PORTS[${1#kafka} - 1]}" ;;
    trino) echo "$TRINO_PORT" ;; iceberg-rest) echo "$ICEBERG_REST_PORT" ;;
  esac
}
svc_dir() { echo "$STACK/$1"; }
svc_log() {
  case $1 in
    postgres) echo "$STACK/postgres/postgres.log" ;;
    *) echo "$STACK/$1/$1.log" ;;
  esac
}
svc_pidfile() {
  case $1 in
    postgres) echo "$STACK/postgres/data/postmaster.pid" ;;
    *) echo "$STACK/$1/$1.pid" ;;
  esac
}
# The port a running instance was started with (a later call may run with other env values).
running_port() { local f="$STACK/$1/port"; if [[ -f $f ]]; then cat "$f"; else svc_port "$1"; fi; }
svc_addr() {
  local p; p=$(running_port "$1")
  case $1 in
    kafka|kafka[123]) echo "$HOST:$p" ;;
    registry) echo "http://$HOST:$p/apis/ccompat/v7" ;;
    registry-tls) echo "https://$HOST:$p/apis/ccompat/v7" ;;
    postgres) echo "postgres://caudal@$HOST:$p/caudal" ;;
    redis) echo "redis://$HOST:$p/" ;;
    s3|trino|iceberg-rest) echo "http://$HOST:$p" ;;
  esac
}
# What the process of each service must look like (guards against a recycled pid).
svc_marker() {
  case $1 in
    kafka) echo "$STACK/kafka/server.properties" ;;
    kafka[123]) echo "$STACK/$1/server.properties" ;;
    registry) echo "-Dcaudal.stack=$STACK" ;;
    registry-tls) echo "$STACK/registry-tls/credentials" ;;
    postgres) echo "postgres" ;;
    redis) echo "redis-server" ;;
    s3) echo "moto_server" ;;
    trino) echo "-Dcaudal.trino=$STACK" ;;
    iceberg-rest) echo "-Dcaudal.iceberg-rest=$STACK" ;;
  esac
}
svc_pid() { # pid of our running instance, or nothing
  local pid; pid=$(read_pid "$(svc_pidfile "$1")")
  alive "$pid" || return 0
  [[ $(cmdline "$pid") == *"$(svc_marker "$1")"* ]] && echo "$pid" || true
}
is_running() { [[ -n $(svc_pid "$1") ]]; }

tail_log() {
  local log; log=$(svc_log "$1")
  if [[ -s $log ]]; then
    warn "last lines of $log:"
    tail -n "${2:-40}" "$log" | sed 's/^/    /' >&2
  else
    warn "(nothing logged yet in $log; previous run: $log.1)"
  fi
}

# Start a long-running process detached from this shell (own session, no stdin), print its pid.
launch() { # LOG CMD...
  local log=$1; shift
  setsid "$@" </dev/null >>"$log" 2>&1 9>&- &
  echo $!
}

# ---------------------------------------------------------------------------------------------
# Prerequisites

need_install=0
check_tools() {
  local s
  for s in "$@"; do
    case $s in
      kafka|kafka[123]|registry|iceberg-rest) command -v java >/dev/null && command -v mvn >/dev/null || need_install=1 ;;
      redis) command -v redis-server >/dev/null && command -v redis-cli >/dev/null || need_install=1 ;;
      postgres) [[ -n $(pg_bindir) ]] && command -v psql >/dev/null || need_install=1 ;;
    esac
  done
  base_python >/dev/null || need_install=1
  if ((need_install)); then
    [[ ${CAUDAL_NO_INSTALL:-0} == 1 ]] && die "missing tools; run scripts/install-deps.sh"
    info "installing missing system packages (scripts/install-deps.sh)"
    "$SCRIPTS_DIR/install-deps.sh"
  fi
}

base_python() {
  local p
  for p in "${CAUDAL_BASE_PYTHON:-}" /usr/bin/python3 "$(command -v python3 || true)"; do
    [[ -n $p && -x $p ]] && "$p" -c 'import venv, ensurepip' >/dev/null 2>&1 && { echo "$p"; return 0; }
  done
  return 1
}

ensure_venv() {
  local req="$SCRIPTS_DIR/stack-requirements.txt" stamp="$VENV/.caudal-requirements.sha256" want
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [[ -x $VENV/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]]; then return 0; fi
  local py; py=$(base_python) || die "no python3 with the venv module (apt-get install python3-venv)"
  info "creating the Python venv $VENV (moto, confluent-kafka; downloads from PyPI)"
  local log="$CACHE/venv-install.log"
  mkdir -p "$CACHE"
  if [[ ! -x $VENV/bin/python ]]; then rm -rf "$VENV"; "$py" -m venv "$VENV" >"$log" 2>&1 \
    || { tail -n 20 "$log" >&2; die "python -m venv $VENV failed"; }; fi
  if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >>"$log" 2>&1; then
    tail -n 30 "$log" >&2; die "pip install -r $req failed (log: $log)"
  fi
  echo "$want" >"$stamp"
}

java_bin() {
  local j=${JAVA_HOME:+$JAVA_HOME/bin/java}; j=${j:-java}
  local v; v=$("$j" -version 2>&1 | head -n1 | sed -E 's/.*version "([0-9]+).*/\1/')
  [[ $v =~ ^[0-9]+$ && $v -ge 17 ]] || die "Java 17+ needed (found: $("$j" -version 2>&1 | head -n1))"
  echo "$j"
}

# Runs Maven on a copy of a module folder inside the cache (the clone stays clean).
mvn_build() { # SRC_DIR BUILD_DIR LOG [MVN ARGS...]
  local src=$1 build=$2 log=$3; shift 3
  rm -rf "$build"; mkdir -p "$build"; cp -r "$src/." "$build/"
  if ! mvn -B -q -s "$MVN_SETTINGS" -Dmaven.repo.local="$M2" -f "$build/pom.xml" "$@" package >"$log" 2>&1; then
    grep -E 'ERROR' "$log" | head -n 15 >&2 || tail -n 30 "$log" >&2
    die "Maven build of $src failed (log: $log)"
  fi
}

src_hash() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1; }

# ---------------------------------------------------------------------------------------------
# The stack's CA, its server certificate and the secured services' passwords (made once, kept
# in $STACK with mode 600; never printed)

TLS=$STACK/tls
SECRETS=$STACK/secrets

# A secret NAME: made at its first use, the same ever after.
secret() { # NAME
  local f="$SECRETS/$1"
  if [[ ! -s $f ]]; then
    (umask 077; mkdir -p "$SECRETS"; openssl rand -hex 16 >"$f.tmp" && mv "$f.tmp" "$f")
  fi
  cat "$f"
}

# The CA (ca.pem) and a certificate for 127.0.0.1 and localhost it signed (server.pem,
# server.key, and server.p12 for Java servers), valid ten years.
tls_prepare() {
  [[ -s $TLS/server.p12 && -s $TLS/ca.pem ]] && return 0
  command -v openssl >/dev/null || die "openssl is needed for the stack's CA (apt-get install openssl)"
  (
    umask 077
    rm -rf "$TLS.tmp"; mkdir -p "$TLS.tmp"; cd "$TLS.tmp"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=Caudal test stack CA" \
      -keyout ca.key -out ca.pem -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile server.ext -out server.pem 2>/dev/null
    openssl pkcs12 -export -in server.pem -inkey server.key -certfile ca.pem -name server \
      -passout "pass:$(secret keystore)" -out server.p12
    rm -f server.csr server.ext ca.srl
  ) || die "making the stack's CA and certificate failed"
  chmod 644 "$TLS.tmp/ca.pem"
  rm -rf "$TLS"; mv "$TLS.tmp" "$TLS"
}

# ---------------------------------------------------------------------------------------------
# Kafka

kafka_prepare() {
  local libs="$KAFKA_HOME/libs" want
  want="$(src_hash "$SCRIPTS_DIR/kafka")-$KAFKA_VERSION"
  if [[ -f $libs/kafka_2.13-$KAFKA_VERSION.jar && $(cat "$KAFKA_HOME/.stamp" 2>/dev/null) == "$want" ]]; then
    return 0
  fi
  info "fetching Apache Kafka $KAFKA_VERSION jars from Maven Central into $libs"
  mkdir -p "$KAFKA_HOME"
  rm -rf "$libs.tmp"
  mvn_build "$SCRIPTS_DIR/kafka" "$KAFKA_HOME/build" "$KAFKA_HOME/build.log" \
    -Dkafka.version="$KAFKA_VERSION" -Dlibs.dir="$libs.tmp"
  [[ -f $libs.tmp/kafka_2.13-$KAFKA_VERSION.jar ]] || die "kafka_2.13-$KAFKA_VERSION.jar missing after the Maven fetch"
  rm -rf "$libs"; mv "$libs.tmp" "$libs"; rm -rf "$KAFKA_HOME/build"
  echo "$want" >"$KAFKA_HOME/.stamp"
}

kafka_config() {
  local d="$STACK/kafka"
  mkdir -p "$d/data"
  tls_prepare
  (umask 077; cat >"$d/server.properties") <<EOF
# generated by scripts/services.sh -- edits are overwritten at each start
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$KAFKA_PORT,CONTROLLER://$HOST:$KAFKA_CONTROLLER_PORT,SASL_SSL://$HOST:$KAFKA_SECURE_PORT
advertised.listeners=PLAINTEXT://$HOST:$KAFKA_PORT,SASL_SSL://$HOST:$KAFKA_SECURE_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL
# The secured listener: SCRAM-SHA-512 over TLS with the stack's CA (users: kafka_post_start).
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PKCS12
listener.name.sasl_ssl.ssl.keystore.location=$TLS/server.p12
listener.name.sasl_ssl.ssl.keystore.password=$(secret keystore)
log.dirs=$d/data
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
transaction.max.timeout.ms=3600000
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
log.flush.interval.messages=9223372036854775807
# The only broker is never fenced for a late heartbeat: on 2 busy cores its heartbeat to its
# own controller came more than the default 9 s late, the controller fenced it, every
# partition lost its leader until it was unfenced (the transaction log's leader epoch went
# 0 -> 2 within one test), and a job saw no checkpoint for 30 s (CI). Fencing moves
# leadership to another broker; with one there is nowhere to move it.
broker.session.timeout.ms=120000
EOF
  kafka_config_log4j "$d"
}

kafka_config_log4j() { # DIR
  cat >"$1/log4j2.properties" <<'EOF'
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
# startup / shutdown milestones, so that a slow start shows how far it got
logger.raftserver.name = kafka.server.KafkaRaftServer
logger.raftserver.level = INFO
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = INFO
# fencing and unfencing of brokers, and leader elections
logger.controller.name = org.apache.kafka.controller.QuorumController
logger.controller.level = INFO
EOF
}

kafka_launch() {
  local d="$STACK/kafka" java cp
  java=$(java_bin); cp="$KAFKA_HOME/libs/*"
  kafka_config
  if [[ ! -f $d/data/meta.properties ]]; then
    local id
    id=$(cat "$d/cluster.id" 2>/dev/null || "$java" -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1)
    echo "$id" >"$d/cluster.id"
    "$java" -Dlog4j2.configurationFile="$d/log4j2.properties" -cp "$cp" kafka.tools.StorageTool \
      format -t "$id" -c "$d/server.properties" --ignore-formatted >>"$d/kafka.log" 2>&1 \
      || { tail_log kafka; die "kafka storage format failed"; }
  fi
  launch "$d/kafka.log" "$java" -Xms256m -Xmx"$KAFKA_HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -Djava.awt.headless=true -Dlog4j2.configurationFile="$d/log4j2.properties" \
    -cp "$cp" kafka.Kafka "$d/server.properties" >"$d/kafka.pid"
}

kafka_ready() {
  "$VENV/bin/python" - "$HOST:$KAFKA_PORT" <<'EOF' >/dev/null 2>&1
import sys
from confluent_kafka.admin import AdminClient
md = AdminClient({"bootstrap.servers": sys.argv[1], "log_level": 0}).list_topics(timeout=3)
sys.exit(0 if md.brokers else 1)
EOF
}

# The SCRAM user of the secured listener (created or updated over the plaintext one: KRaft
# keeps SCRAM credentials in its metadata log), the client.properties a client of the secured
# listener needs, and one metadata request through it.
kafka_post_start() {
  local props="$STACK/secure/client.properties"
  (umask 077; mkdir -p "$STACK/secure"; cat >"$props.tmp") <<EOF
# Caudal test stack: a client of the SASL_SSL listener $HOST:$KAFKA_SECURE_PORT (scripts/services.sh)
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.username=$KAFKA_USER
sasl.password=$(secret kafka-$KAFKA_USER)
ssl.ca.location=$TLS/ca.pem
# ... and of the registry over HTTPS with basic auth (service registry-tls)
schema.registry.url=$(svc_addr registry-tls)
basic.auth.credentials.source=USER_INFO
basic.auth.user.info=$REGISTRY_USER:$(secret registry-$REGISTRY_USER)
schema.registry.ssl.ca.location=$TLS/ca.pem
EOF
  mv "$props.tmp" "$props"
  "$VENV/bin/python" - "$HOST:$KAFKA_PORT" "$HOST:$KAFKA_SECURE_PORT" "$props" <<'EOF' >>"$(svc_log kafka)" 2>&1 \
    || { tail_log kafka; die "kafka: the SASL_SSL listener does not answer (SCRAM user or TLS)"; }
import sys, time
from confluent_kafka.admin import AdminClient, UserScramCredentialUpsertion, ScramCredentialInfo, ScramMechanism
plain, secure, props = sys.argv[1:4]
conf = dict(l.split("=", 1) for l in open(props).read().splitlines() if l and not l.startswith("#"))
conf = {k: v for k, v in conf.items() if not k.startswith(("schema.registry.", "basic.auth.", "bearer.auth."))}
admin = AdminClient({"bootstrap.servers": plain, "log_level": 0})
upsert = UserScramCredentialUpsertion(conf["sasl.username"], ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                      conf["sasl.password"].encode())
for f in admin.alter_user_scram_credentials([upsert]).values():
    f.result(timeout=30)
deadline = time.time() + 60
while True:
    try:
        md = AdminClient({"bootstrap.servers": secure, "log_level": 0, **conf}).list_topics(timeout=5)
        if md.brokers:
            break
    except Exception as e:
        if time.time() > deadline:
            raise SystemExit(f"SASL_SSL listener: {e}")
    time.sleep(0.5)
print("services: kafka: SASL_SSL listener ready (SCRAM-SHA-512)")
EOF
}

# ---------------------------------------------------------------------------------------------
# The 3-broker cluster: kafka1..kafka3, one KRaft node each (broker and controller)

kafka_node_config() { # N
  local n=$1 d="$STACK/kafka$1" voters="" i
  for i in 1 2 3; do voters+="${voters:+,}$i@$HOST:${KAFKA_NODE_CONTROLLER_PORTS[i - 1]}"; done
  mkdir -p "$d/data"
  cat >"$d/server.properties" <<EOF
# generated by scripts/services.sh -- edits are overwritten at each start
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://$HOST:${KAFKA_NODE_PORTS[n - 1]},CONTROLLER://$HOST:${KAFKA_NODE_CONTROLLER_PORTS[n - 1]}
advertised.listeners=PLAINTEXT://$HOST:${KAFKA_NODE_PORTS[n - 1]}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$d/data
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
auto.create.topics.enable=true
offsets.topic.replication.factor=3
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=3
transaction.max.timeout.ms=3600000
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
replica.lag.time.max.ms=5000
broker.session.timeout.ms=6000
broker.heartbeat.interval.ms=1000
log.flush.interval.messages=9223372036854775807
EOF
  kafka_config_log4j "$d"
}

kafka_node_launch() { # N
  local n=$1 d="$STACK/kafka$1" java cp id
  java=$(java_bin); cp="$KAFKA_HOME/libs/*"
  kafka_node_config "$n"
  if [[ ! -f $d/data/meta.properties ]]; then
    # One cluster id for the three nodes.
    [[ -f $STACK/kafka-nodes.cluster.id ]] \
      || "$java" -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1 >"$STACK/kafka-nodes.cluster.id"
    id=$(cat "$STACK/kafka-nodes.cluster.id")
    "$java" -Dlog4j2.configurationFile="$d/log4j2.properties" -cp "$cp" kafka.tools.StorageTool \
      format -t "$id" -c "$d/server.properties" --ignore-formatted >>"$d/kafka$n.log" 2>&1 \
      || { tail_log "kafka$n"; die "kafka$n storage format failed"; }
  fi
  launch "$d/kafka$n.log" "$java" -Xms128m -Xmx"$KAFKA_NODE_HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -Djava.awt.headless=true -Dlog4j2.configurationFile="$d/log4j2.properties" \
    -cp "$cp" kafka.Kafka "$d/server.properties" >"$d/kafka$n.pid"
}

kafka_node_ready() { # N: this node is a broker of the cluster's metadata
  "$VENV/bin/python" - "$HOST:${KAFKA_NODE_PORTS[$1 - 1]}" "$1" <<'EOF' >/dev/null 2>&1
import sys
from confluent_kafka.admin import AdminClient
md = AdminClient({"bootstrap.servers": sys.argv[1], "log_level": 0}).list_topics(timeout=3)
sys.exit(0 if int(sys.argv[2]) in md.brokers else 1)
EOF
}
kafka1_ready() { kafka_node_ready 1; }
kafka2_ready() { kafka_node_ready 2; }
kafka3_ready() { kafka_node_ready 3; }

# ---------------------------------------------------------------------------------------------
# Schema registry: Apicurio Registry (ccompat API), assembled by scripts/registry/pom.xml

registry_prepare() {
  local app="$REGISTRY_HOME/app" want
  want="$(src_hash "$SCRIPTS_DIR/registry")-$REGISTRY_DB_KIND"
  if [[ -f $app/registry-runner.jar && $(cat "$REGISTRY_HOME/.stamp" 2>/dev/null) == "$want" ]]; then
    return 0
  fi
  info "assembling Apicurio Registry $APICURIO_VERSION from Maven Central into $app"
  # The datasource kind is fixed when Quarkus builds the app (see scripts/registry/pom.xml).
  mvn_build "$SCRIPTS_DIR/registry" "$REGISTRY_HOME/build" "$REGISTRY_HOME/build.log" \
    "-D%prod.quarkus.datasource.db-kind=$REGISTRY_DB_KIND"
  local t="$REGISTRY_HOME/build/target"
  [[ -f $t/caudal-apicurio-registry-1-runner.jar ]] || die "registry runner jar missing after the build"
  rm -rf "$app"; mkdir -p "$app"
  mv "$t/caudal-apicurio-registry-1-runner.jar" "$app/registry-runner.jar"; mv "$t/lib" "$app/lib"
  rm -rf "$REGISTRY_HOME/build"
  echo "$want" >"$REGISTRY_HOME/.stamp"
}

# Apicurio takes a second database connection while it holds one (rules are read inside
# the registration's handle): with 16 connections, a burst of concurrent registrations
# (every sink subtask of the test jobs registers at start) held all of them and waited for
# more — minutes of HTTP 500 "acquisition timeout". 64 is more than twice its worker threads.
#
# Its storage is the database `registry` of the stack's PostgreSQL, made empty at each start
# (the stack's schemas are the tests' own, made again by each run). Not H2: Apicurio's H2
# statements take the next content id with an UPDATE and a SELECT, and two concurrent
# registrations got the same id — a primary-key violation after which the registry answered
# 500 or nothing to every registration (CI saw the Kafka tests fail so, on a file database
# and in memory alike). Its PostgreSQL statements take it atomically.
registry_launch() {
  local d="$STACK/registry" java pg
  java=$(java_bin)
  pg=$(running_port postgres)
  registry_fresh_database "$pg"
  launch "$d/registry.log" "$java" -Xms64m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -Dcaudal.stack="$STACK" \
    -Dquarkus.http.host="$HOST" -Dquarkus.http.port="$REGISTRY_PORT" \
    -Dquarkus.banner.enabled=false -DLOG_LEVEL=WARN -DREGISTRY_LOG_LEVEL=WARN \
    -Dregistry.ccompat.max-subjects=1000000 \
    "-D%prod.quarkus.datasource.db-kind=$REGISTRY_DB_KIND" \
    -DREGISTRY_DATASOURCE_URL="jdbc:postgresql://$HOST:$pg/$REGISTRY_DATABASE" \
    -DREGISTRY_DATASOURCE_USERNAME=caudal -DREGISTRY_DATASOURCE_PASSWORD=unused \
    -Dquarkus.datasource.jdbc.initial-size=1 -Dquarkus.datasource.jdbc.min-size=1 \
    -Dquarkus.datasource.jdbc.max-size=64 -Dquarkus.datasource.jdbc.acquisition-timeout=30S \
    -jar "$REGISTRY_HOME/app/registry-runner.jar" >"$d/registry.pid"
}

# Drops and creates the registry's database; waits for PostgreSQL first (the services are
# launched together, and PostgreSQL may still be starting).
registry_fresh_database() { # PORT
  fresh_database registry "$REGISTRY_DATABASE" "$1"
}

fresh_database() { # SERVICE DATABASE PORT
  local svc=$1 db=$2 port=$3 deadline=$((SECONDS + TIMEOUT))
  until POSTGRES_PORT=$port postgres_ready; do
    ((SECONDS < deadline)) || die "$svc: its storage, postgres, is not up after ${TIMEOUT}s (scripts/services.sh start postgres $svc)"
    sleep 0.5
  done
  psql -X -q -h "$HOST" -p "$port" -U caudal -d postgres \
    -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" \
    -c "CREATE DATABASE $db" >/dev/null \
    || die "$svc: could not make its database $db in postgres"
}

registry_ready() { curl -sf -o /dev/null "http://$HOST:$REGISTRY_PORT/apis/ccompat/v7/subjects"; }

registry_post_start() {
  # Confluent's default global compatibility is BACKWARD (Apicurio's is NONE): match Confluent.
  curl -sf -o /dev/null -X PUT -H 'Content-Type: application/vnd.schemaregistry.v1+json' \
    --data '{"compatibility":"BACKWARD"}' "http://$HOST:$REGISTRY_PORT/apis/ccompat/v7/config" \
    || warn "could not set the registry's global compatibility to BACKWARD"
  # Thirty registrations one at a time before any test's, so the registry's code paths are
  # loaded and compiled before the tests' first burst (on 2 busy cores a cold registry was
  # slow enough for that burst to time out). The subjects are deleted again.
  local subjects="http://$HOST:$REGISTRY_PORT/apis/ccompat/v7/subjects" i
  for i in $(seq 1 30); do
    curl -sf -o /dev/null -m 30 -X POST -H 'Content-Type: application/vnd.schemaregistry.v1+json' \
      --data "{\"schema\":\"{\\\"type\\\":\\\"record\\\",\\\"name\\\":\\\"W$i\\\",\\\"fields\\\":[]}\"}" \
      "$subjects/caudal-stack-warmup-$i-value/versions" \
      || { warn "could not register the registry's warm-up schema $i"; break; }
  done
  for i in $(seq 1 30); do
    curl -sf -o /dev/null -X DELETE "$subjects/caudal-stack-warmup-$i-value" \
      && curl -sf -o /dev/null -X DELETE "$subjects/caudal-stack-warmup-$i-value?permanent=true" \
      || { warn "could not delete the registry's warm-up subject $i"; break; }
  done
}

# ---------------------------------------------------------------------------------------------
# The registry over HTTPS with basic auth (scripts/registry-tls-proxy.py in front of the
# registry; user $REGISTRY_USER, password in $SECRETS): what a company's registry looks like.

registry_tls_launch() {
  local d="$STACK/registry-tls"
  tls_prepare
  (umask 077; printf '%s:%s\n' "$REGISTRY_USER" "$(secret "registry-$REGISTRY_USER")" >"$d/credentials")
  launch "$d/registry-tls.log" "$VENV/bin/python" "$SCRIPTS_DIR/registry-tls-proxy.py" "$HOST" \
    "$REGISTRY_TLS_PORT" "http://$HOST:$(running_port registry)" "$TLS/server.pem" "$TLS/server.key" \
    "$d/credentials" >"$d/registry-tls.pid"
}

# Ready when an authenticated request gets through to the registry (the password goes to curl
# on its standard input, never on a command line).
registry_tls_ready() {
  printf 'user = "%s:%s"\n' "$REGISTRY_USER" "$(secret "registry-$REGISTRY_USER")" \
    | curl -sf -o /dev/null -K - --cacert "$TLS/ca.pem" "https://$HOST:$REGISTRY_TLS_PORT/apis/ccompat/v7/subjects"
}

# ---------------------------------------------------------------------------------------------
# PostgreSQL

pg_bindir() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [[ -x $d/postgres && -x $d/pg_ctl && -x $d/initdb ]] && { echo "$d"; return 0; }
  done
  d=$(dirname "$(command -v pg_ctl 2>/dev/null || echo /nonexistent/x)")
  [[ -x $d/postgres && -x $d/initdb ]] && echo "$d" || true
}

PG_RUN=()
PG_USER_SYS=
pg_user() { # PostgreSQL refuses to run as root: run it as a system user
  if [[ $(id -u) -ne 0 ]]; then PG_RUN=(); PG_USER_SYS=$(id -un); return 0; fi
  if id -u postgres >/dev/null 2>&1; then PG_USER_SYS=postgres
  else
    id -u caudalpg >/dev/null 2>&1 || useradd -r -M -d /nonexistent -s /usr/sbin/nologin caudalpg \
      || die "could not create the system user caudalpg for PostgreSQL"
    PG_USER_SYS=caudalpg
  fi
  PG_RUN=(runuser -u "$PG_USER_SYS" --)
}

# Where PostgreSQL's files live. As root the server runs as another user, who may not reach
# the stack directory (under /root, say); rather than open up folders above it, the files then
# go into a directory of their own, owned by that user, outside any home
# (/var/tmp/caudal-pg-<uid>-<hash of the stack dir>, or $CAUDAL_PG_DIR), and
# $STACK/postgres is a symbolic link to it. Nothing outside these two changes.
pg_dir() { # the real path, for commands run as the server user
  local link="$STACK/postgres"
  if [[ -L $link ]]; then readlink -f "$link"; else echo "$link"; fi
}

pg_place() {
  local link="$STACK/postgres" ext
  [[ $(id -u) -eq 0 ]] || { mkdir -p "$link"; return 0; }
  if [[ -L $link ]]; then
    ext=$(readlink -f "$link")
  elif [[ -d $link ]] && "${PG_RUN[@]}" test -w "$link" 2>/dev/null && "${PG_RUN[@]}" test -x "$link/.." 2>/dev/null; then
    return 0 # a stack directory the server user reaches as it is
  else
    ext=${CAUDAL_PG_DIR:-/var/tmp/caudal-pg-$(id -u)-$(printf '%s' "$STACK" | cksum | cut -d' ' -f1)}
    # An old layout's data (under a directory the server user cannot reach) is test data.
    [[ -d $link ]] && rm -rf "$link"
    mkdir -p "$(dirname "$link")"
    ln -s "$ext" "$link"
    info "PostgreSQL's files are in $ext (user $PG_USER_SYS cannot reach $STACK); $link links to it"
  fi
  mkdir -p "$ext"
  chown "$PG_USER_SYS:" "$ext"
  chmod 700 "$ext"
  "${PG_RUN[@]}" test -w "$ext" || die "user $PG_USER_SYS cannot write $ext"
}

postgres_prepare() {
  local bin d
  bin=$(pg_bindir); [[ -n $bin ]] || die "PostgreSQL server binaries not found (scripts/install-deps.sh)"
  pg_user
  pg_place
  d=$(pg_dir)
  [[ $(id -u) -eq 0 ]] && chown "$PG_USER_SYS:" "$d"
  if [[ ! -f $d/data/PG_VERSION ]]; then
    rm -rf "$d/data"
    "${PG_RUN[@]}" "$bin/initdb" -D "$d/data" -U caudal --auth=trust -E UTF8 --no-locale \
      >"$d/initdb.log" 2>&1 || { tail -n 20 "$d/initdb.log" >&2; die "initdb failed"; }
    cat >>"$d/data/postgresql.conf" <<EOF

# --- scripts/services.sh (test stack) ---
listen_addresses = '$HOST'
unix_socket_directories = '$d'
max_connections = 200
max_prepared_transactions = 64
EOF
    if [[ $DURABLE == 1 ]]; then
      printf 'fsync = on\nfull_page_writes = on\nsynchronous_commit = on\n' >>"$d/data/postgresql.conf"
    else
      printf 'fsync = off\nfull_page_writes = off\nsynchronous_commit = off\n' >>"$d/data/postgresql.conf"
    fi
  fi
}

postgres_launch() {
  local bin d; d=$(pg_dir)
  bin=$(pg_bindir); pg_user
  rm -f "$d/data/postmaster.pid.stale"
  # TLS with the stack's certificate: the server wants its key owned by itself, mode 600.
  tls_prepare
  mkdir -p "$d/tls"
  cp "$TLS/server.pem" "$TLS/server.key" "$d/tls/"
  [[ $(id -u) -eq 0 ]] && chown -R "$PG_USER_SYS:" "$d/tls"
  chmod 700 "$d/tls"; chmod 600 "$d/tls/server.key"
  # pg_ctl starts the server detached; -W: do not wait here (readiness is checked below).
  "${PG_RUN[@]}" "$bin/pg_ctl" -D "$d/data" -l "$d/postgres.log" -W \
    -o "-p $POSTGRES_PORT -c listen_addresses=$HOST -c unix_socket_directories=$d -c ssl=on -c ssl_cert_file=$d/tls/server.pem -c ssl_key_file=$d/tls/server.key" start \
    >>"$d/pg_ctl.log" 2>&1 </dev/null 9>&- || { tail -n 20 "$d/pg_ctl.log" >&2; tail_log postgres; die "pg_ctl start failed"; }
}

postgres_ready() {
  local bin; bin=$(pg_bindir)
  "$bin/pg_isready" -q -h "$HOST" -p "$POSTGRES_PORT" -d postgres -U caudal 2>/dev/null
}

postgres_post_start() {
  local has
  has=$(psql -X -h "$HOST" -p "$POSTGRES_PORT" -U caudal -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = 'caudal'" 2>/dev/null || true)
  if [[ $has != 1 ]]; then
    psql -X -q -h "$HOST" -p "$POSTGRES_PORT" -U caudal -d postgres -c 'CREATE DATABASE caudal' >/dev/null \
      || die "could not create database caudal"
  fi
  postgres_password_role
  postgres_tls_role
}

# Everyone connects without a password (trust) except the role caudal_pw (password caudal_pw),
# which must authenticate with scram-sha-256 over TCP: the tests of a wrong password use it.
# Added to an existing data directory too (the rule goes first: pg_hba.conf is first-match).
# Puts LINES (a comment, then rules) at the top of pg_hba.conf, unless its first rule is there
# already, and reloads it (the file is first-match; rewritten in place: it keeps its owner).
pg_hba_prepend() { # LINE...
  local hba tmp; hba="$(pg_dir)/data/pg_hba.conf"
  grep -qxF "$2" "$hba" && return 0
  tmp=$(mktemp)
  { printf '%s\n' "$@"; cat "$hba"; } >"$tmp"
  cat "$tmp" >"$hba"
  rm -f "$tmp"
  psql -X -q -h "$HOST" -p "$POSTGRES_PORT" -U caudal -d postgres -c 'SELECT pg_reload_conf()' >/dev/null \
    || die "could not reload pg_hba.conf"
}

PG_PASSWORD_ROLE=caudal_pw
postgres_password_role() {
  local has
  pg_hba_prepend "# scripts/services.sh: role $PG_PASSWORD_ROLE authenticates with a password" \
    "host all $PG_PASSWORD_ROLE 127.0.0.1/32 scram-sha-256" "host all $PG_PASSWORD_ROLE ::1/128 scram-sha-256"
  has=$(psql -X -h "$HOST" -p "$POSTGRES_PORT" -U caudal -d postgres -tAc \
        "SELECT 1 FROM pg_roles WHERE rolname = '$PG_PASSWORD_ROLE'" 2>/dev/null || true)
  if [[ $has != 1 ]]; then
    psql -X -q -h "$HOST" -p "$POSTGRES_PORT" -U caudal -d postgres -c \
      "SET password_encryption = 'scram-sha-256'; CREATE ROLE $PG_PASSWORD_ROLE LOGIN PASSWORD '$PG_PASSWORD_ROLE'" \
      >/dev/null || die "could not create role $PG_PASSWORD_ROLE"
  fi
}

# The role caudal_tls: a SCRAM password made at first start ($SECRETS), over TLS only (hostssl;
# the same connection without TLS is rejected), with the rights of a job's sinks in database
# caudal. CAUDAL_POSTGRES_TLS_URL reaches it with sslmode=verify-full and the stack's CA.
PG_TLS_ROLE=caudal_tls
postgres_tls_role() {
  pg_hba_prepend "# scripts/services.sh: role $PG_TLS_ROLE over TLS with a password, never without TLS" \
    "hostssl all $PG_TLS_ROLE 127.0.0.1/32 scram-sha-256" "hostnossl all $PG_TLS_ROLE 127.0.0.1/32 reject"
  # The password goes to psql on its standard input, never on a command line.
  psql -X -q -v ON_ERROR_STOP=1 -h "$HOST" -p "$POSTGRES_PORT" -U caudal -d caudal >/dev/null <<EOF \
    || die "could not set up role $PG_TLS_ROLE"
SET password_encryption = 'scram-sha-256';
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$PG_TLS_ROLE') THEN
    CREATE ROLE $PG_TLS_ROLE LOGIN;
  END IF;
END \$\$;
ALTER ROLE $PG_TLS_ROLE PASSWORD '$(secret "postgres-$PG_TLS_ROLE")';
GRANT ALL ON DATABASE caudal TO $PG_TLS_ROLE;
GRANT ALL ON SCHEMA public TO $PG_TLS_ROLE;
EOF
}

postgres_stop() {
  local bin d; d=$(pg_dir)
  bin=$(pg_bindir); pg_user
  "${PG_RUN[@]}" "$bin/pg_ctl" -D "$d/data" -m fast -w -t 60 stop >>"$d/pg_ctl.log" 2>&1 </dev/null || true
}

# ---------------------------------------------------------------------------------------------
# Redis

redis_launch() {
  local d="$STACK/redis"
  mkdir -p "$d"
  tls_prepare
  (umask 077; cat >"$d/redis.conf") <<EOF
# generated by scripts/services.sh (it holds a password: mode 600)
bind $HOST
port $REDIS_PORT
tls-port $REDIS_TLS_PORT
tls-cert-file $TLS/server.pem
tls-key-file $TLS/server.key
tls-ca-cert-file $TLS/ca.pem
tls-auth-clients no
user default on nopass ~* &* +@all
user $REDIS_TLS_USER on >$(secret "redis-$REDIS_TLS_USER") ~* &* +@all
protected-mode yes
daemonize yes
pidfile $d/redis.pid
logfile $d/redis.log
dir $d
save ""
EOF
  if [[ $DURABLE == 1 ]]; then
    printf 'appendonly yes\nappendfsync always\n' >>"$d/redis.conf"
  else
    printf 'appendonly no\n' >>"$d/redis.conf"
  fi
  rm -f "$d/redis.pid"
  redis-server "$d/redis.conf" </dev/null >>"$d/redis.log" 2>&1 9>&- || { tail_log redis; die "redis-server failed to start"; }
  local i; for i in $(seq 50); do [[ -s $d/redis.pid ]] && break; sleep 0.1; done
}

redis_ready() { [[ $(redis-cli -h "$HOST" -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]]; }

# ---------------------------------------------------------------------------------------------
# S3 (moto)

s3_launch() {
  local d="$STACK/s3"
  mkdir -p "$d"
  launch "$d/s3.log" "$VENV/bin/moto_server" -H "$HOST" -p "$S3_PORT" >"$d/s3.pid"
}

s3_ready() { [[ $(curl -s -o /dev/null -w '%{http_code}' "http://$HOST:$S3_PORT/" 2>/dev/null) == 200 ]]; }

s3_post_start() {
  "$VENV/bin/python" - "http://$HOST:$S3_PORT" "$S3_BUCKET" <<'EOF' || die "could not create the S3 bucket"
import sys, boto3
s3 = boto3.client("s3", endpoint_url=sys.argv[1], aws_access_key_id="test",
                  aws_secret_access_key="test", region_name="us-east-1")
if sys.argv[2] not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
    s3.create_bucket(Bucket=sys.argv[2])
EOF
}

# ---------------------------------------------------------------------------------------------
# Trino (only when named)

trino_java() { # a Java 24+ home: CAUDAL_TRINO_JAVA_HOME, or one under /usr/lib/jvm
  local h v
  for h in "${CAUDAL_TRINO_JAVA_HOME:-}" /usr/lib/jvm/*; do
    [[ -n $h && -x $h/bin/java ]] || continue
    v=$("$h/bin/java" -version 2>&1 | head -n1 | sed -E 's/.*version "([0-9]+).*/\1/')
    [[ $v =~ ^[0-9]+$ && $v -ge 24 ]] && { echo "$h"; return 0; }
  done
  return 1
}

trino_prepare() {
  trino_java >/dev/null || die "trino: needs Java 24 or newer (none under /usr/lib/jvm; set CAUDAL_TRINO_JAVA_HOME)"
  is_running postgres && is_running s3 || die "trino: needs postgres and s3 running (scripts/services.sh start)"
  [[ -x $TRINO_HOME/bin/launcher ]] && return 0
  local url="https://repo.maven.apache.org/maven2/io/trino/trino-server/$TRINO_VERSION/trino-server-$TRINO_VERSION.tar.gz"
  local tgz="$CACHE/trino-server-$TRINO_VERSION.tar.gz" sha
  if [[ ! -f $tgz ]]; then
    info "downloading Trino $TRINO_VERSION (~800 MB, once; cached in $CACHE)"
    curl -sfL -o "$tgz.part" "$url" || die "trino: could not download $url"
    sha=$(curl -sfL "$url.sha1") || die "trino: could not download $url.sha1"
    [[ $(sha1sum "$tgz.part" | cut -d' ' -f1) == "${sha%% *}" ]] || { rm -f "$tgz.part"; die "trino: $url: checksum mismatch"; }
    mv "$tgz.part" "$tgz"
  fi
  rm -rf "$TRINO_HOME.part"; mkdir -p "$TRINO_HOME.part"
  tar xzf "$tgz" -C "$TRINO_HOME.part" --strip-components=1 || die "trino: could not unpack $tgz"
  mv "$TRINO_HOME.part" "$TRINO_HOME"
}

trino_launch() {
  local d="$STACK/trino" pg s3 java
  pg=$(running_port postgres); s3=$(running_port s3)
  rm -rf "$d/etc" "$d/plugin"; mkdir -p "$d/etc/catalog" "$d/plugin" "$d/data"
  # Only the Iceberg plugin: Trino loads every plugin it finds, and starts faster without.
  ln -s "$TRINO_HOME/plugin/iceberg" "$d/plugin/iceberg"
  cat >"$d/etc/node.properties" <<EOF
node.environment=caudal
node.id=caudal-stack
node.data-dir=$d/data
node.bind-ip=$HOST
node.internal-address=$HOST
EOF
  cat >"$d/etc/config.properties" <<EOF
coordinator=true
node-scheduler.include-coordinator=true
http-server.http.port=$TRINO_PORT
discovery.uri=http://$HOST:$TRINO_PORT
plugin.dir=$d/plugin
query.max-memory=512MB
query.max-memory-per-node=512MB
EOF
  cat >"$d/etc/jvm.config" <<EOF
-server
-Xmx$TRINO_HEAP
-XX:+UseG1GC
-XX:+ExitOnOutOfMemoryError
-Djdk.attach.allowAttachSelf=true
-Dcaudal.trino=$STACK
EOF
  cat >"$d/etc/catalog/lake.properties" <<EOF
connector.name=iceberg
iceberg.catalog.type=jdbc
iceberg.jdbc-catalog.driver-class=org.postgresql.Driver
iceberg.jdbc-catalog.connection-url=jdbc:postgresql://$HOST:$pg/caudal
iceberg.jdbc-catalog.connection-user=caudal
iceberg.jdbc-catalog.catalog-name=caudal
iceberg.jdbc-catalog.default-warehouse-dir=s3://$S3_BUCKET/trino-warehouse
fs.native-s3.enabled=true
s3.endpoint=http://$HOST:$s3
s3.region=us-east-1
s3.path-style-access=true
s3.aws-access-key=test
s3.aws-secret-key=test
EOF
  java=$(trino_java)
  JAVA_HOME=$java PATH="$java/bin:$PATH" launch "$d/trino.log" "$TRINO_HOME/bin/launcher" run \
    --etc-dir "$d/etc" --data-dir "$d/data" >"$d/trino.pid"
}

trino_ready() {
  curl -sf "http://$HOST:$TRINO_PORT/v1/info" 2>/dev/null | grep -q '"starting":false'
}

# ---------------------------------------------------------------------------------------------
# Iceberg REST catalog (only when named), assembled by scripts/iceberg-rest/pom.xml

iceberg_rest_prepare() {
  is_running postgres && is_running s3 || die "iceberg-rest: needs postgres and s3 running (scripts/services.sh start postgres s3 iceberg-rest)"
  local libs="$ICEBERG_REST_HOME/libs" want
  want="$(src_hash "$SCRIPTS_DIR/iceberg-rest")-$ICEBERG_REST_VERSION"
  if [[ -f $libs/caudal-iceberg-rest-1.jar && $(cat "$ICEBERG_REST_HOME/.stamp" 2>/dev/null) == "$want" ]]; then
    return 0
  fi
  info "assembling the Iceberg $ICEBERG_REST_VERSION REST catalog from Maven Central into $libs"
  mkdir -p "$ICEBERG_REST_HOME"
  rm -rf "$libs.tmp"
  mvn_build "$SCRIPTS_DIR/iceberg-rest" "$ICEBERG_REST_HOME/build" "$ICEBERG_REST_HOME/build.log" \
    -Dlibs.dir="$libs.tmp"
  [[ -f $libs.tmp/caudal-iceberg-rest-1.jar ]] || die "caudal-iceberg-rest-1.jar missing after the Maven build"
  rm -rf "$libs"; mv "$libs.tmp" "$libs"; rm -rf "$ICEBERG_REST_HOME/build"
  echo "$want" >"$ICEBERG_REST_HOME/.stamp"
}

# The catalog's tables live in the database iceberg_rest, made empty at each start like the
# S3 server's objects (moto keeps them in memory): a table of an earlier stack would point to
# metadata that is gone.
iceberg_rest_launch() {
  local d="$STACK/iceberg-rest" java pg s3
  java=$(java_bin); pg=$(running_port postgres); s3=$(running_port s3)
  fresh_database iceberg-rest "$ICEBERG_REST_DATABASE" "$pg"
  cat >"$d/catalog.properties" <<EOF
# generated by scripts/services.sh -- edits are overwritten at each start
rest.host=$HOST
rest.port=$ICEBERG_REST_PORT
catalog.name=$ICEBERG_REST_CATALOG
catalog-impl=org.apache.iceberg.jdbc.JdbcCatalog
uri=jdbc:postgresql://$HOST:$pg/$ICEBERG_REST_DATABASE
jdbc.user=caudal
jdbc.password=unused
# the tables' layout pyiceberg's SqlCatalog and Trino share (iceberg_type column)
jdbc.schema-version=V1
warehouse=s3://$S3_BUCKET/iceberg-rest
io-impl=org.apache.iceberg.aws.s3.S3FileIO
s3.endpoint=http://$HOST:$s3
s3.path-style-access=true
s3.access-key-id=test
s3.secret-access-key=test
client.region=us-east-1
http-client.type=urlconnection
EOF
  launch "$d/iceberg-rest.log" "$java" -Xms64m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -Dcaudal.iceberg-rest="$STACK" -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
    -Dorg.slf4j.simpleLogger.showDateTime=true \
    -cp "$ICEBERG_REST_HOME/libs/*" dev.caudal.teststack.IcebergRestCatalog "$d/catalog.properties" \
    >"$d/iceberg-rest.pid"
}

iceberg_rest_ready() { curl -sf -o /dev/null "http://$HOST:$ICEBERG_REST_PORT/v1/config"; }

# ---------------------------------------------------------------------------------------------

svc_prepare() {
  case $1 in
    kafka|kafka[123]) kafka_prepare ;; registry) registry_prepare ;; postgres) postgres_prepare ;;
    redis|s3|registry-tls) : ;; trino) trino_prepare ;; iceberg-rest) iceberg_rest_prepare ;;
  esac
}

# Refuse to start over a port held by someone else.
check_port_free() {
  local s=$1 p owner
  p=$(svc_port "$s")
  port_open "$p" || return 0
  owner=$(port_owner "$p")
  local var=${s//-/_}
  die "$s: port $p on $HOST is already in use${owner:+ by pid $owner ($(cmdline "$owner" | cut -c1-120))}; stop it or set CAUDAL_${var^^}_PORT"
}

svc_stop() {
  local s=$1 pid i
  pid=$(svc_pid "$s")
  [[ -n $pid ]] || { rm -f "$STACK/$s/port"; return 0; }
  if [[ $s == postgres ]]; then postgres_stop; else kill -TERM "$pid" 2>/dev/null || true; fi
  # A node of the 3-broker cluster stopped last has no quorum left for a controlled
  # shutdown: it gets 5 s (its data is a test's), the other services 30 s.
  local tenths=300; [[ $s == kafka[123] ]] && tenths=50
  for i in $(seq "$tenths"); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then
    [[ $s == kafka[123] ]] || warn "$s (pid $pid) did not stop within 30 s: killing it"
    kill -KILL "$pid" 2>/dev/null || true
    [[ $s == postgres ]] && pkill -KILL -P "$pid" 2>/dev/null || true
    sleep 0.5
  fi
  [[ $s != postgres ]] && rm -f "$(svc_pidfile "$s")"
  rm -f "$STACK/$s/port"
}

write_env() {
  local f="$STACK/stack.env" s any=0
  {
    echo "# Caudal test stack ($(date -u +%FT%TZ)), written by scripts/services.sh"
    for s in "${ALL_SERVICES[@]}"; do
      is_running "$s" || continue
      any=1
      case $s in
        kafka)
          echo "export CAUDAL_KAFKA_BROKERS=$(svc_addr kafka)"
          if [[ -s $STACK/secure/client.properties ]]; then
            echo "export CAUDAL_KAFKA_SECURE_BROKERS=$HOST:$(cat "$STACK/kafka/secure-port" 2>/dev/null || echo "$KAFKA_SECURE_PORT")"
            echo "export CAUDAL_KAFKA_SECURE_CONFIG=$STACK/secure/client.properties"
          fi
          ;;
        registry) echo "export CAUDAL_SCHEMA_REGISTRY=$(svc_addr registry)" ;;
        postgres)
          echo "export CAUDAL_POSTGRES_URL=$(svc_addr postgres)"
          echo "export CAUDAL_POSTGRES_TLS_URL='postgres://$PG_TLS_ROLE:$(secret "postgres-$PG_TLS_ROLE")@$HOST:$(running_port postgres)/caudal?sslmode=verify-full&sslrootcert=$TLS/ca.pem'"
          ;;
        redis)
          echo "export CAUDAL_REDIS_URL=$(svc_addr redis)"
          echo "export CAUDAL_REDIS_TLS_URL=rediss://$REDIS_TLS_USER:$(secret "redis-$REDIS_TLS_USER")@$HOST:$REDIS_TLS_PORT/"
          ;;
        s3)
          echo "export CAUDAL_S3_ENDPOINT=$(svc_addr s3)"
          echo "export CAUDAL_S3_BUCKET=$S3_BUCKET"
          echo "export CAUDAL_S3_ACCESS_KEY_ID=test"
          echo "export CAUDAL_S3_SECRET_ACCESS_KEY=test"
          echo "export CAUDAL_S3_REGION=us-east-1"
          ;;
      esac
    done
    local nodes=()
    for s in "${NODE_SERVICES[@]}"; do is_running "$s" && nodes+=("$(svc_addr "$s")"); done
    if ((${#nodes[@]})); then any=1; echo "export CAUDAL_KAFKA_CLUSTER_BROKERS=$(IFS=,; echo "${nodes[*]}")"; fi
    if is_running trino; then any=1; echo "export CAUDAL_TRINO_URL=$(svc_addr trino)"; fi
    if is_running iceberg-rest; then
      any=1
      echo "export CAUDAL_ICEBERG_REST_URL=$(svc_addr iceberg-rest)"
    fi
    [[ -x $VENV/bin/python ]] && echo "export CAUDAL_PYTHON=$VENV/bin/python"
    echo "export CAUDAL_STACK_DIR=$STACK"
    if [[ -s $TLS/ca.pem ]]; then echo "export CAUDAL_STACK_CA=$TLS/ca.pem"; fi
  } >"$f.tmp"
  chmod 600 "$f.tmp"   # it holds the secured services' passwords
  if ((any)); then mv "$f.tmp" "$f"; else rm -f "$f.tmp" "$f"; fi
}

print_status() { # -> 0 if all given services are up
  local s rc=0 pid p owner
  for s in "$@"; do
    pid=$(svc_pid "$s")
    if [[ -n $pid ]] && port_open "$(running_port "$s")"; then
      printf '%-12s up    %-45s pid %s\n' "$s" "$(svc_addr "$s")" "$pid"
    elif [[ -n $pid ]]; then
      rc=3
      printf '%-12s starting/unhealthy (pid %s, port closed)  %s  log: %s\n' "$s" "$pid" "$(svc_addr "$s")" "$(svc_log "$s")"
    else
      rc=3
      p=$(svc_port "$s"); owner=
      port_open "$p" && owner=$(port_owner "$p")
      if port_open "$p"; then
        printf '%-12s down  %-45s port held by another process%s\n' "$s" "$(svc_addr "$s")" \
          "${owner:+: pid $owner $(cmdline "$owner" | cut -c1-60)}"
      else
        printf '%-12s down  %s\n' "$s" "$(svc_addr "$s")"
      fi
    fi
  done
  return $rc
}

cmd_start() {
  local s pid started=() t0 deadline log
  check_tools "$@"
  mkdir -p "$CACHE"
  ensure_venv
  for s in "$@"; do
    # PostgreSQL's folder may be a link to a folder of its own (pg_place), even a dangling
    # one (its target cleaned away with /var/tmp): pg_place recreates the target.
    [[ -L $STACK/$s ]] || mkdir -p "$STACK/$s"
    if is_running "$s"; then continue; fi
    svc_prepare "$s"
  done
  for s in "$@"; do is_running "$s" || check_port_free "$s"; done
  # launch everything that is not running, then wait for all: the services boot in parallel
  for s in "$@"; do
    is_running "$s" && continue
    log=$(svc_log "$s"); [[ -f $log ]] && mv -f "$log" "$log.1"   # keep the previous run's log
    svc_port "$s" >"$STACK/$s/port"
    [[ $s == kafka ]] && echo "$KAFKA_SECURE_PORT" >"$STACK/kafka/secure-port"
    case $s in
      kafka) kafka_launch ;; registry) registry_launch ;; postgres) postgres_launch ;;
      registry-tls) registry_tls_launch ;; redis) redis_launch ;; s3) s3_launch ;; kafka[123]) kafka_node_launch "${s#kafka}" ;;
      trino) trino_launch ;; iceberg-rest) iceberg_rest_launch ;;
    esac
    started+=("$s")
  done
  for s in "${started[@]}"; do
    t0=$SECONDS; deadline=$((SECONDS + TIMEOUT))
    while :; do
      if "${s//-/_}_ready"; then break; fi
      pid=$(read_pid "$(svc_pidfile "$s")")
      if [[ $s != postgres ]] && ! alive "$pid"; then
        tail_log "$s"; die "$s exited during startup"
      fi
      if ((SECONDS >= deadline)); then
        tail_log "$s"; svc_stop "$s"; die "$s not ready after ${TIMEOUT}s (CAUDAL_STACK_TIMEOUT)"
      fi
      sleep 0.5
    done
    declare -F "${s//-/_}_post_start" >/dev/null && "${s//-/_}_post_start"
    info "$s ready in $((SECONDS - t0))s"
  done
  # A PostgreSQL that already ran gets what newer versions of this script set up.
  if [[ " $* " == *" postgres "* && " ${started[*]} " != *" postgres "* ]]; then
    POSTGRES_PORT=$(running_port postgres) postgres_post_start
  fi
  write_env
  print_status "$@" || true
  say "env: $STACK/stack.env  (source it, or: eval \"\$(scripts/services.sh env)\")"
}

cmd_stop() {
  local s leftovers pid
  for s in "$@"; do svc_stop "$s"; done
  write_env
  # Anything of ours still alive? (processes whose command line names the stack folder)
  leftovers=
  for pid in $(pgrep -f -- "$STACK" 2>/dev/null || true); do
    case $(cat "/proc/$pid/comm" 2>/dev/null) in
      java|postgres|redis-server|python*|moto_server) leftovers+="$pid $(cmdline "$pid")"$'\n' ;;
    esac
  done
  for s in "$@"; do
    pid=$(svc_pid "$s")
    [[ -n $pid ]] && leftovers+="$pid $(cmdline "$pid")"$'\n'
  done
  if [[ -n ${leftovers//[[:space:]]/} && $# -ge ${#ALL_SERVICES[@]} ]]; then
    warn "processes left behind:"; printf '%s\n' "$leftovers" >&2; exit 1
  fi
  print_status "$@" || true
}

# ---------------------------------------------------------------------------------------------

cmd=${1:-}; shift || true
services=("$@")
if ((${#services[@]} == 0)); then
  services=("${ALL_SERVICES[@]}")
  # A plain stop also stops the services started only when named, if they run.
  if [[ $cmd == stop ]]; then
    for s in "${NODE_SERVICES[@]}" "${EXTRA_SERVICES[@]}"; do is_running "$s" && services+=("$s"); done
  fi
fi
for s in "${services[@]}"; do
  [[ " ${ALL_SERVICES[*]} ${NODE_SERVICES[*]} ${EXTRA_SERVICES[*]} " == *" $s "* ]] \
    || die "unknown service '$s' (one of: ${ALL_SERVICES[*]} ${NODE_SERVICES[*]} ${EXTRA_SERVICES[*]})"
done
# keep the canonical order (start: postgres redis s3 kafka registry kafka1..3 trino iceberg-rest;
# stop: the reverse)
ordered=()
for s in "${ALL_SERVICES[@]}" "${NODE_SERVICES[@]}" "${EXTRA_SERVICES[@]}"; do [[ " ${services[*]} " == *" $s "* ]] && ordered+=("$s"); done

mkdir -p "$STACK"
exec 9>"$STACK/.lock"
case $cmd in
  start|stop|restart) flock -w 900 9 || die "another services.sh holds $STACK/.lock" ;;
esac

case $cmd in
  start) cmd_start "${ordered[@]}" ;;
  stop)
    rev=(); for ((i=${#ordered[@]}-1; i>=0; i--)); do rev+=("${ordered[i]}"); done
    cmd_stop "${rev[@]}" ;;
  restart)
    rev=(); for ((i=${#ordered[@]}-1; i>=0; i--)); do rev+=("${ordered[i]}"); done
    cmd_stop "${rev[@]}"; cmd_start "${ordered[@]}" ;;
  purge) # stop, then delete the services' files: the stack folder's and PostgreSQL's own
    rev=(); for ((i=${#ordered[@]}-1; i>=0; i--)); do rev+=("${ordered[i]}"); done
    flock -w 900 9 || die "another services.sh holds $STACK/.lock"
    cmd_stop "${rev[@]}"
    for s in "${ordered[@]}"; do
      if [[ $s == postgres && -L $STACK/postgres ]]; then rm -rf "$(readlink -f "$STACK/postgres")"; fi
      rm -rf "${STACK:?}/$s"
    done ;;
  status) print_status "${ordered[@]}" ;;
  env) if [[ -f $STACK/stack.env ]]; then cat "$STACK/stack.env"; else die "stack not started ($STACK/stack.env missing)"; fi ;;
  *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; [[ $cmd == -h || $cmd == --help || $cmd == help ]] || exit 2 ;;
esac
