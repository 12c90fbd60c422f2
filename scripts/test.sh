#!/usr/bin/env bash
# Caudal's whole test suite — the README's second command and what CI runs.
#
#   scripts/test.sh [--soak] [extra cargo test args]
#
# --soak: the soak test (tests/tests/soak.rs) kills 50 times instead of 12.
#
# 1. installs what the build and tests need from Debian (only what is missing),
# 2. starts the test stack on loopback (Kafka, schema registry, PostgreSQL, Redis, S3, and the
#    Iceberg REST catalog),
# 3. runs `cargo test --workspace --no-fail-fast` (each test binary under the deadline of
#    scripts/test-timeout.sh) with the stack's addresses exported and
#    CAUDAL_REQUIRE_STACK=1, so no test that needs a service can skip itself (among them
#    schemas/tests/confluent_interop.rs: the official Confluent client, run with
#    $CAUDAL_PYTHON, against Caudal's Avro in both directions plus check-stack.py's
#    registry check).
#
# The cargo target dir defaults to ~/.cache/caudal/target (outside the clone, reused by
# later runs); set CARGO_TARGET_DIR to change it. The stack keeps running afterwards for
# quick re-runs, except under CI or with CAUDAL_STOP_STACK=1.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--soak" ]]; then
  shift
  export CAUDAL_SOAK_KILLS="${CAUDAL_SOAK_KILLS:-50}"
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/caudal/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"

step() { printf '\n== %s ==\n' "$*"; }

step "dependencies"
scripts/install-deps.sh

step "test stack"
# A broker that is not running starts empty: every test makes topics of its own, and the
# thousands that earlier runs left made the single KRaft controller of this stack stall for
# tens of seconds under load (the broker fenced itself; a cluster test then timed out). A
# broker already running (a stack you use by hand) is left as it is.
kafka_status=$(scripts/services.sh status kafka 2>/dev/null || true)
if [[ $kafka_status =~ ^kafka[[:space:]]+down ]]; then
  scripts/services.sh purge kafka >/dev/null
fi
scripts/services.sh start
# The Iceberg REST catalog (only when named): ≈ 20 s to assemble on a fresh machine, ≈ 2 s
# to start after that; the REST-catalog tests need it.
scripts/services.sh start iceberg-rest
if [[ "${CI:-}" == "true" || "${CAUDAL_STOP_STACK:-0}" == "1" ]]; then
  trap 'step "stopping the test stack"; scripts/services.sh stop || true' EXIT
fi
# shellcheck disable=SC1090
eval "$(scripts/services.sh env)"
export CAUDAL_REQUIRE_STACK=1

step "build"
cargo build --workspace --all-targets

step "tests"
# Every test binary runs under a deadline (scripts/test-timeout.sh), and one failing binary
# does not stop the others: one run shows every failure.
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/test-timeout.sh"
cargo test --workspace --no-fail-fast "$@"

step "lint"
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
