#!/usr/bin/env bash
# The shuffle over mutual TLS next to plain TCP (issue #11): the temperature pipeline at
# parallelism 2 on two task managers of one slot each, so its key_by shuffle crosses
# processes; once with plain TCP and once with every control and data connection over TLS
# (certificates from `caudal certs`). Loopback, one machine; the figure is records/s of the
# whole job (the slower task manager's "finished in").
#
#   cargo build --release -p caudal-engine -p caudal-jobs --bin caudal --bin temperature
#   benches/cluster_tls.sh [RECORDS] [ROUNDS]   # default 5,000,000 records, 2 rounds each
set -euo pipefail
N=${1:-5000000}
ROUNDS=${2:-2}
# shellcheck source=benches/cluster_env.sh
source "$(dirname "$0")/cluster_env.sh"
"$BIN/caudal" certs --out "$WORK/certs" --name jobmanager --name a --name b >/dev/null

# cluster MODE ROUND: starts a job manager and task managers a, b; runs the job; prints seconds.
cluster() {
  local mode=$1 round=$2 dir="$WORK/$1-$2" http rpc tls=()
  mkdir -p "$dir"; http=$(port); rpc=$(port)
  tlsof() { [[ $mode == tls ]] && echo --tls-cert "$WORK/certs/$1.pem" --tls-key "$WORK/certs/$1.key" --tls-ca "$WORK/certs/ca.pem"; true; }
  # shellcheck disable=SC2046
  "$BIN/caudal" jobmanager $(tlsof jobmanager) --bind "127.0.0.1:$http" --rpc-bind "127.0.0.1:$rpc" \
    --checkpoint-dir "$dir/ckpt" --data-dir "$dir/jm" 2> "$dir/jm.log" & PIDS+=($!)
  local jm=$!
  sleep 1
  local tms=()
  for tm in a b; do
    # shellcheck disable=SC2046
    "$BIN/caudal" taskmanager $(tlsof $tm) --jobmanager "http://127.0.0.1:$http" --slots 1 --name "$tm" \
      --data-dir "$dir/$tm" 2> "$dir/$tm.log" & PIDS+=($!); tms+=($!)
  done
  sleep 2
  "$BIN/caudal" submit "$BIN/temperature" --jobmanager "http://127.0.0.1:$http" --parallelism 2 --wait -- "${ARGS[@]}" >/dev/null 2>&1
  cat "$dir"/[ab].log | grep -o 'finished in [0-9.]*s' | grep -o '[0-9.]*' | sort -n | tail -1
  kill "$jm" "${tms[@]}" 2>/dev/null || true
  wait "$jm" "${tms[@]}" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
  for mode in plain tls; do
    s=$(cluster "$mode" "$round")
    python3 -c "print(f'round $round, $mode:'.ljust(18) + f'{$N/$s:12,.0f} records/s ({$s:.1f} s)')"
  done
done
