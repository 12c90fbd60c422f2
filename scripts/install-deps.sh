#!/usr/bin/env bash
# Installs, from Debian's packages, what Caudal's build and tests need -- only what is missing.
#
#   scripts/install-deps.sh            # install what is missing (apt-get update only then)
#   scripts/install-deps.sh --check    # list what is missing, install nothing (exit 1 if any)
#   scripts/install-deps.sh --build    # only what building Caudal needs (command 1: scripts/temperature.sh)
#   scripts/install-deps.sh --build --check
#
# Idempotent: a second run checks with dpkg and exits without touching apt.
# Safe without a TTY (CI=true, no stdin). Runs apt as root, or through sudo when not root.
# Services installed here (redis-server, postgresql) are NOT started by their packages:
# scripts/services.sh starts private instances on ports of their own.
set -euo pipefail

CHECK_ONLY=0
BUILD_ONLY=0
for arg in "$@"; do
  case $arg in
    --check) CHECK_ONLY=1 ;;
    --build) BUILD_ONLY=1 ;;
    *) printf 'install-deps: unknown option %s (use --check, --build)\n' "$arg" >&2; exit 2 ;;
  esac
done

log() { printf 'install-deps: %s\n' "$*"; }
die() { printf 'install-deps: ERROR: %s\n' "$*" >&2; exit 1; }

# package -> why (kept in this order). The build set: RocksDB's Rust bindings are generated
# by bindgen, which loads libclang; RocksDB (C++) and librdkafka (C) build with gcc/g++/make.
BUILD_PKGS=(
  "libclang-dev:bindgen (rocksdb-sys) loads libclang"
  "gcc:C build of librdkafka, zlib, lz4"
  "g++:C++ build of RocksDB"
  "make:librdkafka's build"
  "pkg-config:native library discovery"
  "libssl-dev:librdkafka's TLS and SASL SCRAM (secured Kafka clusters)"
)
# The test set adds the services and tools of the test stack.
TEST_PKGS=(
  "clang:bindgen / C++ build of RocksDB"
  "cmake:native builds (rdkafka-sys, zstd)"
  "curl:health checks and scripts"
  "openssl:the test stack's CA and certificates (secured Kafka, registry, PostgreSQL, Redis)"
  "redis-server:Redis sink tests (scripts/services.sh)"
  "chromium:web UI tests in a real browser"
  "chromium-driver:WebDriver for the web UI tests"
  "strace:jobs/tests/durability.rs traces fsync and rename of a real run"
)

installed() { # dpkg says "install ok installed" (not just unpacked / half-configured)
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

PKGS=("${BUILD_PKGS[@]}")
((BUILD_ONLY)) || PKGS+=("${TEST_PKGS[@]}")
missing=()
why=()
for entry in "${PKGS[@]}"; do
  pkg=${entry%%:*}
  installed "$pkg" || { missing+=("$pkg"); why+=("  $pkg: ${entry#*:}"); }
done

# The test stack's tools, checked by what they provide rather than by package name.
test_stack_checks() {
  # PostgreSQL: only when no server binaries are present at all.
  pg_bin_present() {
    ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || command -v postgres >/dev/null 2>&1
  }
  pg_bin_present || missing+=("postgresql")
  command -v psql >/dev/null 2>&1 || installed postgresql-client || missing+=("postgresql-client")

  # Python venv support for the test-stack venv (moto, confluent-kafka). services.sh builds
  # the venv from Debian's /usr/bin/python3, which needs python3-venv for ensurepip.
  if [[ ! -x /usr/bin/python3 ]]; then
    missing+=("python3" "python3-venv")
  elif ! /usr/bin/python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    missing+=("python3-venv")
  fi

  # Java 17 + Maven fetch and run the Kafka broker.
  command -v java >/dev/null 2>&1 || missing+=("openjdk-17-jre-headless")
  command -v mvn  >/dev/null 2>&1 || missing+=("maven")
}
((BUILD_ONLY)) || test_stack_checks

# de-duplicate, keep order
declare -A seen=(); uniq=()
for p in "${missing[@]}"; do [[ -n "${seen[$p]:-}" ]] || { seen[$p]=1; uniq+=("$p"); }; done
missing=("${uniq[@]}")

if ((${#missing[@]} == 0)); then
  log "all present"
  exit 0
fi

if ((CHECK_ONLY)); then
  log "missing: ${missing[*]}"
  exit 1
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null 2>&1 || die "not root and no sudo: install as root: apt-get install ${missing[*]}"
  # A person at a terminal is asked for their password; CI and scripts without one fail fast.
  if [[ -t 0 && "${CI:-}" != "true" ]]; then SUDO=(sudo); else SUDO=(sudo -n); fi
fi

export DEBIAN_FRONTEND=noninteractive
APT_OPTS=(-y -q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold
          -o APT::Install-Recommends=false)

# Keep package maintainer scripts from starting system services (redis on 6379, the
# postgresql "main" cluster on 5432): our stack runs private instances instead.
POLICY=/usr/sbin/policy-rc.d
added_policy=0
if [[ ! -e $POLICY ]]; then
  printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$POLICY" >/dev/null
  "${SUDO[@]}" chmod 755 "$POLICY"
  added_policy=1
fi
cleanup() { ((added_policy)) && "${SUDO[@]}" rm -f "$POLICY" || true; }
trap cleanup EXIT

log "installing from Debian's packages: ${missing[*]}"
((${#why[@]} == 0)) || printf 'install-deps: %s\n' "${why[@]}"
aptlog=$(mktemp)
if ! "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 update -q >"$aptlog" 2>&1; then
  tail -n 20 "$aptlog" >&2
  die "apt-get update failed (see above)"
fi
# Finish any half-configured package first (e.g. 'install ok unpacked').
"${SUDO[@]}" dpkg --configure -a >>"$aptlog" 2>&1 || true
if ! "${SUDO[@]}" apt-get install "${APT_OPTS[@]}" "${missing[@]}" >>"$aptlog" 2>&1; then
  # Find which package(s) are at fault, to name them.
  bad=()
  for p in "${missing[@]}"; do
    "${SUDO[@]}" apt-get install "${APT_OPTS[@]}" "$p" >>"$aptlog" 2>&1 || bad+=("$p")
  done
  tail -n 20 "$aptlog" >&2
  die "could not install: ${bad[*]:-${missing[*]}} (full log: $aptlog)"
fi
rm -f "$aptlog"

still=()
for p in "${missing[@]}"; do
  case $p in
    openjdk-*) command -v java >/dev/null || still+=("$p") ;;
    maven) command -v mvn >/dev/null || still+=("$p") ;;
    *) installed "$p" || still+=("$p") ;;
  esac
done
((${#still[@]} == 0)) || die "still missing after install: ${still[*]}"
log "installed: ${missing[*]}"
