#!/usr/bin/env bash
# The local real cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok (fake
# GPU nodes and pod lifecycle), the LeaderWorkerSet manager, Kueue, a stand-in for the ComputeDomain
# controller of NVIDIA's DRA driver (compute_domain_controller.py), the autoscaling metrics stack
# (Prometheus, the KEDA operator and metrics API server, prometheus-adapter), all as host processes
# on 127.0.0.1, and one real node (node.sh: a registry, containerd, the kubelet, Service rules).
#
#   cluster.sh up       build (cached), start what is not running, create the fake node pools;
#                       prints the kubeconfig path as the last line of stdout, all else to stderr
#   cluster.sh down     stop what `up` started (by pidfile) and delete the cluster's data
#   cluster.sh status   which components run (exit 1 unless all are healthy)
#   cluster.sh restart [--kill] COMPONENT...   stop running components (TERM, or KILL: a crash)
#                       and start them again as `up` does; waits until they are healthy (fault tests)
#   cluster.sh env      `export KUBECONFIG=...`, `export PATH=...` and the Prometheus lines (below):
#                       eval "$(cluster.sh env)"
#
# Environment:
#   KIMIK3_CACHE       binaries and Go caches (default ~/.cache/kimik3-e2e; shared with build.sh)
#   KIMIK3_STATE       pki, kubeconfigs, etcd data, logs, pidfiles (default $KIMIK3_CACHE/state)
#   KIMIK3_PORT_BASE   if set, ports are BASE+0..17 in the order of the list below; otherwise the
#                      usual defaults. One port can also be set alone:
#                      KIMIK3_ETCD_PORT (2379) KIMIK3_ETCD_PEER_PORT (2380) KIMIK3_APISERVER_PORT (6443)
#                      KIMIK3_KCM_PORT (10257) KIMIK3_SCHEDULER_PORT (10259)
#                      KIMIK3_LWS_WEBHOOK_PORT (9443) KIMIK3_LWS_HEALTH_PORT (8081)
#                      KIMIK3_PROMETHEUS_PORT (9090) KIMIK3_KEDA_GRPC_PORT (9666)
#                      KIMIK3_KEDA_HEALTH_PORT (8082) KIMIK3_KEDA_METRICS_API_PORT (6444)
#                      KIMIK3_KEDA_METRICS_API_METRICS_PORT (8083) KIMIK3_PROMETHEUS_ADAPTER_PORT (6445)
#                      KIMIK3_REGISTRY_PORT (5000) KIMIK3_KUBELET_PORT (10250, on the node's bridge
#                      address) KIMIK3_KUBELET_HEALTHZ_PORT (10248)
#                      KIMIK3_KUEUE_WEBHOOK_PORT (9444) KIMIK3_KUEUE_HEALTH_PORT (8084)
#                      The ports of a running cluster are remembered in $KIMIK3_STATE/ports.env, so
#                      later calls need no variables.
#   KIMIK3_POD_READY_DELAY_MS  how long kwok holds a new pod back before marking it Ready (3000)
#   KIMIK3_POD_CIDR    the pods' addresses (kwok --cidr): a /16 inside 127.0.0.0/8, so that a process
#                      playing a pod binds its pod IP and every other one reaches it there, on
#                      loopback (e2e/harness/pod_runner.py). Default 127.64.0.0/16, or with
#                      KIMIK3_PORT_BASE 127.<64 + BASE/100 % 64>.0.0/16: the demo's, the tests' and
#                      the bench's clusters never share an address (two bases with one index
#                      BASE/100 % 64 would: `up` refuses while another cluster runs on it)
#   KIMIK3_NODE_GRACE_SECONDS  KCM's --node-monitor-grace-period (its default when unset): a fleet of
#                      1,000 fake nodes on 2 cores renews some node Leases late, and nodes that
#                      flap to Unknown mark their pods NotReady (bench/control_plane.sh sets 600)
#
# In $KIMIK3_STATE: kubeconfig (the admin, O=system:masters; `up` prints its path),
# kubeconfigs/operator.kubeconfig (also system:masters, user "kimik3-e2e:operator", so that audit
# counts tell the operator's writes from the test driver's), audit.log (JSON lines, one Metadata
# event per request), logs/<component>.log. The fake nodes (GPU pools, tainted, and CPU nodes) are
# nodes/*.yaml (nodes/generate.py).
# ComputeDomains work as with NVIDIA's DRA driver: compute-domain/ holds its CRD, the channel
# DeviceClass and one channel ResourceSlice per NVL72 tray; compute_domain_controller.py creates each
# domain's ResourceClaimTemplate; KCM and kube-scheduler allocate the pods' claims (one per tray).
#
# Metrics for autoscaling (README-aggregated-apis.md tells how the API server reaches them):
# Prometheus scrapes every 1 s the targets listed in $KIMIK3_STATE/prometheus/targets/*.json
# (file_sd; e2e/harness/pod_runner.py writes one file per runner) and keeps its data in
# $KIMIK3_STATE/prometheus/data (removed by `down`); its URL is in $KIMIK3_STATE/prometheus/url and
# `env` prints KIMIK3_PROMETHEUS_URL and KIMIK3_PROMETHEUS_TARGETS. KEDA serves
# external.metrics.k8s.io (ScaledObjects); prometheus-adapter serves custom.metrics.k8s.io with the
# vLLM pod metrics of the chart's files/prometheus-adapter-rules.yaml; the HPA controller syncs every 5 s.
#
# `up` is idempotent: a component that runs with the wanted command line and configuration is left
# alone, one whose flags or config changed is restarted, bootstrap objects are only created when
# missing, so a second `up` makes no writes to the API server (the audit log stays quiet).
# Network rule: everything listens on and talks to loopback only: 127.0.0.1, and the pod IPs, which
# are loopback addresses too (KIMIK3_POD_CIDR). Beside the fake nodes runs one real node
# (e2e/cluster/node.sh: kubelet, containerd, runc) whose pods live in network namespaces on a bridge of
# this cluster's own; only its Service rules give Service IPs a meaning (e2e/cluster/service_proxy.py).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$HERE/versions.env"

CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3-e2e}"
STATE="${KIMIK3_STATE:-$CACHE/state}"
# From the component rows (components.py): PORT_KEYS and PORT_DEFAULT, the build folders BIN_<KEY>
# (BIN_KEYS), the components with a kubeconfig (KUBECONFIG_COMPONENTS) and issue_component_certs.
COMPONENT_SHELL="$(python3 -S "$HERE/components.py" shell)" || { echo "components.py shell failed" >&2; exit 1; }
eval "$COMPONENT_SHELL"
# build.sh puts the module cache here; its copies of kwok, LWS and KEDA carry the stage and CRD YAMLs.
KWOK_SRC="$CACHE/go/mod/sigs.k8s.io/kwok@v$KWOK_VERSION"
LWS_SRC="$CACHE/go/mod/sigs.k8s.io/lws@v$LWS_VERSION"
KUEUE_SRC="$CACHE/go/mod/sigs.k8s.io/kueue@v$KUEUE_VERSION"
KEDA_SRC="$CACHE/go/mod/github.com/kedacore/keda/v2@v$KEDA_VERSION"
GATEWAY_API_CRDS="$CACHE/bin/gateway-api-v$GATEWAY_API_VERSION"

