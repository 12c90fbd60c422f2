#!/usr/bin/env bash
# Generated readings → °C → anomaly filter → an Iceberg table: Caudal's `serve_sinks --mode
# iceberg` and the same pipeline on Apache Flink 2.1 with Flink's Iceberg sink (Iceberg 1.11.0,
# local MiniCluster), interleaved, for the side-by-side comparison of issue #15. Not run by the
# test suite or CI.
#
#   benches/flink-iceberg/run.sh [--records N] [--parallelism P[,P...]]
#                                [--checkpoint-interval SECS[,SECS...]] [--runs N]
#                                [--engines caudal,flink] [--sink iceberg|flink] [--sensors N]
#                                [--warmup-records N] [--xmx SIZE]
#
# Needs the test stack's PostgreSQL (scripts/services.sh start postgres) and, for Caudal, the
# release serve_sinks under ${CARGO_TARGET_DIR:-target}/release, which this script does not build:
#   cargo build --release -p caudal-benches --bin serve_sinks
# Flink's table is made fresh per run in Iceberg's JDBC catalog there (catalog name flink_bench,
# namespace bench_flink_<n>), partitioned by day(ts), with Caudal's schema, Parquet/Snappy,
# 128 MiB target files, in a local warehouse (a temporary directory, HadoopFileIO), and dropped
# afterwards; serve_sinks makes its table in catalog caudal (namespace bench_lake_<n>) of the same
# database and deletes its warehouse afterwards.
# Exactly-once checkpoints every --checkpoint-interval seconds (default 1,60), parallelism
# (default 1,2), each configuration --runs times (default 2), one process per run, the engines
# one after the other. Each run prints the load average before it and the whole process's CPU
# and max RSS (/usr/bin/time); Flink's rows also give CPU around execute() and the net job
# runtime. --sink iceberg (default) is Iceberg's Sink-v2 IcebergSink, --sink flink the older
# FlinkSink (it lost rows at parallelism 2 here: see benches/README.md).
#
# Builds Flink's side once (Maven, in a copy under ~/.cache/caudal/flink-iceberg-bench with a
# copy of benches/flink, whose generator it compiles; jars in ~/.cache/caudal/m2; rebuilt when
# either changes). Extra JVM options: FLINK_BENCH_JAVA_OPTS.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${CAUDAL_CACHE:-$HOME/.cache/caudal}
WORK=$CACHE/flink-iceberg-bench
M2=$CACHE/m2

records=30000000 sensors=10000 parallelism=1,2 intervals=1,60 runs=2 engines=caudal,flink sink=iceberg
warmup=2000000 xmx=1g
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
    --engines) engines=$2 ;;
    --sink) sink=$2 ;;
    --warmup-records) warmup=$2 ;;
    --xmx) xmx=$2 ;;
    *) die "unknown flag $1 (see the top of $0)" ;;
  esac
  shift 2
done
command -v java >/dev/null && command -v mvn >/dev/null || die "needs java (17+) and mvn: scripts/install-deps.sh"
BIN=${CARGO_TARGET_DIR:-$REPO/target}/release
if [[ ,$engines, == *,caudal,* && ! -x $BIN/serve_sinks ]]; then
  die "no $BIN/serve_sinks: cargo build --release -p caudal-benches --bin serve_sinks"
fi

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
[[ ,$engines, != *,flink,* ]] || build

app=$WORK/app
timing=$(mktemp); trap 'rm -f "$timing"' EXIT
whole() { # the whole process's CPU and max RSS, from /usr/bin/time -v
  awk -F': ' -v load="$1" '/User time/ {u=$2} /System time/ {s=$2} /Maximum resident/ {r=$2}
    END {printf "#   load before: %s; whole process: %.1f CPU-s, max RSS %d MB\n", load, u+s, r/1024}' "$timing"
}
# The module openings Flink's own launcher gives every JVM (env.java.opts.all of its default
# config.yaml): at p > 1 the writers' results cross to the committer through Kryo, which reaches
# into java.nio's ByteBuffer (Iceberg's column bounds).
jvm_opens=()
for pkg in java.lang java.net java.io java.nio sun.nio.ch java.lang.reflect java.text java.time java.util \
    java.util.concurrent java.util.concurrent.atomic java.util.concurrent.locks; do
  jvm_opens+=(--add-opens="java.base/$pkg=ALL-UNNAMED")
done
timer=()
[[ -x /usr/bin/time ]] && timer=(/usr/bin/time -v -o "$timing")
header=()
echo "# $records rows, $sensors sensors; Caudal: $BIN/serve_sinks; Flink: Apache Flink 2.1.0 + Iceberg 1.11.0 ($sink sink), local MiniCluster, $(java -version 2>&1 | head -n1), -Xmx$xmx, warm-up $warmup rows, JDBC catalog $jdbc_url"
for interval in ${intervals//,/ }; do
  for p in ${parallelism//,/ }; do
    for ((run = 1; run <= runs; run++)); do
      for engine in ${engines//,/ }; do
        load=$(uptime | sed 's/.*load average: //')
        case $engine in
          caudal)
            "${timer[@]}" "$BIN/serve_sinks" --mode iceberg --records "$records" --sensors "$sensors" \
              --parallelism "$p" --checkpoint-interval "$interval" 2>"$WORK/last-caudal.log" \
              || { tail -n 30 "$WORK/last-caudal.log" >&2; die "Caudal run failed (p=$p, checkpoint ${interval}s)"; } ;;
          flink)
            # shellcheck disable=SC2086  # FLINK_BENCH_JAVA_OPTS is a list of options
            "${timer[@]}" java -Xmx"$xmx" "${jvm_opens[@]}" ${FLINK_BENCH_JAVA_OPTS:-} \
              -cp "$app/flink-iceberg-bench-1.jar:$app/libs/*" dev.caudal.bench.flink.IcebergBench \
              --jdbc-url "$jdbc_url" --jdbc-user "$jdbc_user" --records "$records" --sensors "$sensors" \
              --parallelism "$p" --checkpoint-interval "$interval" --sink "$sink" --warmup-records "$warmup" \
              "${header[@]}" 2>"$WORK/last-run.log" \
              || { tail -n 30 "$WORK/last-run.log" >&2; die "Flink run failed (p=$p, checkpoint ${interval}s; log: $WORK/last-run.log)"; }
            header=(--no-header) ;;
          *) die "--engines: caudal and/or flink, not $engine" ;;
        esac
        if [[ ${#timer[@]} -gt 0 ]]; then whole "$load"; fi
      done
    done
  done
done
