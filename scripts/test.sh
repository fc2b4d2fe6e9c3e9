#!/usr/bin/env bash
# Every test: lint, types, import contracts; then unit/schema/golden and the other tests/ suites beside
# the e2e suite on the local real cluster (built from the Go module proxy on first use, cached in
# ~/.cache/kimik3-e2e). Fails if either failed.
#
#   scripts/test.sh            all of it, the e2e suite in two lanes on two clusters; stops the
#                              clusters it started at the end
#   KIMIK3_KEEP_CLUSTER=1      leave the test clusters running afterwards
#   KIMIK3_TEST_STATE, KIMIK3_TEST_PORT_BASE  the test cluster's state folder ($CACHE/test-state)
#                              and first of its 18 loopback ports (16400); lane 2's cluster uses the
#                              folder with -lane2 appended and the base + 100; the demo's cluster
#                              uses $CACHE/state and the usual ports
#   scripts/test.sh -k NAME    extra arguments go to both pytest runs (the e2e one in one lane)
#   KIMIK3_STEP_TIMES=FILE     append `step<TAB>seconds` for lint, make-test and e2e (.ci/run's budget guard)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}"
mkdir -p "$CACHE"
# The tests run a cluster of their own (its own state folder and loopback ports), so whatever
# scripts/demo.sh left running (its cluster, its operator, its deployment holding the fake GPUs)
# is neither in their way nor touched: the demo stays usable, in either order.
export KIMIK3_STATE="${KIMIK3_TEST_STATE:-$CACHE/test-state}"
export KIMIK3_PORT_BASE="${KIMIK3_TEST_PORT_BASE:-16400}"
t0=$SECONDS
step_took() { [[ -z ${KIMIK3_STEP_TIMES:-} ]] || printf '%s\t%s\n' "$1" "$2" >>"$KIMIK3_STEP_TIMES"; }

# The cold build of the cluster binaries is the long pole: start it first, test while it runs.
"$ROOT/e2e/cluster/build.sh" >"$CACHE/build.log" 2>&1 &
build_pid=$!
# The operator and router images (podman, from their Dockerfiles: e2e/images/build.sh), beside it;
# the real-node tests push them to the cluster's registry.
"$ROOT/e2e/images/build.sh" >"$CACHE/images.log" 2>&1 &
images_pid=$!

VENV="$("$ROOT/scripts/venv.sh")"
export PATH="$VENV/bin:$PATH"

