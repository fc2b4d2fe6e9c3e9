#!/usr/bin/env bash
# Create (once) and print the path of the project's virtual environment.
#
# The venv lives in the cache folder outside the repo, keyed by the hash of constraints.txt and the declared dependencies, so a
# pin change makes a fresh one and a clean checkout reuses a warm one. The project itself is
# (re)installed editable every time because the checkout path may differ between runs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}"
PY="${PYTHON:-python3}"
deps="$("$PY" -c 'import sys, tomllib; p = tomllib.load(open(sys.argv[1], "rb"))["project"]; print(p["dependencies"], p["optional-dependencies"])' "$ROOT/pyproject.toml")"
sim_deps="$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"])' "$ROOT/simulator/pyproject.toml")"
key="$( (cat "$ROOT/constraints.txt"; echo "$deps"; echo "$sim_deps") | sha256sum | cut -c1-12)"
# KIMIK3_VENV: a venv of your own, e.g. for a second checkout (git worktree) whose editable install
# must not re-point the shared one; it is not re-created when the pins change.
VENV="${KIMIK3_VENV:-$CACHE/venv/$key}"
# One writer at a time: the e2e lanes bring their clusters up at once and each runs this script; two
# pip installs of the editable packages into one venv remove each other's dist-info mid-install (seen:
# "No such file or directory: .../kimik3_simulator-0.1.0.dist-info/", lane 2's cluster lost).
mkdir -p "$(dirname "$VENV")"
exec 8>"$VENV.lock"
flock 8
if [[ ! -x "$VENV/bin/python" || ! -f "$VENV/.complete" ]]; then
  echo "[venv] creating $VENV" >&2
  rm -rf "$VENV"; mkdir -p "$CACHE/venv"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -c "$ROOT/constraints.txt" setuptools -e "${ROOT}[test]" >&2
  touch "$VENV/.complete"
fi
# The engine simulator is a distribution of its own (simulator/pyproject.toml): its dependencies are
# the operator's, so it goes in without resolving anything.
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT" -e "$ROOT/simulator" >&2
exec 8>&-
echo "$VENV"
