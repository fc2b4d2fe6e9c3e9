#!/usr/bin/env bash
# Run the install guide's shell blocks as they are written (docs/install.md), so the guide cannot
# drift from what works: scripts/demo.sh installs the operator with them and .ci/run uninstalls it
# with them. A block is named by the word after its fence's language (```sh install); only named
# blocks run, in the order asked, each in a fresh `bash -euo pipefail` inside one working folder.
#
#   scripts/guide.sh [--in DIR] [--set FROM=TO]... NAME...
#
# --set replaces the guide's placeholders, literally, before a block runs (the registry
# registry.example.com, the release's assets folder ./kimik3-operator-<version>). The loopback
# registry speaks plain HTTP, so the demo's registry substitution adds helm's --plain-http after the
# chart's reference: nothing else of a block changes. --in: the working folder (the user's; it holds
# site-values.yaml); HOME is set to it too, so what a block installs in ~ stays there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GUIDE="$ROOT/docs/install.md"
work="$PWD"
subs=()
while (($#)); do
  case $1 in
    --in) work=$2; shift 2 ;;
    --set) subs+=("$2"); shift 2 ;;
    *) break ;;
  esac
done
(($#)) || { echo "usage: scripts/guide.sh [--in DIR] [--set FROM=TO]... NAME..." >&2; exit 2; }

block() { # the text of the block named $1, or nothing
  awk -v name="$1" '$0 == "```sh " name {inside = 1; next} inside && /^```$/ {inside = 0} inside' "$GUIDE"
}

for name in "$@"; do
  text="$(block "$name")"
  [[ -n $text ]] || { echo "FAILED: docs/install.md has no block \`\`\`sh $name" >&2; exit 1; }
  for sub in "${subs[@]}"; do
    from="${sub%%=*}" to="${sub#*=}"
    text="${text//"$from"/"$to"}"  # quoted: bash 5.2 would read & in it as the match
  done
  echo "== docs/install.md, block '$name'"
  (cd "$work" && HOME="$work" bash -euo pipefail -c "$text") || {
    echo "FAILED: docs/install.md block '$name' (run in $work):" >&2
    printf '%s\n' "$text" >&2
    exit 1
  }
done