# The router pods' front is Debian's HAProxy; the security tests run it (tests/security/test_front_door.py).
# make runs the developer targets this script shares with CONTRIBUTING.md.
source "$ROOT/e2e/debian-packages.sh"
ensure_debian_packages "$CACHE/apt.log" haproxy make
echo "== make lint: ruff, types (mypy: strict on api, planner, render, contract, kimi_k3), import contracts"
lint_t0=$SECONDS
make --no-print-directory lint VENV="$VENV"
step_took lint $((SECONDS - lint_t0))
# make test (unit, schema, render, contract, security, fuzz and the other suites under tests/) runs
# beside the e2e suite, at the lowest priority: pytest keeps one core busy, and the e2e suite leaves
# about half of this 2-core machine idle while it waits on its cluster (bench/README.md, CI time).
# Its own session, so an early exit can stop all of it. Extra arguments pass to pytest quoted as
# given (-k 'a and b'); a -k that selects none of these tests (pytest's exit 5) is fine here, as
# the e2e run below may hold the ones it names.
pytest_args=""
(($# == 0)) || pytest_args="$(printf '%q ' "$@")" # printf with no argument would print ''
UNIT_LOG="$CACHE/make-test.log"
echo "== make test, beside the builds and the e2e suite (log: $UNIT_LOG)"
# Its own time goes to KIMIK3_STEP_TIMES as it ends (beside the e2e suite it rarely ends last).
setsid -w nice -n 19 bash -c 't0=$SECONDS; rc=0; make --no-print-directory test VENV="$1" ARGS="$2" NONE_OK="$3" || rc=$?
  [[ -z ${KIMIK3_STEP_TIMES:-} ]] || printf "make-test\t%s\n" $((SECONDS - t0)) >>"$KIMIK3_STEP_TIMES"; exit $rc' \
  _ "$VENV" "$pytest_args" "$#" >"$UNIT_LOG" 2>&1 </dev/null &
unit_pid=$!
stop_unit() { kill -- "-$unit_pid" 2>/dev/null || true; }
trap stop_unit EXIT

await_build() { # await_build PID LOG TAG WHAT: a background build's end, its summary, or FAILED
  local pid=$1 log=$2 tag=$3 what=$4
  echo "== building $what (log: $log)"
  if ! wait "$pid"; then
    tail -n 40 "$log" >&2
    echo "FAILED: building $what (see $log)" >&2
    exit 1
  fi
  grep -E "^\\[$tag\\]" "$log" || true
}
await_build "$build_pid" "$CACHE/build.log" build "the cluster binaries"
await_build "$images_pid" "$CACHE/images.log" images "the operator and router images"

# The whole suite runs in two lanes, each a pytest run on a cluster of its own (its own state folder,
# ports, pod addresses and node bridge): the suite waits on its cluster about half the time, so two
# lanes fill the 2 cores (bench/README.md, "CI time"). Lane 2 runs the files of E2E_LANE2, lane 1
# every other file (a new file goes to lane 1); the tests marked after_suite (test_rbac.py judges
# every request the operator made in both lanes, test_uninstall.py) run after both, on lane 1's
# cluster. Arguments (scripts/test.sh -k NAME) run one lane, as one pytest run, on lane 1's cluster.
E2E_LANE2=(test_traffic.py test_faults.py)  # about 1,250 s of the 2,400 (measured: bench/README.md)
LANE2_STATE="$KIMIK3_STATE-lane2" LANE2_PORT_BASE=$((KIMIK3_PORT_BASE + 100))
lanes=2
(($# == 0)) || lanes=1
lane2() { KIMIK3_STATE="$LANE2_STATE" KIMIK3_PORT_BASE="$LANE2_PORT_BASE" "$@"; }

started_cluster=0 started_lane2=0
if ! "$ROOT/e2e/cluster/cluster.sh" status >/dev/null 2>&1; then started_cluster=1; fi
if ((lanes == 2)) && ! lane2 "$ROOT/e2e/cluster/cluster.sh" status >/dev/null 2>&1; then started_lane2=1; fi
cleanup() {
  stop_unit
  [[ ${lane2_pid:-} ]] && kill "$lane2_pid" 2>/dev/null
  if [[ "${KIMIK3_KEEP_CLUSTER:-0}" != 1 ]]; then
    [[ $started_cluster == 0 ]] || "$ROOT/e2e/cluster/cluster.sh" down || true
    [[ $started_lane2 == 0 ]] || lane2 "$ROOT/e2e/cluster/cluster.sh" down || true
  fi
}
trap cleanup EXIT
if ((lanes == 2)); then
  lane2 "$ROOT/e2e/cluster/cluster.sh" up >"$CACHE/e2e-lane2-up.log" 2>&1 &
  lane2_up=$!
fi
"$ROOT/e2e/cluster/cluster.sh" up >/dev/null
# Tell a broken cluster apart from a broken operator before the operator's tests run.
"$ROOT/e2e/cluster/smoke.sh"
if ((lanes == 2)) && ! wait "$lane2_up"; then
  tail -n 40 "$CACHE/e2e-lane2-up.log" >&2
  echo "FAILED: lane 2's cluster did not come up (log: $CACHE/e2e-lane2-up.log)" >&2
  exit 1
fi

e2e_t0=$SECONDS
e2e() { python -m pytest -q -p no:cacheprovider --durations=30 "$@"; }  # the slowest, for the CI budget
rc=0
if ((lanes == 1)); then
  echo "== e2e tests on the local real cluster"
  e2e e2e/tests "$@" || rc=$?
else
  KIMIK3_E2E_STARTED="$(date -u +%Y-%m-%dT%H:%M:%S)"
  export KIMIK3_E2E_STARTED
  LANE2_LOG="$CACHE/e2e-lane2.log"
  echo "== e2e tests in two lanes; lane 2 (${E2E_LANE2[*]}) logs to $LANE2_LOG, printed when it ends"
  lane2 e2e "${E2E_LANE2[@]/#/e2e/tests/}" -m "not after_suite" >"$LANE2_LOG" 2>&1 &
  lane2_pid=$!
  lane1_rc=0 lane2_rc=0
  e2e e2e/tests "${E2E_LANE2[@]/#/--ignore=e2e/tests/}" -m "not after_suite" || lane1_rc=$?
  wait "$lane2_pid" || lane2_rc=$?
  lane2_pid=
  echo "== e2e lane 2 (rc $lane2_rc)"
  cat "$LANE2_LOG"
  echo "== e2e after both lanes: the after_suite tests on lane 1's cluster"
  after_rc=0
  KIMIK3_E2E_MORE_AUDIT_LOGS="$LANE2_STATE/audit.log" e2e e2e/tests -m after_suite || after_rc=$?
  for lane_rc in "$lane1_rc" "$lane2_rc" "$after_rc"; do ((rc != 0)) || rc=$lane_rc; done
fi
if [[ $rc == 5 ]]; then
  echo "FAILED: no e2e test was collected" >&2
  exit 1
fi
echo "== e2e took $((SECONDS - e2e_t0))s"
step_took e2e $((SECONDS - e2e_t0))

echo "== make test (log: $UNIT_LOG)"
unit_rc=0
wait "$unit_pid" || unit_rc=$?
if [[ $unit_rc != 0 ]]; then
  grep -vE '^[.sx]+ +\[ *[0-9]+%\]$' "$UNIT_LOG" | tail -n 80 >&2
  echo "FAILED: make test (exit $unit_rc; log: $UNIT_LOG)" >&2
else
  tail -n 1 "$UNIT_LOG"
fi
echo "== everything took $((SECONDS - t0))s"
if [[ $rc != 0 ]]; then exit "$rc"; fi
exit "$unit_rc"