PKI="$STATE/pki"
CONF="$STATE/config"
RUN="$STATE/run"
LOGS="$STATE/logs"
KUBECONFIG_FILE="$STATE/kubeconfig"
PORTS_FILE="$STATE/ports.env"
AUDIT_LOG="$STATE/audit.log"
KUBECTL="$BIN_K8S/kubectl"
# Prometheus: its data (wiped by `down`), the file_sd folder others write targets into, and its URL
# for tests (a file, like the kubeconfig, and a line of `env`).
PROM_DIR="$STATE/prometheus"
PROM_TARGETS="$PROM_DIR/targets"
PROM_URL_FILE="$PROM_DIR/url"
ADAPTER_RULES="$ROOT/charts/kimik3-operator/files/prometheus-adapter-rules.yaml"
# Where KEDA runs in a real cluster; its processes read it from the environment (POD_NAMESPACE,
# KEDA_CLUSTER_OBJECT_NAMESPACE) and the aggregator names its Service there.
KEDA_NAMESPACE=keda
ADAPTER_NAMESPACE=monitoring # prometheus-adapter's own manifests (deploy/manifests) use this one

# The components (binary, command line, ports, environment, health check, what each needs) are rows of
# components.py; supervisor.py runs them and derives every order from the rows. Its verbs run as `sup`.
SUPERVISOR="$HERE/supervisor.py"
# The venv Python that runs compute_domain_controller.py, as scripts/venv.sh printed it (see
# begin_python); recorded so that later `up`s and `status` need not run venv.sh.
VENV_PYTHON_FILE="$RUN/venv-python"
PY=""
# The ComputeDomain fixtures and the hash of what `up` last applied from them.
CD_DIR="$HERE/compute-domain"
CD_STAMP="$STATE/compute-domain.applied"
CD_DRIVER="compute-domain.nvidia.com"
# Components to restart because a file they read at start changed (filled by write_file).
declare -A STALE=()
# Where Kueue runs (its Configuration's namespace is used for its own objects only).
KUEUE_NAMESPACE=kueue-system

FAKE_NODE_ANNOTATION="kwok.x-k8s.io/node=fake"
# The aggregator's client certificate (front-proxy CA): the only name the API server and the
# aggregated API servers accept user headers from (--requestheader-allowed-names).
FRONT_PROXY_CLIENT="kimik3-e2e:front-proxy-client"
FIELD_MANAGER="kimik3-e2e"
HASH_ANNOTATION="e2e.kimik3.dev/config-hash"

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
now_ms() { date +%s%3N; }

# ---------------------------------------------------------------------------------------------
# Ports

declare -A PORT=()
# PORT_KEYS (in offset order from KIMIK3_PORT_BASE) and PORT_DEFAULT come from the component rows.

# Precedence per port: KIMIK3_<KEY> > KIMIK3_PORT_BASE + offset > ports.env of the running cluster
# > default. Remembering the running cluster's ports keeps `status`/`env`/`down` right without
# the caller repeating the variables.
resolve_ports() {
  local -A recorded=()
  local key value i=0 var
  if [[ -f $PORTS_FILE ]]; then
    while IFS='=' read -r key value; do
      [[ -n $key ]] && recorded[$key]=$value
    done <"$PORTS_FILE"
  fi
  for key in "${PORT_KEYS[@]}"; do
    var="KIMIK3_$key"
    if [[ -n ${!var:-} ]]; then
      PORT[$key]=${!var}
    elif [[ -n ${KIMIK3_PORT_BASE:-} ]]; then
      PORT[$key]=$((KIMIK3_PORT_BASE + i))
    elif [[ -n ${recorded[$key]:-} ]]; then
      PORT[$key]=${recorded[$key]}
    else
      PORT[$key]=${PORT_DEFAULT[$key]}
    fi
    [[ ${PORT[$key]} =~ ^[0-9]+$ ]] || die "port $key=${PORT[$key]} is not a number"
    i=$((i + 1))
  done
}

# Where Prometheus listens: the last address of the pods' /16 (kwok hands them out from the start), so
# that the real node's pods reach it as they reach the played pods (cni/kimik3-host-loopback maps the
# pod range inside a pod; 127.0.0.1 inside a pod is the pod's own). The operator the demo installs as
# real pods reads it there (scripts/demo.sh).
prometheus_host() { local c; c="$(pod_cidr)"; echo "${c%.0.0/16}.255.254"; }

pod_cidr() { # the pods' /16 inside 127.0.0.0/8 (KIMIK3_POD_CIDR above)
  if [[ -n ${KIMIK3_POD_CIDR:-} ]]; then
    [[ $KIMIK3_POD_CIDR =~ ^127\.[0-9]+\.0\.0/16$ ]] || die "KIMIK3_POD_CIDR=$KIMIK3_POD_CIDR is not a 127.N.0.0/16"
    echo "$KIMIK3_POD_CIDR"
  elif [[ -n ${KIMIK3_PORT_BASE:-} ]]; then
    echo "127.$((64 + KIMIK3_PORT_BASE / 100 % 64)).0.0/16"
  elif [[ -f $STATE/pod-cidr ]]; then
    cat "$STATE/pod-cidr"
  else
    echo 127.64.0.0/16
  fi
}

# The Services' /16 (--service-cluster-ip-range). The real node's Service rules (service_proxy.py) send
# these addresses to pods, so two local clusters must not share it: 10.96.0.0/16, or with
# KIMIK3_PORT_BASE 10.<96 + BASE/100 % 64>.0.0/16 (the same index as the pods' /16).
service_cidr() {
  if [[ -n ${KIMIK3_PORT_BASE:-} ]]; then
    echo "10.$((96 + KIMIK3_PORT_BASE / 100 % 64)).0.0/16"
  elif [[ -f $STATE/service-cidr ]]; then
    cat "$STATE/service-cidr"
  else
    echo 10.96.0.0/16
  fi
}

# The `kubernetes` Service's address: the first of the range, as the API server allocates it.
kubernetes_service_ip() { local c; c="$(service_cidr)"; echo "${c%.0/16}.1"; }

record_ports() {
  local key
  write_file "$PORTS_FILE" 644 < <(for key in "${PORT_KEYS[@]}"; do printf '%s=%s\n' "$key" "${PORT[$key]}"; done)
}


