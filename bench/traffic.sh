#!/usr/bin/env bash
# The endpoint under change, static router lists against discovery: one command on a fresh machine.
# Brings up a demo cluster of its own (its own state folder, loopback ports and webhook port, beside
# the demo's and the tests'; scripts/demo.sh with the P/D example), runs bench/traffic.py against
# its deployment (see its docstring for what is measured), and stops that cluster.
#
#   bench/traffic.sh                     both designs, 20 s steady phases: about 15 minutes warm
#   bench/traffic.sh --steady 10         shorter steady phases (any bench/traffic.py option)
#   KIMIK3_KEEP_CLUSTER=1                leave the bench cluster running afterwards
#
# Results: printed, and bench/results/traffic.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}"
export KIMIK3_STATE="${KIMIK3_BENCH_STATE:-$CACHE/bench-traffic-state}"
export KIMIK3_PORT_BASE="${KIMIK3_BENCH_PORT_BASE:-16800}"
export KIMIK3_WEBHOOK_PORT="${KIMIK3_BENCH_WEBHOOK_PORT:-9843}"

# scripts/demo.sh builds what it needs (cluster.sh up runs e2e/cluster/build.sh, cached).
stop() { [[ -n "${KIMIK3_KEEP_CLUSTER:-}" ]] || "$ROOT/scripts/demo.sh" down >/dev/null 2>&1 || true; }
trap stop EXIT
"$ROOT/scripts/demo.sh" >"$CACHE/bench-traffic-demo.log" 2>&1 || { tail -n 40 "$CACHE/bench-traffic-demo.log" >&2; echo "FAILED: the demo deployment" >&2; exit 1; }
eval "$("$ROOT/e2e/cluster/cluster.sh" env)"
VENV="$("$ROOT/scripts/venv.sh")"
"$VENV/bin/python" "$ROOT/bench/traffic.py" "$@"
