#!/usr/bin/env bash
# The main job on one machine: bring up the local real cluster (fake GB300/B200/H200 GPU nodes and
# one real node), build the operator image and push it with the chart to the cluster's registry,
# helm-install the chart from there (the operator runs as real pods on the real node), apply an
# example KimiK3Deployment and show what it became.
#
#   scripts/demo.sh [EXAMPLE.yaml]   default: manifests/examples/pd-gb300-decode-b200-prefill.yaml
#   scripts/demo.sh down             stop the cluster (and the operator's pods with it)
#
# Everything keeps running in the background, so you can keep using kubectl:
# eval "$(e2e/cluster/cluster.sh env)"; kubectl get k3 -A; kubectl -n kimik3-system logs deploy/kimik3-operator
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}"
STATE="${KIMIK3_STATE:-$CACHE/state}"
STAGER_PIDFILE="$STATE/run/stager.pid"
STAGER_LOG="$STATE/logs/stager.log"
PODS_PIDFILE="$STATE/run/pod-runner.pid"
PODS_LOG="$STATE/logs/pod-runner.log"

stop_pidfile() {
  local pidfile=$1
  if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill "$(cat "$pidfile")"
    for _ in $(seq 30); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 1; done
  fi
  rm -f "$pidfile"
}
# The host processes that play the fake nodes' pods (kwok runs no containers), and a host operator
# an older demo left running.
stop_players() { stop_pidfile "$STATE/run/operator.pid"; stop_pidfile "$STAGER_PIDFILE"; stop_pidfile "$PODS_PIDFILE"; }

if [[ "${1:-}" == down ]]; then
  stop_players
  exec "$ROOT/e2e/cluster/cluster.sh" down
fi
EXAMPLE="${1:-$ROOT/manifests/examples/pd-gb300-decode-b200-prefill.yaml}"

VENV="$("$ROOT/scripts/venv.sh")"
t0=$SECONDS
"$ROOT/e2e/cluster/cluster.sh" up >/dev/null
eval "$("$ROOT/e2e/cluster/cluster.sh" env)"
echo "== cluster up in $((SECONDS - t0))s; KUBECONFIG=$KUBECONFIG"

# A release from the tree (e2e/images/build.sh release; docs/release.md): the images from their
# Dockerfiles (podman; cached), pushed to the cluster's registry with the chart that pins each by
# digest, and the release's assets (release.json, SBOMs, the CLI's wheel) in the folder the install
# guide names. Then the operator is installed by the guide's own blocks (docs/install.md: the CLI from
# the wheel, preflight, helm from oci:// with this site's values, helm test), the registry
# substituted: the operator's pods run on the real node (its taint and label), the webhook answers
# through its Service, the operator keeps its certificate.
t1=$SECONDS
GUIDE="$STATE/guide"
VERSION="$("$ROOT/e2e/images/build.sh" tags | sed -n 1p)" && VERSION="${VERSION##*:}"  # the operator image's tag
mkdir -p "$GUIDE"
rm -rf "$GUIDE/.local/kimik3"  # the guide's CLI venv: a re-run installs this tree's wheel, not keeps the last
"$ROOT/e2e/images/build.sh" release "$KIMIK3_REGISTRY" "$GUIDE/kimik3-operator-$VERSION" >/dev/null
OPERATOR_DIGEST="$(jq -r '.images[] | select(.name == "operator") | .digest' "$GUIDE/kimik3-operator-$VERSION/release.json")"
[[ $OPERATOR_DIGEST == sha256:* ]] || { echo "FAILED: the release names no operator digest" >&2; exit 1; }
echo "== release $VERSION in oci://$KIMIK3_REGISTRY and $GUIDE/kimik3-operator-$VERSION in $((SECONDS - t1))s"
stop_players
# The operator's pods read the cluster's Prometheus (a host process, which scrapes the played engines)
# where the real node's pods reach it: on an address of the played pods' loopback range
# (cluster.sh prometheus_host), so the SLO scaler and the Disaggregating condition have data, as with
# `autoscaling.prometheusUrl: http://prometheus-operated.monitoring:9090` on a cluster.
PROMETHEUS_URL="$KIMIK3_PROMETHEUS_URL"
jq -n --arg key "${KIMIK3_REAL_NODE_TAINT%%=*}" --arg prometheus "$PROMETHEUS_URL" \
  '{tolerations: [{key: $key, operator: "Exists"}], nodeSelector: {"kimik3.dev/e2e-node": "real"},
    autoscaling: {prometheusUrl: $prometheus}}' >"$GUIDE/site-values.yaml"
# The CLI's venv and pip's downloads: the guide's HOME is its folder, pip's cache stays the machine's;
# the dependencies at the project's pins (a user gets the newest within the package's bounds).
t1=$SECONDS
PIP_CACHE_DIR="${PIP_CACHE_DIR:-$HOME/.cache/pip}" PIP_CONSTRAINT="$ROOT/constraints.txt" \
  "$ROOT/scripts/guide.sh" --in "$GUIDE" --set "registry.example.com=$KIMIK3_REGISTRY" \
  --set "/charts/kimik3-operator --version=/charts/kimik3-operator --plain-http --version" cli install
echo "== installed by docs/install.md's blocks in $((SECONDS - t1))s"
# Pulled by containerd from the registry by that digest, not imported or taken by tag (a re-run's
# replaced pods may take a moment to go).
want="$KIMIK3_REGISTRY/kimik3-operator/kimik3-operator@$OPERATOR_DIGEST"
for _ in $(seq 60); do
  pulled="$(kubectl -n kimik3-system get pods -l app.kubernetes.io/name=kimik3-operator \
    -o jsonpath='{range .items[*]}{.status.containerStatuses[0].imageID}{"\n"}{end}' | sort -u)"
  [[ $pulled == "$want" ]] && break
  sleep 2
