#!/usr/bin/env bash
# Create (once) and print the path of a cached virtualenv holding exactly what the router image
# installs: vllm-router 0.1.17 and its dependencies from images/vllm-router/requirements-<arch>.txt,
# installed --require-hashes --no-deps as the Dockerfile does. It runs the contract check of
# rendered router arguments (tests/contract/router_check.py) and, in e2e, the router itself
# (`$VENV/bin/vllm-router ARGS`). About 30 MB of wheels; a warm run takes ~0.1 s.
# The venv lives outside the repo in ${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}/router-venv/<key>,
# keyed by the lock, the Python version and the machine, so a pin change makes a fresh one.
#
# Progress goes to stderr; the venv's path is the last line of stdout. Exit non-zero with the
# reason on any failure (a half-built venv is removed and redone on the next run).
#   PYTHON=python3.11   interpreter for the venv (default python3); the lock is for Python 3.11
set -euo pipefail
# Built from the lock alone: the caller's PYTHONPATH (`make` puts this checkout's operator/ and
# simulator/ on it, with their egg-info) would show pip check distributions the lock does not hold.
unset PYTHONPATH
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}"
PY="${PYTHON:-python3}"

die() {
  echo "[router-venv] FAILED: $*" >&2
  [[ -z "${building:-}" ]] || rm -rf "$VENV"
  exit 1
}
log() { echo "[router-venv] $*" >&2; }

case "$(uname -m)" in
  x86_64 | amd64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) die "no router lock for $(uname -m) (images/vllm-router has amd64 and arm64)" ;;
esac
REQ="$ROOT/images/vllm-router/requirements-$arch.txt"
[[ -f "$REQ" ]] || die "missing $REQ"
command -v "$PY" >/dev/null || die "no interpreter '$PY' (set PYTHON)"
pyver="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" || die "'$PY' does not run"
lockpy="$(sed -n 's/.*Python \([0-9][0-9.]*\)\..*/\1/p' "$REQ" | head -1)"
[[ -z "$lockpy" || "$pyver" == "$lockpy" ]] || die "$REQ is locked for Python $lockpy, '$PY' is $pyver (set PYTHON)"
key="$( (cat "$REQ"; echo "python $pyver $(uname -m)") | sha256sum | cut -c1-12)"
VENV="$CACHE/router-venv/$key"

# Smoke test: the contract check itself on one good argument list.
smoke() {
  echo '[{"name": "smoke", "args": ["--worker-urls", "http://10.0.0.1:8000"]}]' \
    | "$VENV/bin/python" "$ROOT/tests/contract/router_check.py" >&2
}

if [[ ! -f "$VENV/.complete" ]]; then
  mkdir -p "$CACHE/router-venv"
  exec 9>"$VENV.lock"
  flock 9 # another run may be building the same venv: wait for it
  if [[ ! -f "$VENV/.complete" ]]; then
    t0=$SECONDS
    log "creating $VENV (python $pyver, $(basename "$REQ"))"
    rm -rf "$VENV"
    building=1
    "$PY" -m venv "$VENV" || die "python -m venv $VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --progress-bar off \
      --require-hashes --no-deps --only-binary=:all: -r "$REQ" >&2 \
      || die "pip install -r $REQ (is PyPI reachable? see the pip output above)"
    "$VENV/bin/python" -m pip check >&2 || die "pip check: the lock is not self-consistent"
    smoke || die "the new venv cannot run the router check (see the output above)"
    touch "$VENV/.complete"
    log "ready in $((SECONDS - t0))s, $(du -sh "$VENV" | cut -f1)"
  fi
  exec 9>&-
fi
echo "$VENV"
