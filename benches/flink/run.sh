#!/usr/bin/env bash
# The temperature pipeline and the keyed-process-function pipelines on Apache Flink 2.3
# (local MiniCluster), for the side-by-side comparison with Caudal's throughput runner
# (benches/src/bin/throughput.rs, same --pipeline names). Not run by the test suite or CI.
#
#   benches/flink/run.sh [--pipeline temperature|count|timers|alerts[,...]]
#                        [--records N] [--sensors N] [--parallelism P[,P...]]
#                        [--state heap|rocksdb[,...]] [--checkpoint-interval SECS]
#                        [--warmup-records N] [--xmx SIZE] [--conf flink.key=value ...]
#
# --pipeline (default temperature) picks the runner's pipeline of the same name:
#   temperature  generator → °C → filter → key by sensor → 1-minute windows → sink (and the
#                readings → sink)
#   count        generator → key by sensor → KeyedProcessFunction: a running count per sensor
#                in ValueState<Long>, read-modify-write per record, emits nothing → sink
#   timers       generator → key by sensor → KeyedProcessFunction: an event-time timer at
#                ts + 60 s per record, one output per firing → sink (all fire: one per record)
#   alerts       temperature plus, on the °C stream, key by sensor → the silent-sensor detector
#                (30 s of silence: two ValueStates, a timer moved per record) → sink
#
# Builds once (Maven, in a copy under ~/.cache/caudal/flink-bench; jars in ~/.cache/caudal/m2;
# rebuilt when benches/flink changes), then runs one JVM per configuration and prints the
# runner's table: records/s, records/s per CPU-core-second, CPU-seconds per million records
# and peak RSS, measured like Caudal's (wall clock and /proc CPU around the job's execute(),
# VmHWM). Before the measured job the same JVM runs a warm-up job (--warmup-records, default
# 2,000,000; 0 = none) so the measured one runs JIT-compiled code in a started JVM. A "#" line
# per run gives Flink's own net job runtime and the whole JVM process's CPU and max RSS
# (/usr/bin/time), startup and warm-up included. Extra JVM options: FLINK_BENCH_JAVA_OPTS.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${CAUDAL_CACHE:-$HOME/.cache/caudal}
WORK=$CACHE/flink-bench
M2=$CACHE/m2

pipelines=temperature records=20000000 sensors=10000 parallelism=1,2 states=heap checkpoint=0 warmup=2000000 xmx=1g
conf=()
die() { printf 'flink bench: %s\n' "$*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  [[ $1 == -h || $1 == --help ]] && { usage; exit 0; }
  [[ $# -ge 2 ]] || die "$1 needs a value"
  case $1 in
    --pipeline) pipelines=$2 ;;
    --records) records=$2 ;;
    --sensors) sensors=$2 ;;
    --parallelism) parallelism=$2 ;;
    --state) states=$2 ;;
    --checkpoint-interval) checkpoint=$2 ;;
    --warmup-records) warmup=$2 ;;
    --xmx) xmx=$2 ;;
    --conf) conf+=(--conf "$2") ;;
    *) die "unknown flag $1 (see the top of $0)" ;;
  esac
  shift 2
done

for pl in ${pipelines//,/ }; do
  [[ $pl =~ ^(temperature|count|timers|alerts)$ ]] || die "--pipeline: temperature, count, timers or alerts, not $pl"
done
command -v java >/dev/null && command -v mvn >/dev/null || die "needs java (17+) and mvn: scripts/install-deps.sh"

src_hash() { (cd "$HERE" && find pom.xml src -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1; }

build() {
  local want app=$WORK/app
  want=$(src_hash)
  if [[ -f $app/flink-temperature-bench-1.jar && $(cat "$app/.stamp" 2>/dev/null) == "$want" ]]; then
    return 0
  fi
  echo "flink bench: building benches/flink (Maven; jars cached in $M2)" >&2
  rm -rf "$WORK/build" "$app.tmp"; mkdir -p "$WORK/build"
  cp -r "$HERE/pom.xml" "$HERE/src" "$WORK/build/"
  if ! nice -n 10 mvn -B -q -s "$REPO/scripts/maven-settings.xml" -Dmaven.repo.local="$M2" \
      -f "$WORK/build/pom.xml" -Dlibs.dir="$app.tmp/libs" package >"$WORK/build.log" 2>&1; then
    grep -E 'ERROR' "$WORK/build.log" | head -n 15 >&2 || tail -n 30 "$WORK/build.log" >&2
    die "Maven build failed (log: $WORK/build.log)"
  fi
  cp "$WORK/build/target/flink-temperature-bench-1.jar" "$app.tmp/"
  rm -rf "$app"; mv "$app.tmp" "$app"; rm -rf "$WORK/build"
  echo "$want" >"$app/.stamp"
}
build

app=$WORK/app
timing=$(mktemp); trap 'rm -f "$timing"' EXIT
header=()
echo "# Apache Flink 2.3.0, local MiniCluster, $(java -version 2>&1 | head -n1), -Xmx$xmx, warm-up $warmup records${conf[*]:+, ${conf[*]}}; load: $(uptime | sed 's/.*load average/load average/')"
for pl in ${pipelines//,/ }; do
  for p in ${parallelism//,/ }; do
    for state in ${states//,/ }; do
      timer=()
      [[ -x /usr/bin/time ]] && timer=(/usr/bin/time -v -o "$timing")
      # shellcheck disable=SC2086  # FLINK_BENCH_JAVA_OPTS is a list of options
      "${timer[@]}" java -Xmx"$xmx" ${FLINK_BENCH_JAVA_OPTS:-} \
        -cp "$app/flink-temperature-bench-1.jar:$app/libs/*" dev.caudal.bench.flink.TemperatureBench \
        --pipeline "$pl" --records "$records" --sensors "$sensors" --parallelism "$p" --state "$state" \
        --checkpoint-interval "$checkpoint" --warmup-records "$warmup" "${conf[@]}" "${header[@]}" 2>"$WORK/last-run.log" \
        || { tail -n 30 "$WORK/last-run.log" >&2; die "run failed ($pl, p=$p, state=$state; log: $WORK/last-run.log)"; }
      header=(--no-header)
      if [[ ${#timer[@]} -gt 0 ]]; then
        awk -F': ' '/User time/ {u=$2} /System time/ {s=$2} /Maximum resident/ {r=$2}
          END {printf "#   whole JVM process (start, warm-up, MiniCluster included): %.1f CPU-s, max RSS %d MB\n", u+s, r/1024}' "$timing"
      fi
    done
  done
done
