#!/usr/bin/env bash
# Build the operator and router images from their Dockerfiles, as users build them, with no
# registry to pull from: podman (buildah) from Debian's packages, on a stand-in for the base image
# that cannot be pulled here (docs/real-runtime.md says exactly how it differs from the official
# one). Everything lands outside the repository, in $KIMIK3_CACHE/images: podman's own storage and
# the stand-in base (built once). An image is built again only when its source changed (`build`).
#
#   e2e/images/build.sh            build the operator image and both router images (kimik3-router, and
#                                  vllm-router, the fallback); prints "<name> <ref> <image id>" per image
#   e2e/images/build.sh push HOST  build, then push the images and the chart to the registry at
#                                  HOST (plain HTTP: the local cluster's, on loopback), each image
#                                  under its usual path with HOST for the registry
#                                  (HOST/kimik3-operator/kimik3-operator:<version>) and also tagged
#                                  <version>-<image id> (printed: "<name> <ref>"), the chart as
#                                  oci://HOST/charts/kimik3-operator (helm on PATH)
#   e2e/images/build.sh release HOST OUT   a release (docs/release.md): push as above, then write to OUT
#                                  release.json (each image's reference and digest, the chart's), the
#                                  images' SBOMs (OUT/sbom, CycloneDX from the locks and each image's
#                                  dpkg database: scripts/release-tools.sh), the CLI's wheel and the
#                                  chart with every image pinned by digest (pushed in place of the
#                                  tree's); prints "<name> <ref> <digest>" per image
#   e2e/images/build.sh retag FROM TO   push an image already built or pushed (FROM) as TO
#   e2e/images/build.sh tags       the image references it builds
#   e2e/images/build.sh env        `export` lines for running podman against this storage
#
# The build needs, on this VM and not in the images: runc (Debian 12's crun 1.8.1 refuses the
# hybrid cgroup layout), soft ulimits within the VM's (no CAP_SYS_RESOURCE to raise them),
# `--platform` (buildah 1.28 sets TARGETARCH only then), the host network and the host's CA bundle
# and pip configuration mounted read-only into RUN steps (package traffic passes a TLS-inspecting
# proxy). Mounts are not layers: nothing of them is in the image (tests/images checks the result).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=../debian-packages.sh
source "$HERE/../debian-packages.sh"
CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}"
IMAGES="$CACHE/images"
# The base the Dockerfiles name (their ARG PYTHON_IMAGE default), read from them so the two agree.
BASE_REF="$(sed -n 's/^ARG PYTHON_IMAGE=//p' "$ROOT/images/operator/Dockerfile")"
# Debian packages the build needs (the `podman` package brings buildah's code, conmon, the CNI
# plugins and catatonit; mmdebstrap makes the stand-in base; jq writes a release's release.json, and
# the demo reads it).
PACKAGES=(podman runc mmdebstrap uidmap jq)

log() { printf '[images] %s\n' "$*" >&2; }
die() { printf '[images] FAILED: %s\n' "$*" >&2; exit 1; }

# RLIMIT_NPROC for build and run steps: runc in this VM is refused raising it to the hard limit
# (setrlimit type 6: EPERM) though that equals the current one; a fixed 32768 is granted.
NPROC=32768

arch() { case "$(uname -m)" in x86_64) echo amd64 ;; aarch64) echo arm64 ;; *) die "unsupported machine $(uname -m)" ;; esac; }

replace() { # replace FILE < content: only when it differs (another podman may be reading it)
  local tmp
  tmp="$(mktemp "$1.XXXXXX")"
  cat >"$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv -f "$tmp" "$1"; fi
}

write_conf() { # podman's configuration for this storage only: never the host's
  mkdir -p "$IMAGES/storage" "$IMAGES/run" "$IMAGES/tmp"
  replace "$IMAGES/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$IMAGES/storage"
runroot = "$IMAGES/run"
EOF
  replace "$IMAGES/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$(ulimit -Sn):$(ulimit -Hn)", "nproc=$NPROC:$NPROC"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
}

podman_env() {
  printf 'export CONTAINERS_STORAGE_CONF=%q CONTAINERS_CONF=%q TMPDIR=%q\n' \
    "$IMAGES/storage.conf" "$IMAGES/containers.conf" "$IMAGES/tmp"
}

ensure_packages() { ensure_debian_packages "$IMAGES/apt.log" "${PACKAGES[@]}" || die "Debian packages"; }

