#!/usr/bin/env bash
# Build kimik3-router (router/, release, --locked) with this machine's cargo and print the binary's
# path as the last line of stdout. The e2e world runs it in the router pods it plays, the contract
# tests check every rendered command line with its --check-args, and the benches drive it. Cargo's
# own target folder is kept outside the repository (${KIMIK3_CACHE:-~/.cache/kimik3-e2e}/router-target),
# so a warm run only checks that nothing changed (about 0.2 s). Progress goes to stderr; exit non-zero
# with cargo's reason on a failed build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}"
TARGET="$CACHE/router-target"
mkdir -p "$TARGET"
command -v cargo >/dev/null || { echo "FAILED: cargo is not on PATH (kimik3-router needs Rust >= 1.85)" >&2; exit 1; }
# One build at a time: a second caller waits and then finds it built.
exec 9>"$TARGET/.lock"
flock 9
cargo build --release --locked --quiet --manifest-path "$ROOT/router/Cargo.toml" --target-dir "$TARGET" \
  --bin kimik3-router >&2
echo "$TARGET/release/kimik3-router"
