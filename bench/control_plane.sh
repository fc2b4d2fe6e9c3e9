#!/usr/bin/env bash
# What the operator costs a real API server as deployments grow, against the kubectl floor: one
# command on a fresh machine. Builds (cached) and starts a cluster of its own (its own state folder
# and loopback ports, beside the demo's and the tests'), adds a fleet of fake B300 nodes, runs
# bench/control_plane.py (see its docstring for what is measured), draws the plot, stops the cluster.
#
#   bench/control_plane.sh                      sizes 1,100,300 on 1,000 nodes, RSS at 500
#   bench/control_plane.sh --sizes 1,20 --nodes 100 --rss-size 50      a quick look
#   KIMIK3_KEEP_CLUSTER=1  leave the bench cluster running afterwards
#   --operator-src DIR     run the operator from another checkout's operator/ (a before/after pair)
#
# Results: bench/results/control_plane-<label>.json and bench/results/control_plane.png.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}"
export KIMIK3_STATE="${KIMIK3_BENCH_STATE:-$CACHE/bench-state}"
export KIMIK3_PORT_BASE="${KIMIK3_BENCH_PORT_BASE:-16600}"
# The bench's own operator process is the only writer under the operator's identity; no pod is
# held back from Ready longer than a real kubelet would report one.
export KIMIK3_POD_READY_DELAY_MS="${KIMIK3_POD_READY_DELAY_MS:-1000}"

"$ROOT/e2e/cluster/build.sh" >"$CACHE/build.log" 2>&1 || { tail -n 40 "$CACHE/build.log" >&2; echo "FAILED: building the cluster binaries" >&2; exit 1; }
VENV="$("$ROOT/scripts/venv.sh")"
PLOT_VENV="$("$ROOT/bench/plot-venv.sh")"
"$ROOT/e2e/cluster/cluster.sh" up >/dev/null
eval "$("$ROOT/e2e/cluster/cluster.sh" env)"
stop() { [[ -n "${KIMIK3_KEEP_CLUSTER:-}" ]] || "$ROOT/e2e/cluster/cluster.sh" down >/dev/null 2>&1 || true; }
trap stop EXIT
"$VENV/bin/python" "$ROOT/bench/control_plane.py" "$@"
"$PLOT_VENV/bin/python" "$ROOT/bench/plot_control_plane.py" "$ROOT/bench/results"
