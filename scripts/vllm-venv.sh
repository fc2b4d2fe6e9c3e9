#!/usr/bin/env bash
# Create (once) and print the path of a cached virtualenv holding vLLM 0.33.0, just enough of it
# to build `vllm serve`'s own argument parser offline (tests/contract/vllm_check.py):
# vllm.entrypoints.common.cli_args, vllm.utils.argparse_utils and vllm.envs, with
# VLLM_TARGET_DEVICE=cpu. It is not a serving install.
#
# Everything comes from PyPI, pinned exactly in tests/contract/vllm-requirements.txt and installed
# with --no-deps (that file is the whole lock: vllm itself, the few of its dependencies that the
# parser imports, and torch 2.14.0 with only the CUDA libraries `import torch` loads; PyPI has no
# CPU-only torch): about 2.9 GB of wheels, 5.3 GB installed. The installer is uv (pinned below,
# itself from PyPI), which downloads and unpacks in parallel: ~1 min cold on 2 cores, against
# ~2 min for pip, which stays the fallback. A warm run takes ~0.1 s.
# The venv lives outside the repo in ${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}/vllm-venv/<key>,
# keyed by that file, the Python version and the machine (not by the installer used), so a pin
# change makes a fresh one and a warm one is reused at once.
#
# Progress goes to stderr; the venv's path is the last line of stdout. Exit non-zero with the
# reason on any failure (a half-built venv is removed and redone on the next run).
#   PYTHON=python3.11   interpreter for the venv (default python3)
set -euo pipefail
# Built from the lock alone: the caller's PYTHONPATH (`make` puts this checkout's operator/ and
# simulator/ on it, with their egg-info) would show pip check distributions the lock does not hold.
unset PYTHONPATH
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQ="$ROOT/tests/contract/vllm-requirements.txt"
CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}"
PY="${PYTHON:-python3}"
UV_VERSION=0.13.9

die() {
  echo "[vllm-venv] FAILED: $*" >&2
  [[ -z "${building:-}" ]] || rm -rf "$VENV" # never leave gigabytes of a half-built venv behind
  exit 1
}
log() { echo "[vllm-venv] $*" >&2; }

[[ -f "$REQ" ]] || die "missing $REQ"
command -v "$PY" >/dev/null || die "no interpreter '$PY' (set PYTHON)"
pyver="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" || die "'$PY' does not run"
key="$( (cat "$REQ"; echo "python $pyver $(uname -m)") | sha256sum | cut -c1-12)"
VENV="$CACHE/vllm-venv/$key"

# Smoke test: the contract check itself on one good command line. Bytecode is written on the
# way (even under PYTHONDONTWRITEBYTECODE, which uv does not override), so later runs import the
# modules they need in ~8 s instead of ~19 s.
smoke() {
  echo '[{"name": "smoke", "argv": ["vllm", "serve", "/m", "-tp", "8"], "env": {}}]' \
    | env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" "$ROOT/tests/contract/vllm_check.py" >&2
}

if [[ ! -f "$VENV/.complete" ]]; then
  mkdir -p "$CACHE/vllm-venv"
  exec 9>"$VENV.lock"
  flock 9 # another run may be building the same venv: wait for it
  if [[ ! -f "$VENV/.complete" ]]; then
    t0=$SECONDS
    log "creating $VENV (python $pyver; downloads about 3 GB from PyPI)"
    rm -rf "$VENV"
    building=1
    "$PY" -m venv "$VENV" || die "python -m venv $VENV"
    pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input)
    if "${pip[@]}" "uv==$UV_VERSION" >&2; then
      "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" \
        --no-deps --only-binary :all: -r "$REQ" >&2 \
        || { log "uv failed (output above); retrying with pip"; uv_failed=1; }
    else
      log "could not install uv $UV_VERSION; using pip"; uv_failed=1
    fi
    if [[ -n "${uv_failed:-}" ]]; then
      "${pip[@]}" --no-deps --only-binary=:all: --progress-bar off -r "$REQ" >&2 \
        || die "pip install -r $REQ (is PyPI reachable? see the pip output above)"
    fi
    smoke || die "the new venv cannot build vLLM's parser (see the traceback above)"
    touch "$VENV/.complete"
    log "ready in $((SECONDS - t0))s, $(du -sh "$VENV" | cut -f1)"
  fi
  exec 9>&-
fi
echo "$VENV"
