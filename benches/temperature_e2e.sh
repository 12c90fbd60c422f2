#!/usr/bin/env bash
# The temperature job end to end from Kafka (issue #14): one input topic of N readings
# (4 partitions, `temperature produce --sensors 10000`), read bounded, windows of 10 s, a
# checkpoint every second, exactly-once; once into two Kafka topics (readings and window
# statistics) and once into PostgreSQL (readings, window statistics and each sensor's latest
# reading upserted), at each parallelism, `--runs` times. Prints records/s over the whole
# process (start included) and its CPU-seconds (user+system). Not run by the tests or CI.
#
#   benches/temperature_e2e.sh [--records N] [--parallelism P[,P...]] [--runs N]
#
# Needs the test stack (scripts/services.sh start) and the release binaries, which it
# builds: temperature, caudal and caudal-topic under ${CARGO_TARGET_DIR:-target}/release.
set -euo pipefail
cd "$(dirname "$0")/.."
records=2000000 parallelism=1,2 runs=2
while [ $# -gt 0 ]; do
  case "$1" in
    --records) records=$2; shift 2 ;;
    --parallelism) parallelism=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
eval "$(scripts/services.sh env)"
cargo build -q --release -p caudal-jobs --bin temperature -p caudal-engine --bin caudal \
  -p caudal-operators --bin caudal-topic
bin=${CARGO_TARGET_DIR:-target}/release
brokers=$CAUDAL_KAFKA_BROKERS registry=$CAUDAL_SCHEMA_REGISTRY
input=e2e-in-$$
"$bin/caudal" topic create "$input" --partitions 4 --brokers "$brokers"
"$bin/temperature" produce --topic "$input" --sensors 10000 --rate 0 --seed 5 --records "$records" \
  --event-interval-ms 100 --brokers "$brokers" --schema-registry "$registry"
printf '%-9s %-3s %-4s %10s %12s %s\n' sink p run secs records/s CPU-s
for p in ${parallelism//,/ }; do
  for run in $(seq 1 "$runs"); do
    for sink in kafka postgres; do
      out=e2e-out-$$-$p-$run-$sink dir=$(mktemp -d)
      if [ "$sink" = kafka ]; then
        to=(--sink kafka --output-topic "$out" --windows-topic "$out-w" --transactional-id-prefix "$out")
      else
        to=(--sink discard --postgres "$CAUDAL_POSTGRES_URL" --postgres-schema "e2e_${p}_${run}_$$")
      fi
      start=$(date +%s.%N)
      /usr/bin/time -o "$dir/cpu" -f "%U+%S" "$bin/temperature" --source kafka --input-topic "$input" \
        --bounded --window-secs 10 --checkpoint-interval 1 --parallelism "$p" --brokers "$brokers" \
        --schema-registry "$registry" --checkpoint-dir "$dir/ckpt" --state-dir "$dir/state" \
        --progress-secs 0 --no-ui "${to[@]}" 2> "$dir/err" || { tail -5 "$dir/err"; exit 1; }
      end=$(date +%s.%N)
      secs=$(echo "$end - $start" | bc)
      printf '%-9s %-3s %-4s %10.2f %12.0f %s\n' "$sink" "$p" "$run" "$secs" \
        "$(echo "$records / $secs" | bc -l)" "$(cat "$dir/cpu")"
      rm -rf "$dir"
    done
  done
done
