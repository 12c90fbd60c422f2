#!/usr/bin/env bash
# Generated readings → °C → anomaly filter → Flink's Iceberg sink, on Apache Flink 2.1 with
# Iceberg 1.11.0 (local MiniCluster), for the side-by-side comparison with Caudal's
# `serve_sinks --mode iceberg` (issue #15). Not run by the test suite or CI.
#
#   benches/flink-iceberg/run.sh [--records N] [--parallelism P[,P...]]
#                                [--checkpoint-interval SECS[,SECS...]] [--runs N]
#                                [--sink flink|iceberg] [--sensors N] [--warmup-records N]
#                                [--xmx SIZE]
#
# Needs the test stack's PostgreSQL (scripts/services.sh start postgres): the table is made
# fresh per run in Iceberg's JDBC catalog there (catalog name flink_bench, namespace
# bench_flink_<n>), partitioned by day(ts), with Caudal's schema, Parquet/Snappy, 128 MiB target
# files, in a local warehouse (a temporary directory, HadoopFileIO), and dropped afterwards.
# Exactly-once checkpoints every --checkpoint-interval seconds (default 1,60), parallelism
# (default 1,2), each configuration --runs times (default 2), one JVM per run; a "#" line per
# run gives the load average before it, Flink's net job runtime and the whole JVM's CPU and
# max RSS (/usr/bin/time). --sink flink is FlinkSink (default), iceberg the Sink-v2 IcebergSink.
#
# Builds once (Maven, in a copy under ~/.cache/caudal/flink-iceberg-bench with a copy of
# benches/flink, whose generator it compiles; jars in ~/.cache/caudal/m2; rebuilt when either
# changes). Extra JVM options: FLINK_BENCH_JAVA_OPTS.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${CAUDAL_CACHE:-$HOME/.cache/caudal}
WORK=$CACHE/flink-iceberg-bench
M2=$CACHE/m2

records=30000000 sensors=10000 parallelism=1,2 intervals=1,60 runs=2 sink=flink warmup=2000000 xmx=1g
die() { printf 'flink-iceberg bench: %s\n' "$*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  [[ $1 == -h || $1 == --help ]] && { usage; exit 0; }
  [[ $# -ge 2 ]] || die "$1 needs a value"
  case $1 in
    --records) records=$2 ;;
    --sensors) sensors=$2 ;;
    --parallelism) parallelism=$2 ;;
    --checkpoint-interval) intervals=$2 ;;
    --runs) runs=$2 ;;
    --sink) sink=$2 ;;
    --warmup-records) warmup=$2 ;;
    --xmx) xmx=$2 ;;
    *) die "unknown flag $1 (see the top of $0)" ;;
  esac
  shift 2
done
command -v java >/dev/null && command -v mvn >/dev/null || die "needs java (17+) and mvn: scripts/install-deps.sh"

# The stack's PostgreSQL, as JDBC (postgres://USER@HOST:PORT/DB).
if [[ -z ${CAUDAL_POSTGRES_URL:-} ]]; then
  eval "$("$REPO/scripts/services.sh" env 2>/dev/null)" || true
fi
[[ ${CAUDAL_POSTGRES_URL:-} =~ ^postgres(ql)?://([^@/]+)@([^/]+)/(.+)$ ]] \
  || die "CAUDAL_POSTGRES_URL (postgres://USER@HOST:PORT/DB) not set: scripts/services.sh start postgres"
jdbc_user=${BASH_REMATCH[2]} jdbc_url="jdbc:postgresql://${BASH_REMATCH[3]}/${BASH_REMATCH[4]}"

src_hash() {
  (cd "$HERE/.." && find flink-iceberg/pom.xml flink-iceberg/src flink/src -type f -print0 | sort -z \
    | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1
}

build() {
  local want app=$WORK/app
  want=$(src_hash)
  if [[ -f $app/flink-iceberg-bench-1.jar && $(cat "$app/.stamp" 2>/dev/null) == "$want" ]]; then
    return 0
  fi
  echo "flink-iceberg bench: building benches/flink-iceberg (Maven; jars cached in $M2)" >&2
  rm -rf "$WORK/build" "$app.tmp"; mkdir -p "$WORK/build/flink-iceberg" "$WORK/build/flink"
  cp -r "$HERE/pom.xml" "$HERE/src" "$WORK/build/flink-iceberg/"
  cp -r "$HERE/../flink/src" "$WORK/build/flink/"
  if ! nice -n 10 mvn -B -q -s "$REPO/scripts/maven-settings.xml" -Dmaven.repo.local="$M2" \
      -f "$WORK/build/flink-iceberg/pom.xml" -Dlibs.dir="$app.tmp/libs" package >"$WORK/build.log" 2>&1; then
    grep -E 'ERROR' "$WORK/build.log" | head -n 15 >&2 || tail -n 30 "$WORK/build.log" >&2
    die "Maven build failed (log: $WORK/build.log)"
  fi
  cp "$WORK/build/flink-iceberg/target/flink-iceberg-bench-1.jar" "$app.tmp/"
  rm -rf "$app"; mv "$app.tmp" "$app"; rm -rf "$WORK/build"
  echo "$want" >"$app/.stamp"
}
build

app=$WORK/app
timing=$(mktemp); trap 'rm -f "$timing"' EXIT
header=()
echo "# Apache Flink 2.1.0 + Iceberg 1.11.0 ($sink sink), local MiniCluster, $(java -version 2>&1 | head -n1), -Xmx$xmx, warm-up $warmup rows, $records rows, JDBC catalog $jdbc_url"
for interval in ${intervals//,/ }; do
  for p in ${parallelism//,/ }; do
    for ((run = 1; run <= runs; run++)); do
      load=$(uptime | sed 's/.*load average: //')
      timer=()
      [[ -x /usr/bin/time ]] && timer=(/usr/bin/time -v -o "$timing")
      # shellcheck disable=SC2086  # FLINK_BENCH_JAVA_OPTS is a list of options
      "${timer[@]}" java -Xmx"$xmx" ${FLINK_BENCH_JAVA_OPTS:-} \
        -cp "$app/flink-iceberg-bench-1.jar:$app/libs/*" dev.caudal.bench.flink.IcebergBench \
        --jdbc-url "$jdbc_url" --jdbc-user "$jdbc_user" --records "$records" --sensors "$sensors" \
        --parallelism "$p" --checkpoint-interval "$interval" --sink "$sink" --warmup-records "$warmup" \
        "${header[@]}" 2>"$WORK/last-run.log" \
        || { tail -n 30 "$WORK/last-run.log" >&2; die "run failed (p=$p, checkpoint ${interval}s; log: $WORK/last-run.log)"; }
      header=(--no-header)
      if [[ ${#timer[@]} -gt 0 ]]; then
        awk -F': ' -v load="$load" '/User time/ {u=$2} /System time/ {s=$2} /Maximum resident/ {r=$2}
          END {printf "#   load before: %s; whole JVM (start, warm-up included): %.1f CPU-s, max RSS %d MB\n", load, u+s, r/1024}' "$timing"
      fi
    done
  done
done
