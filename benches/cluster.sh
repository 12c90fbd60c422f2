#!/usr/bin/env bash
# Cluster mode figures (issue #5): the temperature pipeline in one process vs. over two task
# managers (key_by shuffle over TCP), and the time from a task manager's SIGKILL to the job
# running again. Loopback, one machine.
#
#   cargo build --release -p caudal-engine -p caudal-jobs -p caudal-benches --bin caudal --bin temperature --bin big_state_job
#   benches/cluster.sh [RECORDS]          # default 5,000,000; CAUDAL_BIN_DIR=target/release
set -euo pipefail
N=${1:-5000000}
# shellcheck source=benches/cluster_env.sh
source "$(dirname "$0")/cluster_env.sh"
secs() { grep -o 'finished in [0-9.]*s' "$1" | tail -1 | grep -o '[0-9.]*'; }

"$BIN/temperature" "${ARGS[@]}" --parallelism 2 --checkpoint-dir "$WORK/ckpt-embedded" 2> "$WORK/embedded.log" >/dev/null
EMB=$(secs "$WORK/embedded.log")

HTTP=$(port); RPC=$(port); URL="http://127.0.0.1:$HTTP"
"$BIN/caudal" jobmanager --bind "127.0.0.1:$HTTP" --rpc-bind "127.0.0.1:$RPC" --checkpoint-dir "$WORK/ckpt" \
  --data-dir "$WORK/jm" --heartbeat-timeout-ms 2000 --restart-backoff-ms 100 2> "$WORK/jm.log" & PIDS+=($!)
sleep 1
declare -A TM_PID
for tm in a b c; do
  "$BIN/caudal" taskmanager --jobmanager "$URL" --slots 1 --name "$tm" --data-dir "$WORK/$tm" 2> "$WORK/$tm.log" & PIDS+=($!)
  TM_PID[$tm]=$!
done
sleep 2
"$BIN/caudal" submit "$BIN/temperature" --jobmanager "$URL" --parallelism 2 --wait -- "${ARGS[@]}" >/dev/null 2>&1
CL=$(cat "$WORK"/[abc].log | grep -o 'finished in [0-9.]*s' | grep -o '[0-9.]*' | sort -n | tail -1)
python3 - "$N" "$EMB" "$CL" <<'PY'
import sys
n, emb, cl = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
print(f"one process, parallelism 2:         {n/emb:12,.0f} records/s ({emb:.1f} s)")
print(f"two task managers, TCP shuffle:      {n/cl:12,.0f} records/s ({cl:.1f} s)")
print(f"throughput ratio cluster/embedded:   {emb/cl:.2f}")
print(f"extra wall time per record (2 procs): {(cl-emb)/n*1e9:,.0f} ns")
PY

# Kill to running again: a throttled job, SIGKILL the task manager of slot 0.
"$BIN/caudal" submit "$BIN/temperature" --jobmanager "$URL" --parallelism 2 -- --records 200000 --rate 200 \
  --sensors 100 --sink discard --checkpoint-interval 1 --no-ui --progress-secs 0 >/dev/null 2>&1
job() { "$BIN/caudal" list --json --jobmanager "$URL"; }
until job | python3 -c 'import json,sys; j=json.load(sys.stdin)[0]; sys.exit(0 if j["status"]=="RUNNING" and j["last_checkpoint"] else 1)'; do sleep 0.1; done
VICTIM=$(job | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["task_managers"][0])')
ATTEMPT=$(job | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["attempt"])')
T0=$(date +%s.%N); kill -9 "${TM_PID[$VICTIM]}"
until job | python3 -c "import json,sys; j=json.load(sys.stdin)[0]; sys.exit(0 if j['status']=='RUNNING' and j['attempt']>$ATTEMPT else 1)"; do sleep 0.05; done
T1=$(date +%s.%N)
python3 -c "print(f'task manager SIGKILL to running again: {($T1-$T0)*1000:.0f} ms (small window state; includes the new task manager fetching the binary)')"

# Kill to processing again with a large state (issue #5: < 10 s with 1 GB restored from local
# disk): big_state_job loads KEYS x VALUE_BYTES (1 GB) into a keyed RocksDB state over two
# subtasks; once a completed checkpoint holds it all, SIGKILL the task manager of slot 0.
KEYS=${CAUDAL_BIG_STATE_KEYS:-1000000}
VALUE_BYTES=${CAUDAL_BIG_STATE_VALUE_BYTES:-1000}
"$BIN/caudal" cancel temperature --jobmanager "$URL" >/dev/null 2>&1 || true
for tm in d e f; do
  "$BIN/caudal" taskmanager --jobmanager "$URL" --slots 1 --name "$tm" --data-dir "$WORK/$tm" 2> "$WORK/$tm.log" & PIDS+=($!)
  TM_PID[$tm]=$!
done
sleep 2
"$BIN/caudal" submit "$BIN/big_state_job" --jobmanager "$URL" --parallelism 2 -- --keys "$KEYS" \
  --value-bytes "$VALUE_BYTES" --checkpoint-interval 2 >/dev/null 2>&1
big() { "$BIN/caudal" list --json --jobmanager "$URL" | python3 -c 'import json,sys; print(json.dumps([j for j in json.load(sys.stdin) if j["name"]=="big-state"][0]))'; }
api() { curl -sf "$URL/api/v1/jobs/big-state/$1"; }
LOAD_T0=$(date +%s.%N)
until api checkpoints | python3 -c "import json,sys; c=json.load(sys.stdin)['latest_completed']; sys.exit(0 if c and c['size_bytes'] >= 0.9*$KEYS*$VALUE_BYTES else 1)"; do sleep 0.5; done
SIZE=$(api checkpoints | python3 -c 'import json,sys; print(json.load(sys.stdin)["latest_completed"]["size_bytes"])')
python3 -c "import time; print(f'big state loaded and checkpointed: {$SIZE/1e6:,.0f} MB in {time.time()-$LOAD_T0:.0f} s')"
VICTIM=$(big | python3 -c 'import json,sys; print(json.load(sys.stdin)["task_managers"][0])')
ATTEMPT=$(big | python3 -c 'import json,sys; print(json.load(sys.stdin)["attempt"])')
in_state() { api metrics | python3 -c 'import json,sys; print(sum(o["records_in"] for o in json.load(sys.stdin)["operators"] if o["name"]=="state"))'; }
T0=$(date +%s.%N); kill -9 "${TM_PID[$VICTIM]}"
until big | python3 -c "import json,sys; j=json.load(sys.stdin); sys.exit(0 if j['status']=='RUNNING' and j['attempt']>$ATTEMPT else 1)"; do sleep 0.05; done
T1=$(date +%s.%N)
R1=$(in_state)
until [[ "$(in_state)" != "$R1" ]]; do sleep 0.05; done
T2=$(date +%s.%N)
RESTORE=$(api metrics | python3 -c 'import json,sys; print(max(o.get("counters",{}).get("state_restore_ms",0) for o in json.load(sys.stdin)["operators"]))')
python3 -c "print(f'{$SIZE/1e6:,.0f} MB of state, task manager SIGKILL to running again: {($T1-$T0):.1f} s; to processing again: {($T2-$T0):.1f} s (state restore, summed over the subtasks: {$RESTORE} ms)')"
