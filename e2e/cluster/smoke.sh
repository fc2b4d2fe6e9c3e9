#!/usr/bin/env bash
# Smoke test of the local cluster itself (not of the operator), in a throwaway namespace:
# - a two-pod LeaderWorkerSet asking for 8 GPUs per pod on the B200 pool must be admitted by the LWS
#   webhooks, scheduled onto two fake nodes, labelled by LWS and become Ready through kwok;
# - a ComputeDomain and a LeaderWorkerSet (2 groups of 2 GB300 trays) whose pods claim its channel,
#   as the operator renders them: the fake ComputeDomain controller must create the
#   ResourceClaimTemplate and mark the domain Ready, every pod's claim must be allocated channel-0 of
#   its own tray, each group must sit in one NVLink clique, and deleting the domain and the
#   LeaderWorkerSet must remove the claims and the template.
# Both workloads start together (kwok holds readiness back ~3 s); the whole test takes ~6 s.
#   e2e/cluster/cluster.sh up >/dev/null && e2e/cluster/smoke.sh
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
eval "$("$HERE/cluster.sh" env)"
NS="smoke-$$"
TMP="$(mktemp -d)"
t0=$SECONDS

log() { printf '[smoke] %s\n' "$*" >&2; }
fail() {
  log "FAILED: $*"
  kubectl -n "$NS" get lws,computedomains,resourceclaimtemplates,resourceclaims,pods -o wide >&2 || true
  exit 1
}
cleanup() {
  kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
  rm -rf "$TMP"
}
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
        tolerations:  # the fake GPU nodes carry the usual GPU taint (nodes/generate.py)
        - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
        containers:
        - name: engine
          image: registry.invalid/never-pulled:0
          resources:
            limits:
              nvidia.com/gpu: "8"
---
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: smoke-cd
spec:
  numNodes: 0
  channel:
    resourceClaimTemplate: {name: smoke-cd-channel}
    allocationMode: Single
---
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata:
  name: smoke-nvl
spec:
  replicas: 2
  leaderWorkerTemplate:
    size: 2
    workerTemplate:
      spec:
        nodeSelector:
          nvidia.com/gpu.product: NVIDIA-GB300
        tolerations:  # the fake GPU nodes carry the usual GPU taint (nodes/generate.py)
        - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
        affinity:
          podAffinity:
            requiredDuringSchedulingIgnoredDuringExecution:
            - labelSelector: {matchLabels: {leaderworkerset.sigs.k8s.io/name: smoke-nvl}}
              matchLabelKeys: [leaderworkerset.sigs.k8s.io/group-key]
              topologyKey: nvidia.com/gpu.clique
        resourceClaims:
        - {name: compute-domain-channel, resourceClaimTemplateName: smoke-cd-channel}
        containers:
        - name: engine
          image: registry.invalid/never-pulled:0
          resources:
            limits:
              nvidia.com/gpu: "4"
            claims:
            - name: compute-domain-channel
EOF

ready_replicas() { # ready_replicas LWS N
  [[ $(kubectl -n "$NS" get lws "$1" -o jsonpath='{.status.readyReplicas}') == "$2" ]]
}
poll 60 "the LeaderWorkerSet to report 1 ready replica" ready_replicas smoke 1

# Two pods on two different B200 nodes, worker-index 0 and 1 (set by the LWS pod webhook).
pods="$(kubectl -n "$NS" get pods -l leaderworkerset.sigs.k8s.io/name=smoke -o jsonpath='{range .items[*]}{.metadata.labels.leaderworkerset\.sigs\.k8s\.io/worker-index} {.spec.nodeName} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | sort)"
log "pods (worker-index node ready):"
printf '%s\n' "$pods" | sed 's/^/  /' >&2
[[ $(awk '{print $1}' <<<"$pods" | tr '\n' ' ') == "0 1 " ]] || fail "expected worker-index 0 and 1"
[[ $(awk '{print $2}' <<<"$pods" | sort -u | grep -c '^b200-') == 2 ]] || fail "expected two distinct B200 nodes"
[[ $(awk '$3 == "True"' <<<"$pods" | wc -l) == 2 ]] || fail "expected both pods Ready"
env="$(kubectl -n "$NS" get pod smoke-0-1 -o jsonpath='{.spec.containers[0].env[*].name}')"
[[ $env == *LWS_LEADER_ADDRESS* && $env == *LWS_WORKER_INDEX* ]] || fail "LWS env vars not injected"

# ComputeDomain: template, Ready status, one allocated channel per pod on its own tray, one clique per group.
poll 30 "the ComputeDomain LeaderWorkerSet to report 2 ready replicas" ready_replicas smoke-nvl 2
owner="$(kubectl -n "$NS" get resourceclaimtemplate smoke-cd-channel -o jsonpath='{.metadata.ownerReferences[0].name}')" ||
  fail "no ResourceClaimTemplate smoke-cd-channel"
[[ $owner == smoke-cd ]] || fail "ResourceClaimTemplate smoke-cd-channel is owned by '$owner', not smoke-cd"
[[ $(kubectl -n "$NS" get computedomain smoke-cd -o jsonpath='{.status.status}') == Ready ]] || fail "ComputeDomain not Ready"
kubectl -n "$NS" get pods -l leaderworkerset.sigs.k8s.io/name=smoke-nvl -o json >"$TMP/pods.json"
kubectl -n "$NS" get resourceclaims -o json >"$TMP/claims.json"
kubectl get nodes -l nvidia.com/gpu.clique -o json >"$TMP/nodes.json"
python3 - "$TMP" <<'PY' || fail "ComputeDomain pods, claims or cliques are wrong (above)"
import json, sys
d = sys.argv[1]
pods = json.load(open(f"{d}/pods.json"))["items"]
claims = {c["metadata"]["name"]: c for c in json.load(open(f"{d}/claims.json"))["items"]}
clique = {n["metadata"]["name"]: n["metadata"]["labels"]["nvidia.com/gpu.clique"] for n in json.load(open(f"{d}/nodes.json"))["items"]}
groups, ok = {}, len(pods) == 4
for p in pods:
    node = p["spec"].get("nodeName", "")
    group = p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"]
    groups.setdefault(group, set()).add(clique.get(node, "none"))
    status = p["status"].get("resourceClaimStatuses") or [{}]
    claim = claims.get(status[0].get("resourceClaimName") or "", {})
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
    got = [(r["driver"], r["pool"], r["device"]) for r in results]
    mine = got == [("compute-domain.nvidia.com", node, "channel-0")]
    ok &= mine
    print(f"  {p['metadata']['name']:<13} group {group} {node:<15} clique {clique.get(node, '-')[:8]}  claim {got}", file=sys.stderr)
ok &= sorted(groups) == ["0", "1"] and all(len(c) == 1 for c in groups.values())
sys.exit(0 if ok else 1)
PY

# Deleting the LeaderWorkerSet and the domain (as the operator's owner would) removes claims and template.
kubectl -n "$NS" delete lws smoke-nvl --wait=false >/dev/null
kubectl -n "$NS" delete computedomain smoke-cd --wait=false >/dev/null
cd_gone() { [[ -z $(kubectl -n "$NS" get resourceclaims,resourceclaimtemplates,computedomains -o name) ]]; }
poll 20 "the claims, the ResourceClaimTemplate and the ComputeDomain to be deleted" cd_gone

log "ok in $((SECONDS - t0))s"
