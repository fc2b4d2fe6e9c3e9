#!/usr/bin/env bash
# Create (once) and print the path of a cached virtualenv with matplotlib, pinned in
# bench/plot-requirements.txt, for bench/plot_control_plane.py. It lives outside the repo in
# ${KIMIK3_CACHE:-~/.cache/kimik3-e2e}/plot-venv/<hash of the pins>; progress goes to stderr.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}"
PY="${PYTHON:-python3}"
REQ="$ROOT/bench/plot-requirements.txt"
key="$( (cat "$REQ"; "$PY" -V; uname -m) | sha256sum | cut -c1-12)"
VENV="$CACHE/plot-venv/$key"
if [[ ! -f "$VENV/.complete" ]]; then
  echo "[plot-venv] creating $VENV" >&2
  rm -rf "$VENV"; mkdir -p "$CACHE/plot-venv"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --only-binary=:all: -r "$REQ" >&2 \
    || { rm -rf "$VENV"; echo "[plot-venv] FAILED: pip install -r $REQ" >&2; exit 1; }
  "$VENV/bin/python" -c 'import matplotlib' || { rm -rf "$VENV"; echo "[plot-venv] FAILED: matplotlib does not import" >&2; exit 1; }
  touch "$VENV/.complete"
fi
echo "$VENV"