# ---------------------------------------------------------------------------------------------
# Files

# write_file FILE MODE [COMPONENT...] < content: replace FILE only when the content differs, so a
# second `up` touches nothing; a changed file marks the components that read it (STALE) for a
# restart. Feed it with a redirection, not a pipe: in a pipeline it runs in a subshell and the
# STALE marks are lost.
write_file() {
  local file=$1 mode=$2 tmp
  shift 2
  tmp="$(mktemp "$file.XXXXXX")"
  cat >"$tmp"
  if cmp -s "$tmp" "$file" 2>/dev/null; then
    rm -f "$tmp"
    return 0
  fi
  chmod "$mode" "$tmp"
  mv -f "$tmp" "$file"
  local c
  for c in "$@"; do STALE[$c]=1; done
}

# One CA; one admin certificate (O=system:masters, SANs localhost/127.0.0.1) that is both the
# serving certificate of everything that serves TLS and the admin's client certificate; one client
# certificate per component so the audit log attributes every write to who made it; the service
# account signing key. Existing files are kept: regenerating would invalidate running processes.
# The aggregated API servers (KEDA's metrics API server, prometheus-adapter) and KEDA's gRPC metrics
# service serve with their own certificate, also their client certificate: the aggregator checks
# the name <service>.<namespace>.svc (README-aggregated-apis.md), KEDA's gRPC peers check 127.0.0.1
# and each other's certificate (mutual TLS), and the API server sees who writes.
# The aggregator proves itself to those servers with a client certificate of a second CA, the
# front-proxy CA, as kubeadm sets it up: a certificate of the cluster CA must never be able to
# assert another user in the request headers the aggregator sets.
ensure_pki() {
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  ensure_ca ca kimik3-e2e-ca
  ensure_ca front-proxy-ca kimik3-e2e-front-proxy-ca
  # In-cluster clients (the real node's pods) reach the API server at the `kubernetes` Service.
  issue admin "/O=system:masters/CN=kimik3-e2e-admin" serving \
    kubernetes kubernetes.default kubernetes.default.svc kubernetes.default.svc.cluster.local \
    "IP:$(kubernetes_service_ip)"
  # For the operator under test, so its writes are told apart from the test driver's kubectl.
  issue operator "/O=system:masters/CN=kimik3-e2e:operator"
  issue_component_certs # one per component row with an identity (components.py)
  ISSUER=front-proxy-ca issue front-proxy-client "/CN=$FRONT_PROXY_CLIENT"
  if [[ ! -s $PKI/sa.key || ! -s $PKI/sa.pub ]]; then
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key.tmp" 2>/dev/null
    openssl pkey -in "$PKI/sa.key.tmp" -pubout -out "$PKI/sa.pub"
    mv -f "$PKI/sa.key.tmp" "$PKI/sa.key"
  fi
  chmod 600 "$PKI"/*.key
}

ensure_ca() { # ensure_ca NAME CN: a self-signed CA, made once
  local name=$1 cn=$2
  [[ -s $PKI/$name.crt && -s $PKI/$name.key ]] && return 0
  log "creating CA $name in $PKI"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=$cn" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$PKI/$name.key.tmp" -out "$PKI/$name.crt.tmp" 2>/dev/null
  mv -f "$PKI/$name.key.tmp" "$PKI/$name.key"
  mv -f "$PKI/$name.crt.tmp" "$PKI/$name.crt"
}

# issue NAME SUBJECT [serving [NAME...]]: a client (and optionally serving, for localhost,
# 127.0.0.1 and the NAMEs: DNS names, or IP:ADDRESS) certificate signed by the CA $ISSUER
# (default: the cluster CA).
issue() {
  local name=$1 subject=$2 kind=${3:-client} ca=${ISSUER:-ca} dns san
  shift $(($# < 3 ? $# : 3))
  # Kept while its CA verifies it (a new CA voids the old leaves). The certificate is moved into
  # place last, so its presence means the pair is complete.
  if [[ -s $PKI/$name.crt && -s $PKI/$name.key ]] &&
    openssl verify -CAfile "$PKI/$ca.crt" "$PKI/$name.crt" >/dev/null 2>&1 &&
    has_names "$PKI/$name.crt" "$@"; then
    return 0
  fi
  local ext="$PKI/$name.ext"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [[ $kind == serving ]]; then
      echo "extendedKeyUsage=serverAuth,clientAuth"
      san="DNS:localhost,IP:127.0.0.1"
      for dns in "$@"; do if [[ $dns == IP:* ]]; then san+=",$dns"; else san+=",DNS:$dns"; fi; done
      echo "subjectAltName=$san"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } >"$ext"
  openssl req -new -newkey rsa:2048 -nodes -subj "$subject" \
    -keyout "$PKI/$name.key" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
    -CAcreateserial -CAserial "$PKI/$ca.srl" -days 825 -extfile "$ext" -out "$PKI/$name.crt.tmp" 2>/dev/null
  mv -f "$PKI/$name.crt.tmp" "$PKI/$name.crt"
  rm -f "$PKI/$name.csr" "$ext"
}

has_names() { # has_names CERT NAME...: the certificate names them all (a kept one may predate a name)
  local cert=$1 sans n
  shift
  sans="$(openssl x509 -noout -ext subjectAltName -in "$cert" 2>/dev/null | tr -d ' ')" || return 1
  for n in "$@"; do
    if [[ $n == IP:* ]]; then n="IPAddress:${n#IP:}"; else n="DNS:$n"; fi
    [[ ",${sans//$'\n'/,}," == *",$n,"* ]] || return 1
  done
}

kubeconfig() { # kubeconfig CERT_NAME: a kubeconfig with absolute paths (kopf does not resolve relative ones)
  cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kimik3-e2e
  cluster:
    server: https://127.0.0.1:${PORT[APISERVER_PORT]}
    certificate-authority: $PKI/ca.crt
users:
- name: $1
  user:
    client-certificate: $PKI/$1.crt
    client-key: $PKI/$1.key
contexts:
- name: kimik3-e2e
  context:
    cluster: kimik3-e2e
    user: $1
current-context: kimik3-e2e
EOF
}

# kwok needs its stages in its config (standalone kwok has no defaults and exits with "no stages
# found"); take them from the kwok module so they match the kwok binary. The file holds only
# Stages: options go in flags, because a KwokConfiguration document read from a file is not
# defaulted (kwok v0.8.0 then fails with "node leases parallelism must be greater than 0").
kwok_config() { # kwok_config STAGE_DIR
  local f first=1
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    kimik3/pod-running.yaml kimik3/pod-ready.yaml kimik3/pod-complete.yaml kimik3/pod-delete.yaml \
    volume/fast/pvc-provision.yaml volume/fast/pv-bind.yaml volume/fast/pv-delete.yaml \
    volume/fast/pvc-delete.yaml; do
    ((first)) || echo "---"
    first=0
    if [[ $f == kimik3/pod-ready.yaml ]]; then
      # Hold pod readiness back for a moment, as a real engine start would, so tests can see a
      # workload that exists but is not ready yet (KIMIK3_POD_READY_DELAY_MS, 0 disables it).
      sed "s/^spec:$/spec:\n  delay:\n    durationMilliseconds: ${KIMIK3_POD_READY_DELAY_MS:-3000}/" \
        "$ROOT/e2e/cluster/kwok/${f#kimik3/}"
    elif [[ $f == kimik3/* ]]; then
      cat "$ROOT/e2e/cluster/kwok/${f#kimik3/}" # our own stages (see the file)
    else
      cat "$1/$f"
    fi
  done
}

write_configs() {
  mkdir -p "$CONF" "$STATE/kubeconfigs" "$RUN" "$LOGS" "$STATE/kwok" "$STATE/apiserver"
  write_file "$KUBECONFIG_FILE" 600 < <(kubeconfig admin)
  local c
  for c in "${KUBECONFIG_COMPONENTS[@]}"; do
    write_file "$STATE/kubeconfigs/$c.kubeconfig" 600 "$c" < <(kubeconfig "$c")
  done
  write_file "$STATE/kubeconfigs/operator.kubeconfig" 600 < <(kubeconfig operator)
  write_node_configs

  # Metadata for every request (who, verb, resource, response code, no bodies): enough to count
  # writes per user. RequestReceived is omitted so each request is one line, not two.
  write_file "$CONF/audit-policy.yaml" 644 kube-apiserver <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
EOF

  local stage_dir="$KWOK_SRC/kustomize/stage"
  [[ -d $stage_dir ]] || die "kwok stages not found at $stage_dir (did build.sh run?)"
  write_file "$CONF/kwok.yaml" 644 kwok < <(kwok_config "$stage_dir")

  # LWS out of the cluster: no leader election, our certificate instead of its self-managed one,
  # webhook and health on loopback, metrics off ("0" disables controller-runtime's server).
  mkdir -p "$PKI/lws-webhook"
  write_file "$PKI/lws-webhook/tls.crt" 644 lws-manager <"$PKI/admin.crt"
  write_file "$PKI/lws-webhook/tls.key" 600 lws-manager <"$PKI/admin.key"
  write_file "$CONF/lws.yaml" 644 lws-manager <<EOF
apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: ${PORT[LWS_WEBHOOK_PORT]}
  certDir: $PKI/lws-webhook
metrics:
  bindAddress: "0"
health:
  healthProbeBindAddress: 127.0.0.1:${PORT[LWS_HEALTH_PORT]}
EOF

  # Kueue as LWS: no leader election, our certificate (for the webhooks, and for the metrics server,
  # which reads its own from $KUEUE_METRICS_CERT_DIR: build.sh), webhook and health on loopback,
  # metrics off. Only the LeaderWorkerSet integration (it enables the pod one it builds on). No
  # visibility API server: it would bind all interfaces, and nothing here asks it.
  mkdir -p "$PKI/kueue-webhook"
  write_file "$PKI/kueue-webhook/tls.crt" 644 kueue-manager <"$PKI/admin.crt"
  write_file "$PKI/kueue-webhook/tls.key" 600 kueue-manager <"$PKI/admin.key"
  write_file "$CONF/kueue.yaml" 644 kueue-manager <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: $KUEUE_NAMESPACE
manageJobsWithoutQueueName: false
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: ${PORT[KUEUE_WEBHOOK_PORT]}
  certDir: $PKI/kueue-webhook
metrics:
  bindAddress: "0"
health:
  healthProbeBindAddress: 127.0.0.1:${PORT[KUEUE_HEALTH_PORT]}
featureGates:
  VisibilityOnDemand: false
integrations:
  frameworks: ["leaderworkerset.x-k8s.io/leaderworkerset"]
EOF

  # Its command line does not change when the script does; this hash does, and restarts it.
  write_file "$RUN/compute-domain-controller.sha256" 644 compute-domain-controller \
    < <(sha256sum <"$HERE/compute_domain_controller.py")

  # Every second, as tests need an autoscaler to react within seconds; the targets are whatever
  # files others drop into $PROM_TARGETS (file_sd also watches the folder, so a new file counts at once).
  mkdir -p "$PROM_TARGETS"
  write_file "$CONF/prometheus.yml" 644 prometheus <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
- job_name: pods
  file_sd_configs:
  - files: ["$PROM_TARGETS/*.json"]
    refresh_interval: 1s
EOF
  write_file "$PROM_URL_FILE" 644 <<<"http://$(prometheus_host):${PORT[PROMETHEUS_PORT]}"
  # The rules file lives in the repository; a copy in $CONF restarts the adapter when it changes.
  write_file "$CONF/prometheus-adapter-rules.yaml" 644 prometheus-adapter <"$ADAPTER_RULES"

  # KEDA reads ca.crt, tls.crt and tls.key from one folder (--cert-dir) for its gRPC metrics
  # service, both ends; the metrics API server also serves the aggregator with that pair.
  # --ca-dir holds the CAs its scalers trust: ours, so a trigger may call a loopback server we signed.
  for c in keda-operator keda-metrics-apiserver; do
    mkdir -p "$PKI/$c-certs"
    write_file "$PKI/$c-certs/ca.crt" 644 "$c" <"$PKI/ca.crt"
    write_file "$PKI/$c-certs/tls.crt" 644 "$c" <"$PKI/$c.crt"
    write_file "$PKI/$c-certs/tls.key" 600 "$c" <"$PKI/$c.key"
  done
  mkdir -p "$PKI/keda-ca"
  write_file "$PKI/keda-ca/ca.crt" 644 keda-operator <"$PKI/ca.crt"
}

# The project venv's Python for the two script components (compute_domain_controller.py,
# service_proxy.py). scripts/venv.sh takes ~2 s even when warm (it reinstalls the project), so it runs
# once per cluster life, in the background from the start of `up` (step python collects it); later
# `up`s reuse the path it printed while that still exists, and `down` forgets it.
recorded_python() { # the Python a previous `up` recorded, if it still runs; else nothing
  local py
  py="$(cat "$VENV_PYTHON_FILE" 2>/dev/null)" || true
  [[ -n $py && -x $py ]] && echo "$py"
  return 0
}

begin_python() {
  PY="$(recorded_python)"
  [[ -n $PY ]] && return 0
  VENV_OUT="$(mktemp)"
  "$ROOT/scripts/venv.sh" >"$VENV_OUT" 2>&1 3>&- 8>&- &
  VENV_PID=$!
}

step_python() {
  if [[ -n ${VENV_PID:-} ]]; then
    wait "$VENV_PID" || { cat "$VENV_OUT" >&2; die "scripts/venv.sh failed"; }
    PY="$(tail -n 1 "$VENV_OUT")/bin/python"
    rm -f "$VENV_OUT"
    VENV_PID=""
    [[ -x $PY ]] || die "no Python at $PY (from scripts/venv.sh)"
  fi
  write_file "$VENV_PYTHON_FILE" 644 <<<"$PY"
  export K3E_PYTHON="$PY"
}

# shellcheck source=../debian-packages.sh
source "$HERE/../debian-packages.sh"
# shellcheck source-path=SCRIPTDIR source=node.sh
source "$HERE/node.sh"

# ---------------------------------------------------------------------------------------------
# Processes (supervisor.py) and the table's steps

# What components.py builds command lines and probes from: paths, ports and addresses, decided here.
export_layout() {
  local key
  export K3E_HERE="$HERE" K3E_STATE="$STATE" K3E_PKI="$PKI" K3E_CONF="$CONF" K3E_RUN="$RUN" K3E_LOGS="$LOGS"
  export K3E_PROM_DIR="$PROM_DIR" K3E_AUDIT_LOG="$AUDIT_LOG"
  for key in "${BIN_KEYS[@]}"; do
    local var="BIN_$key"
    export "K3E_BIN_$key=${!var}"
  done
  for key in "${PORT_KEYS[@]}"; do export "K3E_PORT_$key=${PORT[$key]}"; done
  K3E_SERVICE_CIDR="$(service_cidr)" K3E_POD_CIDR="$(pod_cidr)" K3E_KUBERNETES_IP="$(kubernetes_service_ip)"
  K3E_NODE_IP="$(node_ip)" K3E_NODE_CHAIN="$(node_nat_chain)" K3E_NODE_SUBNET="$(node_subnet)"
  K3E_REGISTRY="$(registry_host)" K3E_PROMETHEUS_HOST="$(prometheus_host)"
  export K3E_PROMETHEUS_HOST K3E_SERVICE_CIDR K3E_POD_CIDR K3E_KUBERNETES_IP K3E_NODE_IP K3E_NODE_CHAIN K3E_NODE_SUBNET K3E_REGISTRY
  export K3E_NODE_NAME="$NODE_NAME" K3E_NODE_DIR="$NODE_DIR"
  export K3E_CONTAINERD_SOCK="$CONTAINERD_SOCK" K3E_KEDA_NAMESPACE="$KEDA_NAMESPACE"
  export K3E_FAKE_NODE_ANNOTATION="$FAKE_NODE_ANNOTATION" K3E_FRONT_PROXY_CLIENT="$FRONT_PROXY_CLIENT"
  export K3E_NODE_GRACE_SECONDS="${KIMIK3_NODE_GRACE_SECONDS:-}"
  [[ -n $PY ]] || PY="$(recorded_python)"
  export K3E_PYTHON="$PY"
}

supervisor() { python3 -S "$SUPERVISOR" "$@"; } # its exit status, for the callers that ask
sup() { supervisor "$@" || die "supervisor.py $1 failed"; }

STARTED=()

# run_plan PLAN [tolerant]: the lines of `supervisor.py plan ...`, in order. Tolerant (down): a line
# that fails is logged and the rest still runs (a half-done `down` would leave the control plane
# running); the function then fails.
run_plan() {
  local plan=$1 tolerant=${2:-} verb rest failed=0 line
  local -a lines words
  mapfile -t lines <<<"$plan"
  for line in "${lines[@]}"; do
    [[ -n $line ]] || continue
    read -r verb rest <<<"$line"
    read -ra words <<<"$rest"
    case $verb in
      step | undo) declare -F "${verb}_${rest//-/_}" >/dev/null || die "cluster.sh has no ${verb}_${rest//-/_} (components.py names it)" ;;
    esac
    if [[ -n $tolerant ]]; then
      (run_line "$verb" "${words[@]}") || { log "could not $line"; failed=1; }
    else
      run_line "$verb" "${words[@]}"
    fi
  done
  return "$failed"
}

run_line() {
  local verb=$1
  shift
  case $verb in
    step | undo) "${verb}_${1//-/_}" ;;
    start) sup start "$@"; STARTED+=("$@") ;;
    wait | stop | crash) sup "$verb" "$@" ;;
    *) die "unknown plan line: $verb $*" ;;
  esac
}

wait_until() { # wait_until TIMEOUT_S WHAT CMD...: poll CMD until it succeeds
  local timeout=$1 what=$2 deadline
  deadline=$(($(date +%s) + timeout))
  shift 2
  until "$@" >/dev/null 2>&1; do
    (($(date +%s) < deadline)) || die "timed out after $timeout s waiting for $what"
    sleep 0.2
  done
}

# The steps components.py names (step_NAME before what needs it; undo_NAME in `down`); step_python is
# with begin_python above.
step_node_network() { ensure_node_network; } # before the API server: it calls webhook Services by address
undo_node_network() { remove_node_network; } # last: while the API server ran, its calls had to meet the guards
step_node_state() { ensure_node_cgroups; }
undo_node_state() { remove_node_state; }
step_pause_image() { ensure_pause_image; }
undo_pause_image() { remove_node_pods; } # the kubelet is gone (no pod starts again); containerd still runs
step_crds() {
  ensure_crds lws "$LWS_SRC/config/crd/bases"
  # Kueue's bases serve v1beta1 and v1beta2 without conversion (its kustomized CRDs convert through
  # its webhook Service); everything here speaks v1beta2, the stored version.
  ensure_crds kueue "$KUEUE_SRC/config/components/crd/bases"
  ensure_crds keda "$KEDA_SRC/config/crd/bases"
  ensure_crds gateway-api "$GATEWAY_API_CRDS"
  ensure_compute_domain_fixtures
}
step_cluster_objects() {
  ensure_storage_class
  ensure_played_pods_policy
  ensure_nodes
}
step_lws_webhooks() { ensure_lws_webhooks; }
step_kueue_webhooks() { ensure_kueue_webhooks; }
step_metrics_services() { apply_hashed metrics-services < <(metrics_services_yaml); }
step_metrics_apiservices() { ensure_metrics_apiservices; }

# Each kwok process holds the node Leases under a new random identity, and a new process waits for
# its predecessor's Leases to expire (~40 s) before it handles any node or pod. The predecessor is
# gone when kwok starts, so hand every fake node's Lease over at once (the real node's kubelet keeps
# its own).
step_release_node_leases() {
  local leases
  leases="$(kc -n kube-node-lease get leases -o name 2>/dev/null | grep -v "/$NODE_NAME\$")" || return 0
  [[ -n $leases ]] || return 0
  # shellcheck disable=SC2086 # one name per word
  kc -n kube-node-lease delete $leases --wait=false >/dev/null
}

# ---------------------------------------------------------------------------------------------
# Cluster objects (created only when missing, so a warm `up` writes nothing)

kc() { "$KUBECTL" --kubeconfig="$KUBECONFIG_FILE" --cache-dir="$STATE/kubectl-cache" "$@"; }

# wait_condition CONDITION OBJECT...: `kubectl wait --for=condition=...`, within 60 s. kubectl refuses,
# rather than waits on, an object whose status has no conditions yet (".status.conditions accessor
# error: <nil>"), which a CRD or APIService applied a moment before can be on a loaded machine (seen:
# lane 2's cluster failed to come up on it): that refusal is retried until the minute is up.
wait_condition() {
  local condition=$1 deadline=$((SECONDS + 60)) err
  shift
  err="$(mktemp)"
  until kc wait --for=condition="$condition" --timeout=60s "$@" >/dev/null 2>"$err"; do
    if ! grep -q "accessor error" "$err" || ((SECONDS >= deadline)); then
      cat "$err" >&2
      rm -f "$err"
      return 1
    fi
    sleep 1
  done
  rm -f "$err"
}

CHANGED=()

# ensure_crds WHAT DIR: every CRD base in a module's DIR, server-side because the LWS and KEDA CRDs
# are too big for the last-applied annotation. All LWS bases (the DisaggregatedSet controller starts
# unconditionally and fails without its kind); all of KEDA's, as its release's keda-crds.yaml. Not
# LWS's kustomized CRDs: their conversion webhook points at an in-cluster Service.
ensure_crds() {
  local what=$1 dir=$2 f names=()
  for f in "$dir"/*.yaml; do
    names+=("crd/$(awk '/^  name:/ {print $2; exit}' "$f")")
  done
  ((${#names[@]})) || die "no $what CRDs under $dir (did build.sh run?)"
  if ! kc get "${names[@]}" >/dev/null 2>&1; then
    kc apply --server-side --force-conflicts --field-manager="$FIELD_MANAGER" -f "$dir" >&2
    CHANGED+=("$what-crds")
  fi
  wait_condition Established "${names[@]}"
}

# apply_hashed WHAT < YAML: server-side apply YAML, whose objects each carry the annotation
# $HASH_ANNOTATION: "@HASH@", unless every one of them exists with the hash of this content, so a
# warm `up` only reads.
apply_hashed() {
  local what=$1 yaml hash objects have
  yaml="$(cat)"
  hash="$(printf '%s' "$yaml" | sha256sum | cut -c1-16)"
  yaml="${yaml//@HASH@/$hash}"
  objects="$(grep -c '^kind:' <<<"$yaml")"
  # `get -f` fails if one is missing; the others' hashes still print, too few to match.
  have="$(kc get -f - -o jsonpath="{..metadata.annotations.${HASH_ANNOTATION//./\\.}}" <<<"$yaml" 2>/dev/null)" || true
  [[ $(grep -o -- "$hash" <<<"$have" | wc -l) == "$objects" ]] && return 0
  kc apply --server-side --force-conflicts --field-manager="$FIELD_MANAGER" -f - <<<"$yaml" >&2
  CHANGED+=("$what")
}

# workload_webhooks_yaml PREFIX PORT [SELECTOR] [EXTRA]: the webhook configurations of a controller
# that mutates and validates LeaderWorkerSets and their pods (LWS itself, Kueue), as upstream's
# config/webhook but with loopback URLs and our CA instead of a Service and cert-manager. Pods only
# of LeaderWorkerSets (objectSelector): such a controller, down, blocks no other pod. SELECTOR is a
# namespaceSelector's YAML, EXTRA more validating webhooks. Applied only once the manager serves
# them: failurePolicy Fail would otherwise block every LWS object and LWS pod.
workload_webhooks_yaml() {
  local prefix=$1 base="https://127.0.0.1:$2" selector=${3:-} extra=${4:-} ca
  ca="$(base64 -w0 <"$PKI/ca.crt")"
  local common="admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 10${selector:+
  namespaceSelector: $selector}"
  local pods="objectSelector:
    matchExpressions: [{key: leaderworkerset.sigs.k8s.io/name, operator: Exists}]"
  local lws="rules: [{apiGroups: [leaderworkerset.x-k8s.io], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [leaderworkersets]}]"
  cat <<EOF
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: $prefix-mutating-webhook-configuration
  annotations: {$HASH_ANNOTATION: "@HASH@"}
webhooks:
- name: mleaderworkerset.kb.io
  $common
  clientConfig: {url: "$base/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset", caBundle: "$ca"}
  $lws
- name: mpod.kb.io
  $common
  clientConfig: {url: "$base/mutate--v1-pod", caBundle: "$ca"}
  $pods
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: $prefix-validating-webhook-configuration
  annotations: {$HASH_ANNOTATION: "@HASH@"}
webhooks:
- name: vleaderworkerset.kb.io
  $common
  clientConfig: {url: "$base/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset", caBundle: "$ca"}
  $lws
- name: vpod.kb.io
  $common
  clientConfig: {url: "$base/validate--v1-pod", caBundle: "$ca"}
  $pods
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [pods]}]
EOF
  [[ -z $extra ]] || printf '%s\n' "$extra"
}

# LWS's, with the DisaggregatedSet validation its manager serves too.
ensure_lws_webhooks() {
  local extra ca
  ca="$(base64 -w0 <"$PKI/ca.crt")"
  extra="- name: vdisaggregatedset.kb.io
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 10
  clientConfig: {url: \"https://127.0.0.1:${PORT[LWS_WEBHOOK_PORT]}/validate-disaggregatedset-x-k8s-io-v1-disaggregatedset\", caBundle: \"$ca\"}
  rules: [{apiGroups: [disaggregatedset.x-k8s.io], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [disaggregatedsets]}]"
  apply_hashed lws-webhooks < <(workload_webhooks_yaml lws "${PORT[LWS_WEBHOOK_PORT]}" "" "$extra")
}

# Kueue's, for what its LeaderWorkerSet integration needs (the LeaderWorkerSet pair marks a queued
# set's pod templates, the pod pair gates those pods until their group is admitted), in every
# namespace but upstream's exclusions, and the namespace it runs in.
ensure_kueue_webhooks() {
  apply_hashed kueue-webhooks < <(
    printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n  annotations: {%s: "@HASH@"}\n---\n' \
      "$KUEUE_NAMESPACE" "$HASH_ANNOTATION"
    workload_webhooks_yaml kueue "${PORT[KUEUE_WEBHOOK_PORT]}" \
      "{matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system, $KUEUE_NAMESPACE]}]}")
}

# The namespaces of the metrics API servers and the Services their APIServices name. No pod network
# here: an ExternalName Service `localhost` makes the aggregator call https://localhost:<port of the
# APIService> (README-aggregated-apis.md), and their certificates carry <service>.<namespace>.svc.
metrics_services_yaml() {
  local ns svc
  for ns in "$KEDA_NAMESPACE/keda-metrics-apiserver" "$ADAPTER_NAMESPACE/prometheus-adapter"; do
    svc=${ns#*/} ns=${ns%/*}
    cat <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $ns
  annotations: {$HASH_ANNOTATION: "@HASH@"}
---
apiVersion: v1
kind: Service
metadata:
  name: $svc
  namespace: $ns
  annotations: {$HASH_ANNOTATION: "@HASH@"}
spec:
  type: ExternalName
  externalName: localhost
---
EOF
  done
}

# KEDA serves external.metrics.k8s.io (one APIService: a group has one owner), prometheus-adapter
# custom.metrics.k8s.io in both versions it serves (the HPA controller prefers v1beta2). The caBundle
# is our CA, which signed their serving certificates; never insecureSkipTLSVerify.
metrics_apiservices_yaml() {
  local ca entry group version svc ns port priority
  ca="$(base64 -w0 <"$PKI/ca.crt")"
  for entry in \
    "external.metrics.k8s.io v1beta1 keda-metrics-apiserver $KEDA_NAMESPACE ${PORT[KEDA_METRICS_API_PORT]} 100" \
    "custom.metrics.k8s.io v1beta1 prometheus-adapter $ADAPTER_NAMESPACE ${PORT[PROMETHEUS_ADAPTER_PORT]} 100" \
    "custom.metrics.k8s.io v1beta2 prometheus-adapter $ADAPTER_NAMESPACE ${PORT[PROMETHEUS_ADAPTER_PORT]} 200"; do
    read -r group version svc ns port priority <<<"$entry"
    cat <<EOF
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: $version.$group
  annotations: {$HASH_ANNOTATION: "@HASH@"}
spec:
  group: $group
  version: $version
  groupPriorityMinimum: 100
  versionPriority: $priority
  service: {name: $svc, namespace: $ns, port: $port}
  caBundle: $ca
---
EOF
  done
}

METRICS_APISERVICES=(apiservice/v1beta1.external.metrics.k8s.io apiservice/v1beta1.custom.metrics.k8s.io
  apiservice/v1beta2.custom.metrics.k8s.io)

# Only once their servers answer: an unavailable aggregated API fails discovery, which stalls
# namespace deletion and the garbage collector cluster-wide.
ensure_metrics_apiservices() {
  apply_hashed metrics-apiservices < <(metrics_apiservices_yaml)
  wait_condition Available "${METRICS_APISERVICES[@]}"
}

# What NVIDIA's DRA driver installs and its kubelet plugins publish, for ComputeDomains: the CRD, the
# channel DeviceClass, one ResourceSlice per NVL72 tray (compute-domain/, the slices generated by
# nodes/generate.py). Applied server-side when something is missing or the files changed since the
# last apply (a hash in $CD_STAMP), so a warm `up` only reads. Like nodes, slices of trays removed
# from the fixtures stay until `down`.
ensure_compute_domain_fixtures() {
  local hash want have crd=crd/computedomains.resource.nvidia.com
  hash="$(cat "$CD_DIR"/*.yaml | sha256sum | cut -c1-16)"
  want="$(grep -c '^kind: ResourceSlice$' "$CD_DIR/resourceslices.yaml")"
  have="$(kc get resourceslices --field-selector "spec.driver=$CD_DRIVER" -o name | wc -l)"
  if [[ $(cat "$CD_STAMP" 2>/dev/null) != "$hash" ]] || ((have < want)) ||
    ! kc get "$crd" deviceclass/compute-domain-default-channel.nvidia.com >/dev/null 2>&1; then
    kc apply --server-side --force-conflicts --field-manager="$FIELD_MANAGER" -f "$CD_DIR" >/dev/null
    printf '%s\n' "$hash" >"$CD_STAMP"
    CHANGED+=(compute-domain)
  fi
  wait_condition Established "$crd"
}

# kwok's fake provisioner binds PVCs of this class (the volume stages); it is the default class.
ensure_storage_class() {
  local f="$KWOK_SRC/kustomize/stage/volume/fast/storage-class.yaml"
  [[ -f $f ]] || { log "no kwok StorageClass at $f; skipping"; return 0; }
  kc get storageclass kwok-volume >/dev/null 2>&1 && return 0
  kc create -f "$f" >&2
  CHANGED+=(storageclass)
}

# The pods the pod runner plays, marked as they are admitted (see the file).
ensure_played_pods_policy() { apply_hashed played-pods-policy < "$HERE/played-pods.yaml"; }

# `create`, not `apply`: Node create keeps status (capacity), updates drop it. Nodes that exist are
# left alone; change a fixture with `down` + `up` (or patch the node's status).
ensure_nodes() {
  local want have out
  want="$(cat "$HERE"/nodes/*.yaml | grep -c '^kind: Node$')"
  have="$(kc get nodes -l type=kwok -o name | wc -l)"
  ((have >= want)) && return 0
  if ! out="$(kc create -f "$HERE/nodes" 2>&1)"; then
    if grep -v 'AlreadyExists' <<<"$out" | grep -q 'Error'; then
      printf '%s\n' "$out" >&2
      die "creating the fake nodes failed"
    fi
  fi
  log "created $((want - have)) fake nodes"
  CHANGED+=(nodes)
}

# Ready nodes without the not-ready/unreachable taints (KCM removes those after kwok reports Ready;
# until then the scheduler will not place pods).
nodes_ready() {
  local want
  want="$(cat "$HERE"/nodes/*.yaml | grep -c '^kind: Node$')"
  kc get nodes -l type=kwok -o json | python3 -c '
import json, sys
ready = 0
for n in json.load(sys.stdin)["items"]:
    conds = n.get("status", {}).get("conditions") or []
    taints = n.get("spec", {}).get("taints") or []
    if any(c["type"] == "Ready" and c["status"] == "True" for c in conds) and not any(
        t["key"].startswith("node.kubernetes.io/") for t in taints
    ):
        ready += 1
sys.exit(0 if ready >= int(sys.argv[1]) else 1)
' "$want"
}

wait_nodes_ready() { # like wait_until, but a dead kwok fails at once with its log
  local deadline=$(($(date +%s) + $1))
  until nodes_ready 2>/dev/null; do
    if ! supervisor running kwok; then
      tail -n 30 "$LOGS/kwok.log" >&2 || true
      die "kwok exited"
    fi
    (($(date +%s) < deadline)) || die "fake nodes not Ready after $1 s"
    sleep 0.2
  done
}

# ---------------------------------------------------------------------------------------------
# Subcommands

cmd_up() {
  local t0
  t0="$(now_ms)"
  "$HERE/build.sh"
  mkdir -p "$LOGS"
  ensure_node_packages # the real node's binaries are Debian's
  [[ -x $KUBECTL ]] || die "$KUBECTL missing after build.sh"

  mkdir -p "$STATE"
  exec 8>"$STATE/.lock"
  flock 8 # one up/down at a time
  mkdir -p "$RUN"
  begin_python
  resolve_ports
  ensure_pki
  write_configs
  record_ports
  pod_cidr | write_file "$STATE/pod-cidr" 644
  service_cidr | write_file "$STATE/service-cidr" 644

  export_layout
  local stale plan
  stale="$(IFS=,; echo "${!STALE[*]}")"
  plan="$(sup plan up --stale="$stale")" || exit 1
  run_plan "$plan"
  wait_until 120 "the real node $NODE_NAME Ready" node_ready
  wait_nodes_ready 120
  wait_until 60 "the default ServiceAccount" kc -n default get serviceaccount default

  local dt
  dt="$(now_ms)"
  dt=$((dt - t0))
  if ((${#STARTED[@]} + ${#CHANGED[@]} == 0)); then
    log "already up; checked in $((dt / 1000)).$(printf '%03d' $((dt % 1000)))s"
  else
    log "up in $((dt / 1000)).$(printf '%03d' $((dt % 1000)))s (started: ${STARTED[*]:-none}; created: ${CHANGED[*]:-none})"
  fi
  log "kubeconfig: $KUBECONFIG_FILE   (eval \"\$($HERE/cluster.sh env)\" for kubectl/helm on PATH)"
  log "prometheus: $(<"$PROM_URL_FILE")   (scrape targets: $PROM_TARGETS/*.json)"
  printf '%s\n' "$KUBECONFIG_FILE" >&3
}

cmd_down() {
  mkdir -p "$STATE"
  exec 8>"$STATE/.lock"
  flock 8
  log "stopping"
  resolve_ports
  export_layout
  # In the reverse of the start order: the real node first (its pods go with the kubelet, containerd
  # once nothing runs), the API server and etcd last, the node's network after everything.
  local plan
  plan="$(sup plan down)" || exit 1
  run_plan "$plan" tolerant || die "down did not finish; the cluster's data is kept"
  # The next `up` starts from an empty cluster; the audit log and the metrics belong to this
  # cluster's life. PKI, kubeconfigs and component logs stay (reused, and useful after a failed
  # run), and so do the scrape targets: their writers (pod runners) remove their own files.
  rm -rf "$STATE/etcd" "$STATE/kubectl-cache" "$PORTS_FILE" "$CD_STAMP" "$VENV_PYTHON_FILE" \
    "$PROM_DIR/data" "$PROM_URL_FILE"
  rm -f "$AUDIT_LOG" "$STATE"/audit-*.log
  log "down; etcd data, metrics and audit log removed"
}

# Stop and start components of a running cluster with the command line `up` uses, so a later `up`
# finds them current and leaves them alone. Only running components: a stopped one is `up`'s job.
cmd_restart() {
  local name t0 dt kill=() how=stop plan
  if [[ ${1:-} == --kill ]]; then
    kill=(--kill) how=crash
    shift
  fi
  plan="$(supervisor plan "${kill[@]}" restart "$@")" || exit 1 # it says what was wrong
  mkdir -p "$STATE"
  exec 8>"$STATE/.lock"
  flock 8
  resolve_ports
  export_layout
  for name in "$@"; do
    supervisor running "$name" || die "$name is not running; start the cluster with 'up'"
  done
  t0="$(now_ms)"
  run_plan "$plan"
  dt=$(($(now_ms) - t0))
  log "restarted $* ($how) in $((dt / 1000)).$(printf '%03d' $((dt % 1000)))s"
}

cmd_status() {
  resolve_ports
  export_layout
  local all=0
  supervisor status || all=1
  if supervisor running kube-apiserver && kc get --raw=/readyz >/dev/null 2>&1; then
    local total ready=0
    total="$(kc get nodes -l type=kwok -o name 2>/dev/null | wc -l)"
    ready="$(kc get nodes -l type=kwok --no-headers 2>/dev/null | awk '$2 == "Ready"' | wc -l)"
    printf 'fake nodes: %s/%s Ready\n' "$ready" "$total"
  fi
  printf 'kubeconfig: %s\n' "$KUBECONFIG_FILE"
  printf 'prometheus: http://%s:%s (targets: %s/*.json)\n' "$(prometheus_host)" "${PORT[PROMETHEUS_PORT]}" "$PROM_TARGETS"
  return "$all"
}

cmd_env() {
  resolve_ports
  # Plain `export NAME="value"` lines, easy to eval and to parse (e2e/tests reads them too).
  printf 'export KUBECONFIG="%s"\n' "$KUBECONFIG_FILE"
  # shellcheck disable=SC2016 # $PATH expands where the output is eval'ed
  printf 'export PATH="%s:%s:%s:%s:%s:%s:$PATH"\n' "$BIN_K8S" "$BIN_ETCD" "$BIN_KWOK" "$BIN_LWS" "$BIN_HELM" \
    "$BIN_PROMETHEUS"
  # Where to query Prometheus, and where to drop file_sd target files (*.json) for it to scrape.
  printf 'export KIMIK3_PROMETHEUS_URL="http://%s:%s"\n' "$(prometheus_host)" "${PORT[PROMETHEUS_PORT]}"
  printf 'export KIMIK3_PROMETHEUS_TARGETS="%s"\n' "$PROM_TARGETS"
  printf 'export KIMIK3_POD_CIDR="%s"\n' "$(pod_cidr)"
  # The real node: the loopback registry its containerd pulls from, its name and its taint.
  printf 'export KIMIK3_REGISTRY="%s"\n' "$(registry_host)"
  printf 'export KIMIK3_REAL_NODE="%s"\n' "$NODE_NAME"
  printf 'export KIMIK3_REAL_NODE_TAINT="%s"\n' "$NODE_TAINT"
  printf 'export KIMIK3_CONTAINERD="%s"\n' "$CONTAINERD_SOCK"
}

main() {
  local cmd=${1:-}
  case $cmd in
    up)
      exec 3>&1 1>&2 # stdout carries only the kubeconfig path
      cmd_up
      ;;
    down) cmd_down ;;
    status) cmd_status ;;
    restart)
      shift
      cmd_restart "$@"
      ;;
    env) cmd_env ;;
    *)
      sed -n '2,12s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
      exit 2
      ;;
  esac
}

main "$@"
