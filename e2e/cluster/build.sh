#!/usr/bin/env bash
# Build the local cluster's binaries from the Go module proxy, once per pinned version.
#
# Everything lands in one cache folder outside the repository (KIMIK3_CACHE, default
# ~/.cache/kimik3-e2e): bin/<component>-v<version>/ for binaries and go/{mod,build} for Go's
# caches, so a rebuild after a version bump reuses every module that did not change.
# A component whose binaries exist is skipped; each build prints its wall time.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$HERE/versions.env"
CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}"
BIN="$CACHE/bin"
export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build"
export CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false" GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
mkdir -p "$BIN" "$GOMODCACHE" "$GOCACHE"
TIMES="$CACHE/build-times.log"

log() { printf '[build] %s\n' "$*" >&2; }

timed() { # timed NAME CMD...: run a build step and record its wall time
  local name=$1; shift
  local t0=$SECONDS
  "$@"
  local dt=$((SECONDS - t0))
  if ((dt > 0)); then # a cache hit takes no measurable time and is not a build
    printf '%s\t%s\t%ss\n' "$(date -u +%FT%TZ)" "$name" "$dt" >>"$TIMES"
    log "$name built in ${dt}s"
  else
    log "$name cached"
  fi
}

first_line() { # first_line CMD...: the first line of CMD's output. Not `| head -1`: under pipefail
  # the command can die of SIGPIPE when head exits early, failing the build at random.
  local out
  out="$("$@" 2>&1)"
  printf '%s\n' "${out%%$'\n'*}"
}

module_dir() { # module_dir MODULE@VERSION: where the module proxy unpacked it
  (cd "$(mktemp -d)" && go mod download -json "$1") | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'
}

build_etcd() {
  local out="$BIN/etcd-v$ETCD_VERSION"
  [[ -x "$out/etcd" ]] && return 0
  local w; w="$(mktemp -d)"
  (
    cd "$w"
    go mod init local/etcd-bin >/dev/null 2>&1
    go mod edit -require="go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
    printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >tools.go
    go mod tidy
    go build -o "$w/etcd" -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=v$ETCD_VERSION" go.etcd.io/etcd/server/v3
  )
  mkdir -p "$out" && mv "$w/etcd" "$out/etcd" && rm -rf "$w"
  first_line "$out/etcd" --version >&2
}

