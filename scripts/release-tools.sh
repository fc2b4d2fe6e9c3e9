#!/usr/bin/env bash
# Install (once) and print the folder of the SBOM generators a release runs (e2e/images/build.sh
# release), each CycloneDX from the lock it reads, all offline once installed:
#   cyclonedx-py      (PyPI cyclonedx-bom, CycloneDX's own) the Python locks, images/*/requirements-<arch>.txt
#   cargo-cyclonedx   (crates.io, CycloneDX's own) router/Cargo.lock, as cargo resolves it for the target
#   distro2sbom       (PyPI) an image's Debian packages, read from its own dpkg database
# Why these: sbom4rust (PyPI) asks packages.ecosyste.ms about every crate, a host this machine cannot
# reach (30 s of timeouts, components without licences); syft and trivy would cover all three but
# are large Go builds; cargo-cyclonedx builds in ~1m45s cold on 2 cores, then is cached.
# Everything lives in ${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}/release-tools/<key>, keyed by this
# file (the pins below), so a pin change makes a fresh folder. Progress to stderr; the folder's bin/
# is the last line of stdout.
set -euo pipefail
unset PYTHONPATH
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}"
PY="${PYTHON:-python3}"
PYTHON_TOOLS=(cyclonedx-bom==7.5.0 distro2sbom==0.6.0)
CARGO_CYCLONEDX=0.5.9

key="$(sha256sum "$HERE/release-tools.sh" | cut -c1-12)"
TOOLS="$CACHE/release-tools/$key"
die() { echo "[release-tools] FAILED: $*" >&2; rm -rf "$TOOLS"; exit 1; }
if [[ ! -f "$TOOLS/.complete" ]]; then
  rm -rf "$TOOLS"; mkdir -p "$TOOLS"
  echo "[release-tools] installing ${PYTHON_TOOLS[*]} and cargo-cyclonedx $CARGO_CYCLONEDX in $TOOLS" >&2
  "$PY" -m venv "$TOOLS/venv" || die "python venv"
  "$TOOLS/venv/bin/pip" install --quiet --disable-pip-version-check "${PYTHON_TOOLS[@]}" >&2 || die "pip install"
  cargo install --quiet --locked --root "$TOOLS/cargo" cargo-cyclonedx --version "$CARGO_CYCLONEDX" \
    >"$TOOLS/cargo-install.log" 2>&1 || { tail -n 20 "$TOOLS/cargo-install.log" >&2; die "cargo install cargo-cyclonedx"; }
  mkdir -p "$TOOLS/bin"
  ln -sf "$TOOLS/venv/bin/cyclonedx-py" "$TOOLS/venv/bin/distro2sbom" "$TOOLS/cargo/bin/cargo-cyclonedx" "$TOOLS/bin/"
  touch "$TOOLS/.complete"
fi
echo "$TOOLS/bin"