done
[[ $pulled == "$want" ]] || { echo "FAILED: the operator pods run $pulled, not the pushed $want" >&2; exit 1; }
echo "== operator pulled by digest $OPERATOR_DIGEST"
# The guide's way to the leader's logs, once a pod of this install holds the Lease (after a
# re-install the Lease names a pod of the last one until it expires).
for _ in $(seq 60); do
  holder="$(kubectl -n kimik3-system get lease kimik3-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null)" || true
  [[ -n $holder ]] && kubectl -n kimik3-system get pod "${holder%%_*}" >/dev/null 2>&1 && break
  sleep 2
done
"$ROOT/scripts/guide.sh" --in "$GUIDE" logs | tail -n 3
echo "== operator running as real pods on $KIMIK3_REAL_NODE (logs: kubectl -n kimik3-system logs deploy/kimik3-operator)"
# kwok runs no containers: the stager runs each weights-staging pod's real command on this host,
# against a fake Hub and S3 on loopback (e2e/harness/stager.py), so the deployment can become Ready.
# Redirected as a whole: a subshell that kept the caller's stdout would hold `demo.sh | tee` open.
(cd "$ROOT" && exec setsid "$VENV/bin/python" -m e2e.harness.stager "$STATE/stager" "$STAGER_PIDFILE") \
  >"$STAGER_LOG" 2>&1 </dev/null &
for _ in $(seq 50); do [[ -s $STAGER_PIDFILE ]] && break; sleep 0.2; done
echo "== weights stager running (pid $(cat "$STAGER_PIDFILE"), log $STAGER_LOG)"
# Likewise the serving and router pods: each leader pod's rendered command runs the Kimi K3 engine
# simulator and each router pod's the real router its image names (kimik3-router, built here from
# router/ by cargo; or vllm-router), on loopback ports (e2e/harness/pod_runner.py). Both built first,
# so the runner starts at once.
"$ROOT/scripts/router-venv.sh" >/dev/null
"$ROOT/scripts/router-build.sh" >/dev/null
(cd "$ROOT" && exec setsid "$VENV/bin/python" -m e2e.harness.pod_runner "$STATE/pods" "$PODS_PIDFILE") \
  >"$PODS_LOG" 2>&1 </dev/null &
for _ in $(seq 50); do [[ -s $PODS_PIDFILE ]] && break; sleep 0.2; done
echo "== pod runner running (pid $(cat "$PODS_PIDFILE"), log $PODS_LOG, ports in $STATE/pods/pods.json)"

read -r ns name < <("$VENV/bin/python" -c '
import sys, yaml
meta = yaml.safe_load(open(sys.argv[1]))["metadata"]
print(meta.get("namespace", "default"), meta["name"])' "$EXAMPLE")
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
# The pod runner plays this namespace's serving and router pods (e2e/cluster/played-pods.yaml).
kubectl label namespace "$ns" kwok.kimik3.dev/played=true --overwrite >/dev/null
# The examples read the Hub token from this Secret (the fake Hub takes any token).
kubectl -n "$ns" create secret generic hf-token --from-literal=token=hf_demo_token --dry-run=client -o yaml \
  | kubectl apply -f - >/dev/null
kubectl apply -f "$EXAMPLE"
echo "== waiting for $ns/$name to become Ready"
ready=1
if ! kubectl -n "$ns" wait --for=condition=Ready "k3/$name" --timeout=180s; then
  echo "not Ready in time; status:" >&2
  ready=0
fi
echo
kubectl -n "$ns" get k3 "$name"
echo
kubectl -n "$ns" describe k3 "$name" | sed -n '/^Status:/,$p'
echo
kubectl -n "$ns" get leaderworkersets,services -l "serving.kimik3.dev/deployment=$name"
echo
kubectl -n "$ns" get pods -o wide -l "serving.kimik3.dev/deployment=$name"
echo
if [[ $ready == 1 ]]; then
  echo "== one chat request through the router (the endpoint above, played on loopback)"
  (cd "$ROOT" && "$VENV/bin/python" -m e2e.harness.traffic "$STATE/pods/pods.json" "$ns" "$name") || ready=0
  echo
fi
# Measured conditions (Disaggregating: the decode engines' prompt tokens by source, read from
# Prometheus at most every 30 s): they must have data, not NoMetrics or MetricsUnavailable.
measured='{range .status.conditions[?(@.type=="Disaggregating")]}{.status} {.reason}: {.message}{end}'
if [[ $ready == 1 ]] && kubectl -n "$ns" get k3 "$name" -o jsonpath='{.status.conditions[*].type}' \
    | grep -qw Disaggregating; then
  for _ in $(seq 45); do
    said="$(kubectl -n "$ns" get k3 "$name" -o jsonpath="$measured")"
    [[ $said =~ ^(True|False)\  ]] && break
    sleep 2
  done
  echo "== Disaggregating (from Prometheus at $PROMETHEUS_URL): $said"
  [[ $said =~ ^(True|False)\  ]] || { echo "FAILED: Disaggregating has no measurement: $said" >&2; ready=0; }
  echo
fi
echo "Stop everything with: scripts/demo.sh down"
if [[ $ready != 1 ]]; then
  kubectl -n kimik3-system logs deploy/kimik3-operator --tail=30 >&2 || true
  echo "FAILED: $ns/$name did not become Ready or serve (operator: kubectl -n kimik3-system logs" \
    "deploy/kimik3-operator, stager log: $STAGER_LOG, pod runner log: $PODS_LOG)" >&2
  exit 1
fi
