#!/usr/bin/env bash
# Smoke test of the local cluster itself (not of the operator): a two-pod LeaderWorkerSet asking
# for 8 GPUs per pod on the B200 pool must be admitted by the LWS webhooks, scheduled onto two
# fake nodes, labelled by LWS and become Ready through kwok. Runs in a throwaway namespace.
#   e2e/cluster/cluster.sh up >/dev/null && e2e/cluster/smoke.sh
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
eval "$("$HERE/cluster.sh" env)"
NS="smoke-$$"
t0=$SECONDS

log() { printf '[smoke] %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; kubectl -n "$NS" get lws,pods -o wide >&2 || true; exit 1; }
cleanup() { kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true; }
trap cleanup EXIT

poll() { # poll TIMEOUT_S WHAT CMD...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "timed out waiting for $what"
    sleep 0.25
  done
}

kubectl create namespace "$NS" >/dev/null
poll 30 "the default ServiceAccount" kubectl -n "$NS" get serviceaccount default
kubectl -n "$NS" apply -f - >/dev/null <<'EOF'
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata:
  name: smoke
spec:
  replicas: 1
  leaderWorkerTemplate:
    size: 2
    workerTemplate:
      spec:
        nodeSelector:
          nvidia.com/gpu.product: NVIDIA-B200
        containers:
        - name: engine
          image: registry.invalid/never-pulled:0
          resources:
            limits:
              nvidia.com/gpu: "8"
EOF

lws_ready() { [[ $(kubectl -n "$NS" get lws smoke -o jsonpath='{.status.readyReplicas}') == 1 ]]; }
poll 60 "the LeaderWorkerSet to report 1 ready replica" lws_ready

# Two pods on two different B200 nodes, worker-index 0 and 1 (set by the LWS pod webhook).
pods="$(kubectl -n "$NS" get pods -o jsonpath='{range .items[*]}{.metadata.labels.leaderworkerset\.sigs\.k8s\.io/worker-index} {.spec.nodeName} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | sort)"
log "pods (worker-index node ready):"
printf '%s\n' "$pods" | sed 's/^/  /' >&2
[[ $(awk '{print $1}' <<<"$pods" | tr '\n' ' ') == "0 1 " ]] || fail "expected worker-index 0 and 1"
[[ $(awk '{print $2}' <<<"$pods" | sort -u | grep -c '^b200-') == 2 ]] || fail "expected two distinct B200 nodes"
[[ $(awk '$3 == "True"' <<<"$pods" | wc -l) == 2 ]] || fail "expected both pods Ready"
env="$(kubectl -n "$NS" get pod smoke-0-1 -o jsonpath='{.spec.containers[0].env[*].name}')"
[[ $env == *LWS_LEADER_ADDRESS* && $env == *LWS_WORKER_INDEX* ]] || fail "LWS env vars not injected"

log "ok in $((SECONDS - t0))s"