build_k8s() {
  local out="$BIN/k8s-v$K8S_VERSION"
  local b
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
    [[ -x "$out/$b" ]] || break
    [[ $b == kubectl ]] && return 0
  done
  local minor="${K8S_VERSION#1.}"; minor="${minor%%.*}"
  local staging="v0.${K8S_VERSION#1.}"
  local w; w="$(mktemp -d)"
  (
    cd "$w"
    # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with ./staging in
    # its own go.mod; a consumer must replace each with the published tag. Read the list from the
    # release's own go.mod so a new staging repo never breaks the build.
    local info kmod kjson gover commit staged m
    info="$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION")"
    kmod="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["GoMod"])' "$info")"
    commit="$(python3 -c 'import json,sys; print((json.loads(sys.argv[1]).get("Origin") or {}).get("Hash") or "unknown")' "$info")"
    kjson="$(go mod edit -json "$kmod")"
    gover="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["Go"])' "$kjson")"
    staged="$(python3 -c '
import json, sys
for r in json.loads(sys.argv[1]).get("Replace") or []:
    if r["New"]["Path"].startswith("./staging/"):
        print(r["Old"]["Path"])' "$kjson")"
    go mod init local/k8s-bins >/dev/null 2>&1
    go mod edit -go="$gover"
    for m in $staged; do go mod edit -replace="$m=$m@$staging"; done
    go mod edit -require="k8s.io/kubernetes@v$K8S_VERSION"
    cat >tools.go <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOF
    go mod tidy
    # Version stamping as upstream's hack/lib/version.sh does: without it /version reports
    # v0.0.0-master and helm's kubeVersion checks and kubectl skew warnings go wrong.
    local ldf="-s -w" p
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldf+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
      ldf+=" -X $p.gitCommit=$commit -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
    done
    # One go build for all five mains (the kubelet runs the real node, node.sh) so shared packages
    # compile once; -pgo=off because the apiserver's default.pgo would recompile the graph under a
    # profile for no test benefit.
    mkdir -p "$w/out"
    go build -p 2 -pgo=off -ldflags "$ldf" -o "$w/out/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl
  )
  mkdir -p "$out" && mv "$w"/out/* "$out/" && rm -rf "$w"
  local version
  version="$("$out/kube-apiserver" --version)"
  log "$version"
  [[ $version == *"v$K8S_VERSION"* ]] || { log "kube-apiserver is not stamped v$K8S_VERSION"; exit 1; }
}

build_kwok() {
  local out="$BIN/kwok-v$KWOK_VERSION"
  [[ -x "$out/kwok" ]] && return 0
  mkdir -p "$out.tmp"
  GOBIN="$out.tmp" go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
  rm -rf "$out" && mv "$out.tmp" "$out"
}

build_lws() {
  local out="$BIN/lws-v$LWS_VERSION"
  [[ -x "$out/lws-manager" ]] && return 0
  # A wrapper module, not `go install sigs.k8s.io/lws/cmd@vX`: `go install pkg@version` also reads
  # the module's version list (for deprecation notices), and the proxy answers 403 for
  # sigs.k8s.io/lws/@v/list, which makes go install fail even for a version it serves.
  local w; w="$(mktemp -d)"
  (
    cd "$w"
    go mod init local/lws-bin >/dev/null 2>&1
    go mod edit -require="sigs.k8s.io/lws@v$LWS_VERSION"
    printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/lws/cmd"\n' >tools.go
    go mod tidy
    go build -o "$w/lws-manager" -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=v$LWS_VERSION" \
      sigs.k8s.io/lws/cmd
  )
  mkdir -p "$out" && mv "$w/lws-manager" "$out/lws-manager" && rm -rf "$w"
  first_line "$out/lws-manager" --version >&2
}

# Kueue (project issue 25 item 2), built in its module directory like KEDA (its own go.mod and go.sum:
# the dependency graph its release was tested with). Kueue run with its own certificates (not its
# internal cert-controller, whose certificate names only <service>.<namespace>.svc) reads the metrics
# server's from a fixed /etc/kueue/metrics/certs (cmd/kueue/main.go); here nothing is written outside
# the cache, so that one literal becomes $KUEUE_METRICS_CERT_DIR. Only the manager is built.
build_kueue() {
  local out="$BIN/kueue-v$KUEUE_VERSION"
  [[ -x "$out/kueue-manager" ]] && return 0
  local w main
  w="$(mktemp -d)"
  cp -r "$(module_dir "sigs.k8s.io/kueue@v$KUEUE_VERSION")" "$w/src"
  chmod -R u+w "$w/src"
  main="$w/src/cmd/kueue/main.go"
  sed -i 's|metricsCertPath := "/etc/kueue/metrics/certs"|metricsCertPath := os.Getenv("KUEUE_METRICS_CERT_DIR")|' "$main"
  grep -q 'metricsCertPath := os.Getenv("KUEUE_METRICS_CERT_DIR")' "$main" ||
    { log "Kueue's cmd/kueue/main.go no longer has the line build_kueue rewrites; check its metrics cert path"; exit 1; }
  (cd "$w/src" && go build -p 2 -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=v$KUEUE_VERSION" \
    -o "$w/kueue-manager" ./cmd/kueue)
  mkdir -p "$out" && mv "$w/kueue-manager" "$out/" && rm -rf "$w"
}

# The Prometheus Operator and its CRDs (the monitoring proof only, versions.env). Built in its module
# directory: its go.mod replaces pkg/apis/monitoring and pkg/client with ./ folders that the module's
# zip leaves out (the proxy serves them as modules of their own), so those are copied in where the
# replaces point; the CRDs come from the module's example/prometheus-operator-crd.
build_prometheus_operator() {
  local out="$BIN/prometheus-operator-v$PROMETHEUS_OPERATOR_VERSION"
  [[ -x "$out/operator" ]] && return 0
  local mod="github.com/prometheus-operator/prometheus-operator" w sub
  w="$(mktemp -d)"
  cp -r "$(module_dir "$mod@v$PROMETHEUS_OPERATOR_VERSION")" "$w/src"
  chmod -R u+w "$w/src"
  for sub in pkg/apis/monitoring pkg/client; do
    [[ ! -e "$w/src/$sub" ]] || { log "$mod v$PROMETHEUS_OPERATOR_VERSION now ships $sub: drop its copy"; exit 1; }
    mkdir -p "$(dirname "$w/src/$sub")" && cp -r "$(module_dir "$mod/$sub@v$PROMETHEUS_OPERATOR_VERSION")" "$w/src/$sub"
  done
  chmod -R u+w "$w/src"
  (cd "$w/src" && go build -p 2 -ldflags "-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_OPERATOR_VERSION" \
    -o "$w/operator" ./cmd/operator)
  rm -rf "$out.tmp" && mkdir -p "$out.tmp/crds"
  mv "$w/operator" "$out.tmp/" && cp "$w/src/example/prometheus-operator-crd/"*.yaml "$out.tmp/crds/"
  rm -rf "$w" "$out" && mv "$out.tmp" "$out"
  first_line "$out/operator" --version >&2
}

# Prometheus v3 from the module proxy, with the Kubernetes service discovery (versions.env: Debian's
# has none): the monitoring proof runs the Prometheus Operator's configuration on it. In the module's
# directory (its go.mod's replaces and versions), without its go.work, which names folders the zip
# leaves out; the web UI's assets are not built (the HTTP API is all the proof uses).
build_prometheus_source() {
  local out="$BIN/prometheus-source-v$PROMETHEUS_SOURCE_VERSION"
  [[ -x "$out/prometheus" && -x "$out/promtool" ]] && return 0
  local major minor patch w
  IFS=. read -r major minor patch <<<"$PROMETHEUS_SOURCE_VERSION"
  w="$(mktemp -d)"
  cp -r "$(module_dir "github.com/prometheus/prometheus@v0.$((major * 100 + minor)).$patch")" "$w/src"
  chmod -R u+w "$w/src"
  rm -f "$w/src/go.work" "$w/src/go.work.sum"
  (cd "$w/src" && go build -p 2 -tags remove_all_sd,enable_kubernetes_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_SOURCE_VERSION" \
    -o "$w/" ./cmd/prometheus ./cmd/promtool)
  rm -rf "$out" && mkdir -p "$out" && mv "$w/prometheus" "$w/promtool" "$out/" && rm -rf "$w"
  first_line "$out/prometheus" --version >&2
}

build_helm() {
  local out="$BIN/helm-v$HELM_VERSION"
  [[ -x "$out/helm" ]] && return 0
  mkdir -p "$out.tmp"
  GOBIN="$out.tmp" go install -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@v$HELM_VERSION"
  rm -rf "$out" && mv "$out.tmp" "$out"
  "$out/helm" version >&2
}

module_hash() { # module_hash MODULE@VERSION: the commit the proxy says the version is (or "unknown")
  (cd "$(mktemp -d)" && go mod download -json "$1") |
    python3 -c 'import json,sys; print((json.load(sys.stdin).get("Origin") or {}).get("Hash") or "unknown")'
}

# Debian bookworm's Prometheus, unpacked, not installed: `apt-get download` fetches the .deb of
# exactly the pinned version (apt fails when the archive no longer has it) and `dpkg-deb -x` unpacks
# it, so no maintainer script runs, no user or service is created and nothing outside the cache
# changes. The binary needs only libc; its web UI's JavaScript (other packages) is not needed.
build_prometheus() {
  local out="$BIN/prometheus-v$PROMETHEUS_DEB_VERSION"
  [[ -x "$out/prometheus" ]] && return 0
  local w; w="$(mktemp -d)"
  (
    cd "$w"
    # The sandbox user cannot write into our private temp folder; root downloading is expected here.
    apt-get download -q -o APT::Sandbox::User=root "prometheus=$PROMETHEUS_DEB_VERSION" >&2
    dpkg-deb -x prometheus_*.deb root
  )
  mkdir -p "$out" && mv "$w/root/usr/bin/prometheus" "$w/root/usr/bin/promtool" "$out/" && rm -rf "$w"
  first_line "$out/prometheus" --version >&2
}

# KEDA's go.mod has a replace directive, which `go install pkg@version` refuses and a wrapper module
# would ignore (replaces only apply in the main module), so build in the module's own tree with its
# own go.mod and go.sum: the dependency graph KEDA's release was tested with. The operator and the
# metrics API server only; the admission webhooks are not used here.
build_keda() {
  local out="$BIN/keda-v$KEDA_VERSION"
  [[ -x "$out/keda" && -x "$out/keda-adapter" ]] && return 0
  local mod="github.com/kedacore/keda/v2@v$KEDA_VERSION" commit w
  commit="$(module_hash "$mod")"
  w="$(mktemp -d)"
  # A copy of the module (12 MB), not the module cache's read-only tree: the metrics API server
  # binds its own /metrics to all interfaces (":<--port>" in cmd/adapter/main.go, no flag for the
  # host), and here everything listens on loopback, so that one line is changed to 127.0.0.1.
  # (`go build -overlay` would do it without a copy, but refuses files under GOMODCACHE.)
  cp -r "$(module_dir "$mod")" "$w/src"
  chmod -R u+w "$w/src"
  local main="$w/src/cmd/adapter/main.go"
  sed -i 's|fmt.Sprintf(":%v", metricsAPIServerPort)|fmt.Sprintf("127.0.0.1:%v", metricsAPIServerPort)|' "$main"
  grep -q '"127.0.0.1:%v", metricsAPIServerPort' "$main" ||
    { log "KEDA's cmd/adapter/main.go no longer has the line build_keda rewrites; check its metrics address"; exit 1; }
  # Stamped as KEDA's Makefile does (GO_LDFLAGS), so its start-up log names the version.
  (cd "$w/src" && go build -p 2 -ldflags "-s -w -X=github.com/kedacore/keda/v2/version.GitCommit=$commit \
    -X=github.com/kedacore/keda/v2/version.Version=$KEDA_VERSION" -o "$w/" ./cmd/operator ./cmd/adapter)
  mkdir -p "$out" && mv "$w/operator" "$out/keda" && mv "$w/adapter" "$out/keda-adapter" && rm -rf "$w"
}

# Built in its module directory like KEDA: `go install ...@v0.12.0` also reads the version list,
# which the proxy serves empty for this module.
build_prometheus_adapter() {
  local out="$BIN/prometheus-adapter-v$PROMETHEUS_ADAPTER_VERSION"
  [[ -x "$out/prometheus-adapter" ]] && return 0
  local src w
  src="$(module_dir "sigs.k8s.io/prometheus-adapter@v$PROMETHEUS_ADAPTER_VERSION")"
  w="$(mktemp -d)"
  (cd "$src" && go build -p 2 -ldflags "-s -w" -o "$w/prometheus-adapter" ./cmd/adapter)
  mkdir -p "$out" && mv "$w/prometheus-adapter" "$out/" && rm -rf "$w"
}

# Gateway API's standard-channel CRDs an HTTPRoute needs (HTTPRoute, Gateway, GatewayClass,
# ReferenceGrant), from the module proxy. The module's go.mod asks for a newer Go than this machine's,
# so `go mod download` fetches and checks the zip (against the checksum database) but will not unpack
# it: its hash must be the pinned one, and only those four files are taken out of it.
build_gateway_api() {
  local out="$BIN/gateway-api-v$GATEWAY_API_VERSION" info
  [[ -f "$out/gateway.networking.k8s.io_httproutes.yaml" ]] && return 0
  info="$(cd "$(mktemp -d)" && GOTOOLCHAIN=local go mod download -json "sigs.k8s.io/gateway-api@v$GATEWAY_API_VERSION")" || true
  python3 - "$info" "$GATEWAY_API_VERSION" "$GATEWAY_API_SUM" "$out" <<'PY'
import json, pathlib, shutil, sys, zipfile

info, version, want, out = json.loads(sys.argv[1] or "{}"), sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4])
if not info.get("Zip") or info.get("Sum") != want:
    sys.exit(f"sigs.k8s.io/gateway-api@v{version}: zip {info.get('Zip')!r} with sum {info.get('Sum')!r}, "
             f"pinned {want}: {info.get('Error')}")
tmp = out.with_name(out.name + ".tmp")
shutil.rmtree(tmp, ignore_errors=True)
tmp.mkdir(parents=True)
with zipfile.ZipFile(info["Zip"]) as z:
    for kind in ("gatewayclasses", "gateways", "httproutes", "referencegrants"):
        name = f"gateway.networking.k8s.io_{kind}.yaml"
        (tmp / name).write_bytes(z.read(f"sigs.k8s.io/gateway-api@v{version}/config/crd/standard/{name}"))
tmp.rename(out)
PY
}

# Two lanes, each one component after another, balanced by their cold build times (k8s and KEDA, the
# two longest, in different lanes). Each `go build` keeps both cores busy while it compiles, but a
# cold build also spends minutes on module downloads and on single-threaded steps (`go mod tidy`,
# linking, Debian and proxy fetches); the other lane fills those. Measured cold on 2 cores: 1,597 s
# one after another, 1,490 s in two lanes (bench/README.md, "CI time").
LANES=("k8s helm etcd kwok gateway_api prometheus prometheus_adapter prometheus_operator" "keda kueue lws prometheus_source")

lane() { # lane COMPONENT...: build them in order; the first failure ends the lane (set -e)
  local c
  for c in "$@"; do timed "$c" "build_$c"; done
}

main() {
  # One builder at a time: a second caller waits for the first and then finds everything cached.
  exec 9>"$CACHE/.build.lock"
  flock 9
  local t0=$SECONDS pids=() failed=() i
  if (($#)); then
    lane "$@"
  else
    # shellcheck disable=SC2086 # a lane is a list of words
    for i in "${!LANES[@]}"; do lane ${LANES[$i]} & pids[i]=$!; done
    for i in "${!LANES[@]}"; do wait "${pids[$i]}" || failed+=("(${LANES[$i]})"); done
    ((${#failed[@]} == 0)) || { log "FAILED: the lanes that build ${failed[*]} stopped (their errors are above)"; exit 1; }
  fi
  log "all components ready in $((SECONDS - t0))s under $BIN"
}

main "$@"