# The stand-in base: Debian bookworm (minbase) with the packages the official slim image adds
# (ca-certificates, which brings openssl; netbase; tzdata) and Debian's Python 3.11 in a venv at
# /usr/local, so `python`, `python3` and `pip` are on the same PATH as in the official image.
# Keyed by this function's text: a change to the recipe makes a new base.
STAND_IN_PACKAGES=ca-certificates,netbase,tzdata,python3,python3-venv
ensure_base() {
  local key; key="$(declare -f ensure_base | cat - <(echo "$STAND_IN_PACKAGES $BASE_REF") | sha256sum | cut -c1-12)"
  if podman image exists "$BASE_REF" && [[ "$(podman image inspect -f '{{index .Labels "dev.kimik3.stand-in"}}' "$BASE_REF")" == "$key" ]]; then
    return 0
  fi
  log "making the stand-in for $BASE_REF (mmdebstrap bookworm minbase)"
  local t0=$SECONDS tar="$IMAGES/tmp/base-$key.tar"
  mmdebstrap --quiet --variant=minbase --include="$STAND_IN_PACKAGES" \
    --customize-hook='chroot "$1" python3 -m venv /usr/local/python' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/root/.cache' \
    bookworm "$tar" >"$IMAGES/mmdebstrap.log" 2>&1 \
    || { tail -n 20 "$IMAGES/mmdebstrap.log" >&2; die "mmdebstrap (log $IMAGES/mmdebstrap.log)"; }
  podman import --quiet \
    --change 'ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
    --change "LABEL dev.kimik3.stand-in=$key" \
    "$tar" "$BASE_REF" >/dev/null
  rm -f "$tar"
  log "stand-in base made in $((SECONDS - t0))s"
}

push() { # push NAME HOST REF: REF under HOST instead of its own registry, under its own tag and
  # under "<tag>-<image id>": a reference that changes with every rebuild, so an install that names
  # it rolls its pods when the image changed (the version tag alone would not: IfNotPresent).
  # Prints "NAME REF DIGEST": the digest the registry stores the manifest under (podman's
  # --digestfile), what an install by digest names (the chart's image.digest; scripts/demo.sh).
  local name=$1 host=$2 ref=$3 t0=$SECONDS id to digest_file="$IMAGES/push-$1.digest"
  id="$(podman image inspect -f '{{.Id}}' "$ref")"
  rm -f "$digest_file"
  for to in "$host/${ref#*/}" "$host/${ref#*/}-${id:0:12}"; do
    podman tag "$ref" "$to"
    podman push --quiet --tls-verify=false --digestfile "$digest_file" "$to" >"$IMAGES/push.log" 2>&1 \
      || { tail -n 20 "$IMAGES/push.log" >&2; die "podman push $to"; }
    podman untag "$ref" "$to" # the registry keeps it; storage keeps only the one tag per image
  done
  [[ "$(cat "$digest_file")" == sha256:* ]] || die "podman push $to wrote no digest"
  log "pushed $to in $((SECONDS - t0))s ($(cat "$digest_file"))"
  printf '%s %s %s\n' "$name" "$to" "$(cat "$digest_file")"
}

push_chart() { # push_chart HOST: package the chart as it is in the tree and push it
  local host=$1 tmp
  tmp="$(mktemp -d)"
  helm package "$ROOT/charts/kimik3-operator" -d "$tmp" >/dev/null || die "helm package"
  helm push "$tmp"/kimik3-operator-*.tgz "oci://$host/charts" --plain-http >"$IMAGES/push.log" 2>&1 \
    || { cat "$IMAGES/push.log" >&2; rm -rf "$tmp"; die "helm push to oci://$host/charts"; }
  rm -rf "$tmp"
  log "pushed the chart to oci://$host/charts/kimik3-operator"
}

