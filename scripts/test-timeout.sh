#!/usr/bin/env bash
# The runner of every test binary under scripts/test.sh (cargo's target runner): runs it
# under a deadline, so a hung test fails its binary with a clear message instead of hanging
# the whole run (CI has 90 minutes for everything). With `--no-fail-fast` the other binaries
# still run. On the deadline `timeout` signals the binary's whole process group: the jobs,
# clusters and services a test started go with it.
#
#   CAUDAL_TEST_BINARY_TIMEOUT  seconds one test binary may take (default 1500)
set -uo pipefail
limit="${CAUDAL_TEST_BINARY_TIMEOUT:-1500}"
timeout --kill-after=30 "$limit" "$@"
rc=$?
if [[ $rc -eq 124 || $rc -eq 137 ]]; then
  echo "test-timeout: $(basename "$1") did not finish within ${limit} s and was stopped (the tests still running are named above: libtest reports every test running over 60 s)" >&2
fi
exit "$rc"
