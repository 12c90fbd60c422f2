#!/usr/bin/env bash
# Kafka → Avro decode → °F→°C → anomaly filter → Kafka, a checkpoint every second, side by side
# on one input topic (issue #14): Caudal (benches/src/bin/kafka_pipeline.rs), Apache Flink 2.3
# (benches/flink, KafkaPipelineBench in a local MiniCluster) and, as the broker's own ceiling,
# Kafka's perf tools (ConsumerPerformance read_committed over the same input; ProducerPerformance
# transactional, a commit every second, acks=all, lz4, records of the input's average size).
# Not run by the test suite or CI.
#
#   benches/kafka_side_by_side.sh [--records N] [--parallelism P[,P...]] [--runs N]
#                                 [--checkpoint-interval SECS] [--delivery MODE[,MODE]]
#                                 [--only caudal,flink,kafka] [--perf-records N] [--xmx SIZE]
#                                 [--keep-topics]
#
# --records: readings in the input topic (default 2,000,000); --parallelism: of both pipelines
# (default 1,2); --runs: measured runs per mode and parallelism (default 1); --delivery: the
# sinks' modes on both engines (default exactly-once; at-least-once,exactly-once for both);
# --perf-records: records ProducerPerformance sends (default 2,000,000); --xmx: Flink's heap
# (default 1g); --keep-topics: leave the topics (by default every topic named after the input
# topic is deleted at the end).
#
# Needs the test stack (scripts/services.sh start) and Caudal's release binaries, which this
# script does not build:
#   cargo build --release -p caudal-jobs --bin temperature -p caudal-benches --bin kafka_pipeline
# (under ${CARGO_TARGET_DIR:-target}/release), java 17+ and mvn (scripts/install-deps.sh).
# The input topic (4 partitions) is made once with `temperature produce --sensors 1000 --rate 0
# --seed 1 --event-interval-ms 100`; every pipeline run reads all of it and writes into a new
# topic of 2 partitions. Caudal and Flink measure themselves (wall clock and /proc CPU of their
# process around the job's execute(), after a warm-up job in Flink's JVM); the perf tools'
# records/s are their own report and their CPU is the whole JVM's (start included). The
# broker's CPU is counted nowhere. Logs: ~/.cache/caudal/kafka-side-by-side/.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CACHE=${CAUDAL_CACHE:-$HOME/.cache/caudal}
M2=$CACHE/m2
FLINK_WORK=$CACHE/flink-bench-kafka
LOGS=$CACHE/kafka-side-by-side
KAFKA_VERSION=${CAUDAL_KAFKA_VERSION:-4.1.1}
KAFKA=$CACHE/kafka-$KAFKA_VERSION
BIN=${CARGO_TARGET_DIR:-$REPO/target}/release

records=2000000 parallelism=1,2 runs=1 checkpoint=1 delivery=exactly-once
only=caudal,flink,kafka perf_records=2000000 xmx=1g keep=0
die() { printf 'kafka side by side: %s\n' "$*" >&2; exit 2; }
say() { printf 'kafka side by side: %s\n' "$*" >&2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --keep-topics) keep=1; shift; continue ;;
  esac
  [[ $# -ge 2 ]] || die "$1 needs a value"
  case $1 in
    --records) records=$2 ;;
    --parallelism) parallelism=$2 ;;
    --runs) runs=$2 ;;
    --checkpoint-interval) checkpoint=$2 ;;
    --delivery) delivery=$2 ;;
    --only) only=$2 ;;
    --perf-records) perf_records=$2 ;;
    --xmx) xmx=$2 ;;
    *) die "unknown flag $1 (see the top of $0)" ;;
  esac
  shift 2
done
[[ $records =~ ^[1-9][0-9]*$ && $perf_records =~ ^[1-9][0-9]*$ && $runs =~ ^[1-9][0-9]*$ ]] \
  || die "--records, --perf-records and --runs take a positive number"
