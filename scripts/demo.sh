#!/usr/bin/env bash
# The main job on one machine: bring up the local real cluster (fake GB300/B200/H200 GPU nodes),
# helm-install the chart, run the operator, apply an example KimiK3Deployment and show what it became.
#
#   scripts/demo.sh [EXAMPLE.yaml]   default: manifests/examples/pd-gb300-decode-b200-prefill.yaml
#   scripts/demo.sh down             stop the operator and the cluster
#
# The operator keeps running in the background (log: $KIMIK3_STATE/logs/operator.log), so you can
# keep using kubectl: eval "$(e2e/cluster/cluster.sh env)"; kubectl get k3 -A
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}"
STATE="${KIMIK3_STATE:-$CACHE/state}"
PIDFILE="$STATE/run/operator.pid"
OPLOG="$STATE/logs/operator.log"
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
stop_operator() { stop_pidfile "$PIDFILE"; stop_pidfile "$STAGER_PIDFILE"; stop_pidfile "$PODS_PIDFILE"; }

if [[ "${1:-}" == down ]]; then
  stop_operator
  exec "$ROOT/e2e/cluster/cluster.sh" down
fi
EXAMPLE="${1:-$ROOT/manifests/examples/pd-gb300-decode-b200-prefill.yaml}"

VENV="$("$ROOT/scripts/venv.sh")"
t0=$SECONDS
"$ROOT/e2e/cluster/cluster.sh" up >/dev/null
eval "$("$ROOT/e2e/cluster/cluster.sh" env)"
echo "== cluster up in $((SECONDS - t0))s; KUBECONFIG=$KUBECONFIG"

# The chart installs the CRD, the operator's ServiceAccount and its least-privilege RBAC (and a
# Deployment whose pod kwok only pretends to run); the operator itself runs on this host, acting as
# that ServiceAccount.
# The webhook is served by the host operator on loopback with a local certificate, so the API
# server calls 127.0.0.1, never the chart Service's (fake) cluster IP.
WEBHOOK_PORT="${KIMIK3_WEBHOOK_PORT:-9643}"  # 9443 is the local LWS webhook's
CA_BUNDLE="$("$ROOT/scripts/webhook-certs.sh" "$STATE/webhook")"
helm upgrade --install kimik3-operator "$ROOT/charts/kimik3-operator" -n kimik3-system --create-namespace \
  --set "webhook.url=https://127.0.0.1:$WEBHOOK_PORT/validate" --set "webhook.caBundle=$CA_BUNDLE"
kubectl wait --for=condition=Established crd/kimik3deployments.serving.kimik3.dev --timeout=60s

stop_operator
mkdir -p "$(dirname "$PIDFILE")" "$(dirname "$OPLOG")"
SA_KUBECONFIG="$("$ROOT/scripts/sa-kubeconfig.sh" kimik3-system kimik3-operator "$STATE/operator-sa.kubeconfig")"
LIVENESS_PORT="${KIMIK3_LIVENESS_PORT:-9644}"
KUBECONFIG="$SA_KUBECONFIG" setsid "$VENV/bin/kimik3" run --webhook-host 127.0.0.1 --webhook-port "$WEBHOOK_PORT" \
  --webhook-cert "$STATE/webhook/tls.crt" --webhook-key "$STATE/webhook/tls.key" \
  --liveness "http://127.0.0.1:$LIVENESS_PORT/healthz" >"$OPLOG" 2>&1 </dev/null &
echo $! >"$PIDFILE"
# Up when its liveness endpoint answers; a start-up failure (a bad kubeconfig, a port in use) ends it.
deadline=$((SECONDS + 60))
until curl -fsS --noproxy '*' "http://127.0.0.1:$LIVENESS_PORT/healthz" >/dev/null 2>&1; do
  if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null || ((SECONDS > deadline)); then
    tail -n 30 "$OPLOG" >&2
    echo "FAILED: the operator did not come up within 60 s (log: $OPLOG)" >&2
    exit 1
  fi
  sleep 0.2
done
echo "== operator running as ServiceAccount kimik3-system/kimik3-operator (pid $(cat "$PIDFILE"), log $OPLOG)"
# kwok runs no containers: the stager runs each weights-staging pod's real command on this host,
# against a fake Hub and S3 on loopback (e2e/tests/stager.py), so the deployment can become Ready.
# Redirected as a whole: a subshell that kept the caller's stdout would hold `demo.sh | tee` open.
(cd "$ROOT" && exec setsid "$VENV/bin/python" -m e2e.tests.stager "$STATE/stager" "$STAGER_PIDFILE") \
  >"$STAGER_LOG" 2>&1 </dev/null &
for _ in $(seq 50); do [[ -s $STAGER_PIDFILE ]] && break; sleep 0.2; done
echo "== weights stager running (pid $(cat "$STAGER_PIDFILE"), log $STAGER_LOG)"
# Likewise the serving and router pods: each leader pod's rendered command runs the Kimi K3 engine
# simulator and each router pod's the real vllm-router, on loopback ports (e2e/tests/pod_runner.py).
"$ROOT/scripts/router-venv.sh" >/dev/null
(cd "$ROOT" && exec setsid "$VENV/bin/python" -m e2e.tests.pod_runner "$STATE/pods" "$PODS_PIDFILE") \
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
  (cd "$ROOT" && "$VENV/bin/python" -m e2e.tests.traffic "$STATE/pods/pods.json" "$ns" "$name") || ready=0
  echo
fi
echo "Stop everything with: scripts/demo.sh down"
if [[ $ready != 1 ]]; then
  echo "FAILED: $ns/$name did not become Ready or serve (operator log: $OPLOG, stager log: $STAGER_LOG," \
    "pod runner log: $PODS_LOG)" >&2
  exit 1
fi