# The release's SBOMs, one CycloneDX document per image and source: the lock it was installed from
# (Python: cyclonedx-py; the router crate: cargo-cyclonedx on a copy of its sources) and the Debian
# packages its own dpkg database lists (distro2sbom, on the image mounted read-only: root only).
write_sboms() { # write_sboms OUT TOOLS
  local out=$1 tools=$2 name ref rootfs arch_; arch_="$(arch)"
  mkdir -p "$out"
  "$tools/cyclonedx-py" requirements --pyproject "$ROOT/pyproject.toml" --sv 1.6 --output-reproducible --of JSON \
    -o "$out/operator.python.cdx.json" "$ROOT/images/operator/requirements-$arch_.txt" 2>/dev/null ||
    die "cyclonedx-py on images/operator/requirements-$arch_.txt"
  "$tools/cyclonedx-py" requirements --sv 1.6 --output-reproducible --of JSON \
    -o "$out/vllm-router.python.cdx.json" "$ROOT/images/vllm-router/requirements-$arch_.txt" 2>/dev/null ||
    die "cyclonedx-py on images/vllm-router/requirements-$arch_.txt"
  local crate; crate="$(mktemp -d)"
  cp -r "$ROOT/router/Cargo.toml" "$ROOT/router/Cargo.lock" "$ROOT/router/src" "$crate/"
  (cd "$crate" && "$tools/cargo-cyclonedx" cyclonedx --quiet --format json --spec-version 1.5 \
    --target "$(uname -m)-unknown-linux-gnu") >"$IMAGES/sbom.log" 2>&1 ||
    { cat "$IMAGES/sbom.log" >&2; rm -rf "$crate"; die "cargo-cyclonedx on router/Cargo.lock"; }
  mv "$crate/kimik3-router.cdx.json" "$out/router.cargo.cdx.json"
  rm -rf "$crate"
  while read -r name ref; do
    rootfs="$(podman image mount "$ref")" || die "podman image mount $ref (a release's SBOM needs root)"
    "$tools/distro2sbom" --system --root "$rootfs" --distro deb --name debian --release 12 \
      --product-type container --product-name "$name" --sbom cyclonedx --format json \
      -o "$out/$name.deb.cdx.json" >"$IMAGES/sbom.log" 2>&1 ||
      { cat "$IMAGES/sbom.log" >&2; podman image unmount "$ref" >/dev/null; die "distro2sbom on $ref"; }
    podman image unmount "$ref" >/dev/null
  done
}

# The chart as a release ships it: every image it names pinned by the digest just pushed (the
# operator's, and the routers' the operator renders: routerImages), packaged into OUT and pushed to
# HOST in place of the tree's. Rewritten on a copy line by line (sed: a YAML round trip would drop
# the values' comments, which are the chart's documentation); `helm template` then proves each digest
# reaches the rendered Deployment (a values layout that moved fails here, not at a user's install).
release_chart() { # release_chart HOST OUT OPERATOR_DIGEST ROUTER_DIGEST VLLM_ROUTER_DIGEST
  local host=$1 out=$2 tmp rendered d; tmp="$(mktemp -d)"
  cp -r "$ROOT/charts/kimik3-operator" "$tmp/"
  local repo="$host/${TAGS[0]#*/}" router="$host/${TAGS[1]#*/}" vllm_router="$host/${TAGS[2]#*/}"
  sed -i -e "s|^  repository: .*|  repository: ${repo%:*}|" -e "s|^  digest: \"\"\$|  digest: \"$3\"|" \
    -e "s|^  kimik3Router: \"\"\$|  kimik3Router: \"${router%:*}@$4\"|" \
    -e "s|^  vllmRouter: \"\"\$|  vllmRouter: \"${vllm_router%:*}@$5\"|" "$tmp/kimik3-operator/values.yaml"
  rendered="$(helm template kimik3-operator "$tmp/kimik3-operator")" || { rm -rf "$tmp"; die "helm template of the pinned chart"; }
  for d in "${repo%:*}@$3" "${router%:*}@$4" "${vllm_router%:*}@$5"; do
    grep -qF "$d" <<<"$rendered" || { rm -rf "$tmp"; die "the pinned chart does not render $d"; }
  done
  helm package "$tmp/kimik3-operator" -d "$out" >/dev/null || { rm -rf "$tmp"; die "helm package"; }
  helm push "$out"/kimik3-operator-*.tgz "oci://$host/charts" --plain-http >"$IMAGES/push.log" 2>&1 \
    || { cat "$IMAGES/push.log" >&2; rm -rf "$tmp"; die "helm push to oci://$host/charts"; }
  rm -rf "$tmp"
  sed -n 's/^Digest: //p' "$IMAGES/push.log"
}

