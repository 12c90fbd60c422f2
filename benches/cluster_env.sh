# Shared by the cluster benchmarks (cluster.sh, cluster_tls.sh; sourced, not run): where the
# release binaries are, a work directory and the processes removed on exit, a free port, and
# the temperature job's flags for a throughput run of N records.
BIN=${CAUDAL_BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ARGS=(--records "$N" --rate 0 --sink discard --checkpoint-interval 5 --no-ui --progress-secs 0 --sensors 100 --splits 8)
