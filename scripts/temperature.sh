#!/usr/bin/env bash
# The README's first command: builds and runs the temperature job on the embedded default
# (generator in, files out, web UI on http://127.0.0.1:8081, checkpoints in ./data).
#
#   scripts/temperature.sh [job flags...]     # e.g. --checkpoint-interval 5, --help
#
# On a fresh Debian machine with only Rust installed it first installs, from Debian's
# packages, the little the build needs that Rust does not bring (libclang for RocksDB's
# bindings, libssl-dev for librdkafka's TLS; see scripts/install-deps.sh --build), then
# builds in release mode and runs
# `target/release/temperature` with the flags given. Nothing of the test stack is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'temperature.sh: %s\n' "$*" >&2; }

scripts/install-deps.sh --build >&2

target_dir="${CARGO_TARGET_DIR:-target}"
if [[ ! -x "$target_dir/release/temperature" ]]; then
  say "first build: compiling Caudal with RocksDB (C++) and librdkafka (C) from source."
  say "On 2 cores this takes about 30-35 minutes, once; later builds take seconds."
fi
cargo build --release --locked -p caudal-jobs --bin temperature
exec "$target_dir/release/temperature" "$@"