release() { # release HOST OUT: after the images are built
  local host=$1 final=${2%/} tools pushed out
  # OUT is replaced whole, once the release is complete: only an earlier release's folder (or a new
  # or empty one) may be. The release is made beside it and moved in; a failed one leaves nothing.
  if [[ -e $final && ! -f $final/release.json && -n "$(ls -A "$final" 2>/dev/null)" ]]; then
    die "$final exists and holds no release.json: not replacing it"
  fi
  tools="$("$ROOT/scripts/release-tools.sh" | tail -n 1)" || die "scripts/release-tools.sh"
  mkdir -p "$(dirname "$final")"
  out="$(mktemp -d "$final.partial-XXXXXX")"
  # shellcheck disable=SC2064 # the folder's name now
  trap "rm -rf '$out'" EXIT
  mkdir -p "$out/sbom"
  pushed="$(push operator "$host" "${TAGS[0]}"; push router "$host" "${TAGS[1]}"; push vllm-router "$host" "${TAGS[2]}")"
  printf '%s\n' "$pushed"
  local -A digest
  while read -r name _ref dig; do digest[$name]=$dig; done <<<"$pushed"
  write_sboms "$out/sbom" "$tools" <<<"operator ${TAGS[0]}
router ${TAGS[1]}
vllm-router ${TAGS[2]}"
  local chart_digest
  chart_digest="$(release_chart "$host" "$out" "${digest[operator]}" "${digest[router]}" "${digest[vllm-router]}")"
  [[ $chart_digest == sha256:* ]] || die "helm push printed no chart digest"
  # The CLI as users install it (docs/install.md): the operator's distribution, no dependencies, built
  # from a copy of what the operator image is built from (setuptools writes build/ and egg-info
  # beside its source, and would pack a stale build/lib it finds there).
  local src; src="$(mktemp -d)"
  (cd "$ROOT" && tar --exclude=__pycache__ --exclude='*.egg-info' -cf - pyproject.toml README.md operator) | tar -xf - -C "$src"
  "$("$ROOT/scripts/venv.sh")/bin/pip" wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    -w "$out" "$src" >"$IMAGES/wheel.log" 2>&1 || { cat "$IMAGES/wheel.log" >&2; rm -rf "$src"; die "pip wheel of the CLI"; }
  rm -rf "$src"
  local version; version="${TAGS[0]##*:}"
  jq -n --arg version "$version" --arg host "$host" --arg pushed "$pushed" --arg chart "$chart_digest" \
    --argjson sboms "$(cd "$out" && printf '%s\n' sbom/*.json | jq -R . | jq -s .)" \
    --arg arch "$(arch)" '{version: $version, platform: ("linux/" + $arch),
      images: [$pushed | split("\n")[] | split(" ") as $i | {name: $i[0], reference: ($i[1] | sub(":[^:/]*$"; "")),
               digest: $i[2], sbom: ($sboms | map(select(startswith("sbom/" + $i[0] + "."))))}],
      chart: {reference: ("oci://" + $host + "/charts/kimik3-operator"), version: $version, digest: $chart}}' \
    >"$out/release.json" || die "jq release.json"
  (cd "$out" && sha256sum -- release.json *.tgz *.whl sbom/*.json) >"$out/SHA256SUMS"
  chmod 755 "$out"  # mktemp's 700 would keep the assets from anyone else
  rm -rf "$final" && mv "$out" "$final" && trap - EXIT
  log "release $version in $final (chart oci://$host/charts/kimik3-operator:$version $chart_digest)"
}

# The content an image is built from: every file under PATH... (relative to the repository), bytecode
# caches left out. Labelled on the image (SOURCE_LABEL), so an unchanged source is not built again.
SOURCE_LABEL=dev.kimik3.source
source_digest() {
  (cd "$ROOT" && find "$@" -type f ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) |
    sha256sum | cut -c1-16
}

# build NAME TAG DOCKERFILE CONTEXT PATH...: PATHs are what the image is built from (its source).
# Why not podman's layer cache alone: buildah 1.28 keys a `RUN --mount=type=bind,from=<stage>` step
# on its command, not on the mounted stage's content, so a changed wheel in the operator's build
# stage left the cached runtime layer with the old code (seen here). An image whose source changed
# is built without the cache; an unchanged one is not built at all.
build() {
  local name=$1 tag=$2 dockerfile=$3 context=$4 t0=$SECONDS digest
  shift 4
  digest="$(source_digest "$@")"
  if podman image exists "$tag" &&
    [[ "$(podman image inspect -f "{{index .Labels \"$SOURCE_LABEL\"}}" "$tag")" == "$digest" ]]; then
    log "$name unchanged (source $digest)"
  else
    local mounts=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
    [[ -f /etc/pip.conf ]] && mounts+=(-v /etc/pip.conf:/etc/pip.conf:ro)
    # Buildah gives RUN steps limits of its own unless told; ours stay within the VM's hard limits.
    local limits=(--ulimit "nofile=$(ulimit -Sn):$(ulimit -Hn)" --ulimit "nproc=$NPROC:$NPROC")
    podman build --quiet --pull=never --no-cache --platform "linux/$(arch)" --network host "${mounts[@]}" \
      "${limits[@]}" --label "$SOURCE_LABEL=$digest" -f "$dockerfile" -t "$tag" "$context" >"$IMAGES/build-$name.log" 2>&1 \
      || { tail -n 30 "$IMAGES/build-$name.log" >&2; die "podman build of $name (log $IMAGES/build-$name.log)"; }
    log "$name built in $((SECONDS - t0))s (source $digest)"
  fi
  podman image prune -f >/dev/null # what an earlier build of this image left
  printf '%s %s %s\n' "$name" "$tag" "$(podman image inspect -f '{{.Id}}' "$tag")"
}

# The tags the chart and the planner expect (planner/images.py), read from the code, not copied
# (by text: the build needs no Python packages).
image_tags() {
  local images="$ROOT/operator/kimik3_operator/planner/images.py" repo version vllm_router
  repo="$(sed -n 's/^IMAGE_REPOSITORY = "\(.*\)"$/\1/p' "$images")"
  vllm_router="$(sed -n 's/^VLLM_ROUTER_VERSION = "\(.*\)"$/\1/p' "$images")"
  version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ROOT/operator/kimik3_operator/__init__.py")"
  [[ -n $repo && -n $vllm_router && -n $version ]] || die "could not read the image tags from planner/images.py"
  echo "$repo/kimik3-operator:$version"
  echo "$repo/kimik3-router:$version"
  echo "$repo/vllm-router:$vllm_router"
}

main() {
  if [[ ${1:-} == tags ]]; then image_tags; return 0; fi
  mkdir -p "$IMAGES"
  write_conf
  eval "$(podman_env)"
  if [[ ${1:-} == env ]]; then podman_env; return 0; fi
  if [[ ${1:-} == retag ]]; then
    exec 9>"$IMAGES/.lock"
    flock 9
    [[ -n ${3:-} ]] || die "usage: build.sh retag FROM TO"
    podman tag "$2" "$3" && podman push --quiet --tls-verify=false "$3" >/dev/null && podman untag "$3" "$3" ||
      die "retag $2 as $3"
    return 0
  fi
  # One build at a time on this storage (the demo's and the tests' may overlap): `podman image
  # prune` would take another build's unnamed stage.
  exec 9>"$IMAGES/.lock"
  flock 9
  ensure_packages
  # A build killed midway (Ctrl-C, a timeout) leaves buildah's working containers behind, and the
  # next build's `podman image prune` then fails on the images they hold. Under the lock no build
  # runs, so every working container left is such a leftover.
  local leftovers
  leftovers="$(podman ps -a --external --format '{{.ID}} {{.Command}}' | awk '$2 == "buildah" {print $1}')"
  # shellcheck disable=SC2086 # one argument per container id
  [[ -z $leftovers ]] || podman rm -f $leftovers >/dev/null
  ensure_base
  local tags; mapfile -t tags < <(image_tags)
  TAGS=("${tags[@]}")
  if [[ ${1:-} == push || ${1:-} == release ]]; then exec 4>&2; else exec 4>&1; fi # they print only what they pushed
  # The operator's source as its Dockerfile.dockerignore lets it into the build.
  build operator "${tags[0]}" "$ROOT/images/operator/Dockerfile" "$ROOT" \
    pyproject.toml README.md constraints.txt images/operator operator >&4
  # The crate's source as its Dockerfile.dockerignore lets it into the build (not router/target).
  build router "${tags[1]}" "$ROOT/images/router/Dockerfile" "$ROOT" images/router router/Cargo.toml \
    router/Cargo.lock router/src >&4
  build vllm-router "${tags[2]}" "$ROOT/images/vllm-router/Dockerfile" "$ROOT/images/vllm-router" images/vllm-router >&4
  if [[ ${1:-} == push ]]; then
    [[ -n ${2:-} ]] || die "usage: build.sh push HOST:PORT"
    push operator "$2" "${tags[0]}"
    push router "$2" "${tags[1]}"
    push vllm-router "$2" "${tags[2]}"
    push_chart "$2"
  elif [[ ${1:-} == release ]]; then
    [[ -n ${2:-} && -n ${3:-} ]] || die "usage: build.sh release HOST:PORT OUT"
    release "$2" "$3"
  fi
}

main "$@"
