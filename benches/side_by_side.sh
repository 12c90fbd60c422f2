#!/usr/bin/env bash
# One row of the throughput table, Caudal against Apache Flink 2.3, run in pairs: each round
# runs the pipeline once on Flink (benches/flink/run.sh, one JVM with its warm-up job) and once
# on Caudal (target/release/throughput --child), a pause before each run, and prints both
# times and their ratio. On a shared machine a single run's time moves by a third for either
# engine; a pair taken within seconds of each other sees the same machine, and the median of
# the pairs' ratios is the figure to quote (with the spread). The engines take turns going
# first (Flink in odd rounds, Caudal in even ones): a run right after the other engine's is
# slower more often, and always the same engine second would charge that to it alone.
#
#   benches/side_by_side.sh [--pipeline count|timers|alerts|temperature] [--records N]
#                           [--sensors N] [--state heap|rocksdb] [--parallelism P]
#                           [--rounds N] [--pause SECS]
#
# Defaults: the count pipeline, 20,000,000 readings, 10,000 sensors, heap state, p=1, 8 rounds,
# a 5 s pause before every run.
# Flink's time is its net job runtime (JobExecutionResult.getNetRuntime(): no JVM start, no
# MiniCluster start or stop); Caudal's is the wall clock around execute(), its job start and
# stop included. Never builds Caudal: run `cargo build --release -p caudal-benches --bin
# throughput` first. Flink's job is built by benches/flink/run.sh (Maven, once). Not part of
# the tests or CI.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CAUDAL=$REPO/target/release/throughput

pipeline=count records=20000000 sensors=10000 state=heap parallelism=1 rounds=8 pause=5
die() { printf 'side by side: %s\n' "$*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  [[ $1 == -h || $1 == --help ]] && { usage; exit 0; }
  [[ $# -ge 2 ]] || die "$1 needs a value"
  case $1 in
    --pipeline) pipeline=$2 ;;
    --records) records=$2 ;;
    --sensors) sensors=$2 ;;
    --state) state=$2 ;;
    --parallelism) parallelism=$2 ;;
    --rounds) rounds=$2 ;;
    --pause) pause=$2 ;;
    *) die "unknown flag $1 (see the top of $0)" ;;
  esac
  shift 2
done
[[ $pipeline =~ ^(count|timers|alerts|temperature)$ ]] || die "--pipeline: count, timers, alerts or temperature, not $pipeline"
[[ $state =~ ^(heap|rocksdb)$ ]] || die "--state: heap or rocksdb, not $state"
for n in "$records" "$sensors" "$parallelism" "$rounds" "$pause"; do
  [[ $n =~ ^[0-9]+$ ]] || die "expected a whole number, got $n"
done
[[ -x $CAUDAL ]] || die "no $CAUDAL: cargo build --release -p caudal-benches --bin throughput"

flink_net() {
  "$HERE/flink/run.sh" --pipeline "$pipeline" --records "$records" --sensors "$sensors" \
    --state "$state" --parallelism "$parallelism" |
    sed -n 's/.*flink job net runtime \([0-9.]*\) s.*/\1/p'
}
caudal_secs() {
  "$CAUDAL" --child --pipeline "$pipeline" --records "$records" --sensors "$sensors" \
    --state-backend "$state" --parallelism "$parallelism" | sed -n 's/.*"seconds":\([0-9.]*\).*/\1/p'
}

# One run of each, a pause before it; the time goes to $f or $c.
run_flink() {
  sleep "$pause"
  f=$(flink_net)
  [[ -n $f ]] || die "Flink printed no net runtime (log: ${CAUDAL_CACHE:-$HOME/.cache/caudal}/flink-bench/last-run.log)"
}
run_caudal() {
  sleep "$pause"
  c=$(caudal_secs)
  [[ -n $c ]] || die "Caudal printed no time"
}

echo "# $pipeline, $records readings, $sensors sensors, $state state, p=$parallelism; tree $(git -C "$REPO" describe --always --dirty 2>/dev/null || echo '?'); $(uptime | sed 's/.*load average/load average/')"
printf '%-9s %-7s %12s %10s %7s\n' "UTC" "first" "flink net s" "caudal s" "ratio"
ratios=()
for round in $(seq "$rounds"); do
  if (( round % 2 )); then first=flink; run_flink; run_caudal; else first=caudal; run_caudal; run_flink; fi
  r=$(awk -v f="$f" -v c="$c" 'BEGIN { printf "%.2f", f / c }')
  ratios+=("$r")
  printf '%-9s %-7s %12s %10s %6sx\n' "$(date -u +%H:%M:%S)" "$first" "$f" "$c" "$r"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ a[NR] = $1 }
  END { m = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
        printf "# ratio (Flink net / Caudal) over %d rounds: median %.2fx, min %.2fx, max %.2fx\n", NR, m, a[1], a[NR] }'