wants() { [[ ,$only, == *,$1,* ]]; }
for m in ${delivery//,/ }; do
  [[ $m == exactly-once || $m == at-least-once ]] || die "--delivery takes exactly-once and/or at-least-once, not $m"
done

# --- what it needs --------------------------------------------------------------------------
command -v java >/dev/null || die "needs java (17+): scripts/install-deps.sh"
stack_env=$("$REPO/scripts/services.sh" env 2>/dev/null) || true
[[ -n $stack_env ]] && eval "$stack_env"
BROKERS=${CAUDAL_KAFKA_BROKERS:-}
REGISTRY=${CAUDAL_SCHEMA_REGISTRY:-}
broker1=${BROKERS%%,*}
if [[ -z $BROKERS || -z $REGISTRY ]] || ! (exec 3<>"/dev/tcp/${broker1%:*}/${broker1##*:}") 2>/dev/null; then
  die "the test stack is not up (no broker at ${BROKERS:-?}): start it with scripts/services.sh start"
fi
need_bins=("$BIN/temperature")
wants caudal && need_bins+=("$BIN/kafka_pipeline")
for b in "${need_bins[@]}"; do
  [[ -x $b ]] || die "no $b; build Caudal first (this script does not):
  cargo build --release -p caudal-jobs --bin temperature -p caudal-benches --bin kafka_pipeline"
done
[[ -f $KAFKA/libs/kafka-clients-$KAFKA_VERSION.jar ]] \
  || die "no Kafka install at $KAFKA (scripts/services.sh start kafka makes it)"
mkdir -p "$LOGS"

# Kafka's tools (TopicCommand, GetOffsetShell, the perf tools) are in kafka-tools, which the
# test stack's broker install leaves out: fetched once from Maven into the cache.
tools_jar=$CACHE/kafka-tools-$KAFKA_VERSION/kafka-tools-$KAFKA_VERSION.jar
if [[ ! -f $tools_jar ]]; then
  command -v mvn >/dev/null || die "needs mvn to fetch kafka-tools: scripts/install-deps.sh"
  say "fetching org.apache.kafka:kafka-tools:$KAFKA_VERSION (Maven; cached in $M2)"
  mvn -B -q -s "$REPO/scripts/maven-settings.xml" -Dmaven.repo.local="$M2" \
    org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy \
    -Dartifact="org.apache.kafka:kafka-tools:$KAFKA_VERSION:jar" -DoutputDirectory="${tools_jar%/*}" \
    >"$LOGS/kafka-tools-fetch.log" 2>&1 || { tail -n 20 "$LOGS/kafka-tools-fetch.log" >&2; die "fetching kafka-tools failed"; }
fi
kafka_tool() { local tool=$1; shift; java -Xmx512m -cp "$KAFKA/libs/*:$tools_jar" "org.apache.kafka.tools.$tool" "$@"; }

# NAME CMD...: stdout to $LOGS/NAME.out, stderr to $LOGS/NAME.err; the command's user + system
# CPU-seconds (its whole process) to $LOGS/NAME.cpu.
timed() {
  local name=$1 TIMEFORMAT='%U %S'; shift
  if ! { time "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.err"; } 2>"$LOGS/$name.time"; then
    tail -n 30 "$LOGS/$name.err" >&2
    die "$name failed (logs: $LOGS/$name.out, $LOGS/$name.err)"
  fi
  awk '{ print $1 + $2 }' "$LOGS/$name.time" >"$LOGS/$name.cpu"
}

# The Flink job, built like benches/flink/run.sh does (a copy under the cache, jars in $M2).
flink_build() {
  local want app=$FLINK_WORK/app
  want=$( (cd "$HERE/flink" && find pom.xml src -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1)
  if [[ -f $app/flink-temperature-bench-1.jar && $(cat "$app/.stamp" 2>/dev/null) == "$want" ]]; then
    return 0
  fi
  command -v mvn >/dev/null || die "needs mvn: scripts/install-deps.sh"
  say "building benches/flink (Maven; jars cached in $M2)"
  rm -rf "$FLINK_WORK/build" "$app.tmp"; mkdir -p "$FLINK_WORK/build"
  cp -r "$HERE/flink/pom.xml" "$HERE/flink/src" "$FLINK_WORK/build/"
  if ! nice -n 10 mvn -B -q -s "$REPO/scripts/maven-settings.xml" -Dmaven.repo.local="$M2" \
      -f "$FLINK_WORK/build/pom.xml" -Dlibs.dir="$app.tmp/libs" package >"$FLINK_WORK/build.log" 2>&1; then
    grep -E 'ERROR' "$FLINK_WORK/build.log" | head -n 15 >&2 || tail -n 30 "$FLINK_WORK/build.log" >&2
    die "Maven build failed (log: $FLINK_WORK/build.log)"
  fi
  cp "$FLINK_WORK/build/target/flink-temperature-bench-1.jar" "$app.tmp/"
  rm -rf "$app"; mv "$app.tmp" "$app"; rm -rf "$FLINK_WORK/build"
  echo "$want" >"$app/.stamp"
}
wants flink && flink_build

# --- the input, once ------------------------------------------------------------------------
input=side-by-side-in-$records-$$
cleanup() {
  [[ $keep == 1 ]] && { say "topics kept: $input*"; return 0; }
  kafka_tool TopicCommand --bootstrap-server "$BROKERS" --delete --topic "$input.*" \
    >"$LOGS/delete-topics.log" 2>&1 || say "could not delete the topics $input* (log: $LOGS/delete-topics.log)"
}
trap cleanup EXIT
kafka_tool TopicCommand --bootstrap-server "$BROKERS" --create --topic "$input" --partitions 4 \
  --replication-factor 1 >"$LOGS/create-topic.log" 2>&1 || { cat "$LOGS/create-topic.log" >&2; die "creating $input failed"; }
say "producing $records readings into $input (4 partitions)"
t0=$(date +%s.%N)
timed produce "$BIN/temperature" produce --topic "$input" --sensors 1000 --rate 0 --records "$records" \
  --seed 1 --event-interval-ms 100 --brokers "$BROKERS" --schema-registry "$REGISTRY"
say "produced in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
in_topic=$(kafka_tool GetOffsetShell --bootstrap-server "$BROKERS" --topic "$input" --time -1 2>"$LOGS/offsets.err" \
  | awk -F: '{ n += $3 } END { print n + 0 }')
[[ $in_topic == "$records" ]] || die "$input holds $in_topic records, not $records (log: $LOGS/produce.err)"

rows=()   # "what|records/s|records per CPU-second"
add_row() { rows+=("$1|$2|$3"); printf '  %-58s %12s %14s\n' "$1" "$2" "$3" >&2; }
mode_name() { case $1 in AtLeastOnce) echo at-least-once ;; ExactlyOnce) echo exactly-once ;; *) echo "$1" ;; esac; }

# --- Caudal ---------------------------------------------------------------------------------
# kafka_pipeline names its output topics <input>-out-<mode>-<run>, the same for every
# parallelism: before the next parallelism the last one's are deleted (and gone).
drop_caudal_outputs() {
  local i topics
  kafka_tool TopicCommand --bootstrap-server "$BROKERS" --delete --topic "$input-out-.*" >>"$LOGS/delete-topics.log" 2>&1 || true
  for ((i = 0; i < 30; i++)); do
    topics=$(kafka_tool TopicCommand --bootstrap-server "$BROKERS" --list 2>/dev/null) || topics=unknown
    [[ $topics == unknown ]] || grep -q "^$input-out-" <<<"$topics" || return 0
    sleep 2
  done
  die "the topics $input-out-* are still there 60 s after their deletion"
}
if wants caudal; then
  caudal_modes=()
  [[ ,$delivery, == *,at-least-once,* ]] || caudal_modes=(--exactly-once-only)
  first=1
  for p in ${parallelism//,/ }; do
    [[ $first == 1 ]] || drop_caudal_outputs
    first=0
    say "Caudal, p=$p"
    timed "caudal-p$p" "$BIN/kafka_pipeline" --input-topic "$input" --records "$records" --parallelism "$p" \
      --runs "$runs" --checkpoint-interval "$checkpoint" "${caudal_modes[@]}" \
      --brokers "$BROKERS" --schema-registry "$REGISTRY"
    # Rows of kafka_pipeline: MODE RUN RECORDS/S RECORDS/CPU-S (MODE as Rust's Debug: ExactlyOnce).
    found=0
    while read -r mode run rate per_cpu; do
      mode=$(mode_name "$mode")
      [[ ,$delivery, == *,$mode,* ]] || continue
      add_row "Caudal $mode, p=$p (run $run)" "$rate" "$per_cpu"; found=1
    done < <(awk '$1 ~ /^(AtLeastOnce|ExactlyOnce)$/ && NF == 4 { print $1, $2, $3, $4 }' "$LOGS/caudal-p$p.out")
    [[ $found == 1 ]] || { cat "$LOGS/caudal-p$p.out" >&2; die "no result rows in kafka_pipeline's output"; }
  done
fi

# --- Flink ----------------------------------------------------------------------------------
if wants flink; then
  app=$FLINK_WORK/app
  for p in ${parallelism//,/ }; do
    say "Flink 2.3, p=$p"
    # shellcheck disable=SC2086  # FLINK_BENCH_JAVA_OPTS is a list of options
    timed "flink-p$p" java -Xmx"$xmx" ${FLINK_BENCH_JAVA_OPTS:-} \
      -cp "$app/flink-temperature-bench-1.jar:$app/libs/*" dev.caudal.bench.flink.KafkaPipelineBench \
      --input-topic "$input" --records "$records" --parallelism "$p" --delivery "$delivery" --runs "$runs" \
      --checkpoint-interval "$checkpoint" --warmup-runs 1 --brokers "$BROKERS" --schema-registry "$REGISTRY"
    # Rows: flink MODE P RECORDS SECS RECORDS/S RECORDS/CPU-S; "#" lines: net runtime, checkpoints.
    found=0 n=0
    while read -r mode rate per_cpu; do
      add_row "Flink 2.3 $mode, p=$p (run $((n++ % runs)))" "$rate" "$per_cpu"; found=1
    done < <(awk '$1 == "flink" && NF == 7 { print $2, $6, $7 }' "$LOGS/flink-p$p.out")
    [[ $found == 1 ]] || { cat "$LOGS/flink-p$p.out" >&2; die "no result rows in KafkaPipelineBench's output"; }
    grep '^#' "$LOGS/flink-p$p.out" | sed 's/^/  /' >&2 || true
  done
fi

# --- Kafka's own tools ----------------------------------------------------------------------
if wants kafka; then
  say "Kafka ConsumerPerformance (read_committed) over $input"
  printf 'isolation.level=read_committed\nauto.offset.reset=earliest\n' >"$LOGS/consumer.properties"
  timed consumer-perf kafka_tool ConsumerPerformance --bootstrap-server "$BROKERS" --topic "$input" \
    --messages "$records" --group "$input-perf-consumer" --timeout 60000 --consumer.config "$LOGS/consumer.properties"
  # One CSV line: start, end, MB, MB/s, records, records/s, rebalance ms, fetch ms, fetch MB/s, fetch records/s.
  IFS=, read -r _ _ mb _ consumed rate _ _ _ fetch_rate < <(grep -E '^[0-9]{4}-' "$LOGS/consumer-perf.out" | tail -n1 | tr -d ' ')
  [[ ${consumed:-0} -gt 0 ]] || { cat "$LOGS/consumer-perf.out" >&2; die "no result line from ConsumerPerformance"; }
  cpu=$(cat "$LOGS/consumer-perf.cpu")
  add_row "Kafka ConsumerPerformance, read_committed, 1 consumer" "${rate%.*}" \
    "$(awk -v n="$consumed" -v c="$cpu" 'BEGIN { printf "%.0f", n / (c > 0.001 ? c : 0.001) }')"
  # The average size of an input record (key + value bytes, as ConsumerPerformance counts them).
  size=$(awk -v mb="$mb" -v n="$consumed" 'BEGIN { s = mb * 1048576 / n; printf "%.0f", s < 1 ? 1 : s }')
  say "  $consumed records, ${size} bytes per record on average; fetch-only rate ${fetch_rate%.*} records/s"

  say "Kafka ProducerPerformance: $perf_records records of $size bytes, transactional (1 s), acks=all, lz4"
  kafka_tool TopicCommand --bootstrap-server "$BROKERS" --create --topic "$input-perf" --partitions 2 \
    --replication-factor 1 >>"$LOGS/create-topic.log" 2>&1 || { cat "$LOGS/create-topic.log" >&2; die "creating $input-perf failed"; }
  timed producer-perf kafka_tool ProducerPerformance --topic "$input-perf" --num-records "$perf_records" \
    --throughput -1 --record-size "$size" --transactional-id "$input-perf-$$" --transaction-duration-ms 1000 \
    --producer-props bootstrap.servers="$BROKERS" acks=all compression.type=lz4 linger.ms=5
  # Last line: "N records sent, R records/sec (M MB/sec), ... ms avg latency, ...".
  rate=$(awk '/records sent,/ { r = $4 } END { printf "%.0f", r }' "$LOGS/producer-perf.out")
  [[ ${rate:-0} -gt 0 ]] || { cat "$LOGS/producer-perf.out" >&2; die "no result line from ProducerPerformance"; }
  cpu=$(cat "$LOGS/producer-perf.cpu")
  add_row "Kafka ProducerPerformance, transactional 1 s, ${size} B records" "$rate" \
    "$(awk -v n="$perf_records" -v c="$cpu" 'BEGIN { printf "%.0f", n / (c > 0.001 ? c : 0.001) }')"
fi

# --- the table ------------------------------------------------------------------------------
echo "# $records readings (1000 sensors, seed 1) in $input, 4 partitions; checkpoint every ${checkpoint} s;" \
  "$(nproc) cores; $(uptime | sed 's/.*load average/load average/'); $(date -u +%Y-%m-%dT%H:%MZ)"
echo "# Kafka tools: records/s as they report it; CPU of their whole JVM (start included)."
echo
echo "| what | records/s | records per CPU-second |"
echo "|---|---|---|"
for r in "${rows[@]}"; do
  IFS='|' read -r what rate per_cpu <<<"$r"
  echo "| $what | $rate | $per_cpu |"
done
