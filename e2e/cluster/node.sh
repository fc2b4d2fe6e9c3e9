# shellcheck shell=bash
# The real node of the local cluster, sourced by cluster.sh: a kubelet built from the pinned
# Kubernetes module runs pods with Debian 12's containerd 1.6 and runc, on a CNI bridge of this
# cluster's own, with images pulled from a CNCF distribution registry on loopback (Debian's
# docker-registry). The fake GPU nodes stay kwok's; this node is tainted (NODE_TAINT) so only pods
# that ask for it land here: the operator as the chart installs it, its `helm test` pod.
# docs/real-runtime.md says why each setting is what it is.
#
# Addresses (all on this machine): the pods get 10.200.<I>.0/24 on bridge k3e<I>, the node is its
# gateway 10.200.<I>.1, the Services are 10.<96+I>.0.0/16 (cluster.sh service_cidr), where I is the
# cluster's index (KIMIK3_PORT_BASE / 100 % 64; 0 without one), so the demo's and the tests'
# clusters never share a bridge, a subnet or a Service address. Nothing is routed off the machine:
# the bridge has no masquerade, forwarding from it to any other interface is dropped, and the
# Service range is routed to the bridge and refused unless a DNAT rule of service_proxy.py took it.

NODE_NAME=real-node-0
NODE_TAINT="kimik3.dev/real-node=true:NoSchedule"
NODE_DIR="$STATE/node"
CONTAINERD_SOCK="$NODE_DIR/containerd.sock"
NODE_REGISTRY_DIR="$STATE/registry"

# The fake nodes' pods of this cluster (its pod CIDR, 127.<64+I>.0.0/16) and the range its real
# pods reach them by, 100.<64+I>.0.0/16 (cni/kimik3-host-loopback maps one onto the other in the
# pod, the bridge maps it back): the other local cluster's pods are out of reach.
host_loopback() { pod_cidr; }
host_loopback_via() { local c; c="$(pod_cidr)"; echo "100.${c#127.}"; }

node_index() { local c; c="$(service_cidr)"; c="${c#10.}"; echo $((${c%%.*} - 96)); }
node_bridge() { echo "k3e$(node_index)"; }
node_subnet() { echo "10.200.$(node_index).0/24"; }
node_ip() { echo "10.200.$(node_index).1"; }
# Per cluster, so two kubelets on this machine never share their pods' cgroups.
node_cgroup_root() { echo "/kimik3-e2e-$(node_index)"; }
# The iptables chains of this cluster: Service DNAT (nat, written by service_proxy.py) and the
# guard that keeps the bridge's traffic on the machine (filter).
node_nat_chain() { echo "KIMIK3-SVC-$(node_index)"; }
node_guard_chain() { echo "KIMIK3-GUARD-$(node_index)"; }
registry_host() { echo "127.0.0.1:${PORT[REGISTRY_PORT]}"; }
# The sandbox ("pause") image: Debian's static catatonit in -P mode, made here and served by the
# registry like every other image of the node.
PAUSE_REPOSITORY=kimik3-e2e/pause
pause_image() { echo "$(registry_host)/$PAUSE_REPOSITORY:catatonit-$(dpkg-query -W -f='${Version}' catatonit | tr '~+:' '---')"; }

# Debian packages the node needs (installed when missing; CI machines start without them); podman
# makes the pause image; haproxy is the played router pods' front (e2e/harness/front_play.py).
NODE_PACKAGES=(containerd runc containernetworking-plugins catatonit docker-registry iptables iproute2 podman haproxy)

ensure_node_packages() { ensure_debian_packages "$LOGS/apt.log" "${NODE_PACKAGES[@]}" || die "Debian packages"; }

write_node_configs() {
  mkdir -p "$NODE_DIR"/{containerd,kubelet,cni/net.d,cni/ipam,cni/bin,certs.d} "$NODE_REGISTRY_DIR"
  # The plugins the node uses: Debian's, and ours (cni/kimik3-host-loopback).
  local plugin
  for plugin in bridge host-local loopback; do ln -sfn "/usr/lib/cni/$plugin" "$NODE_DIR/cni/bin/$plugin"; done
  ln -sfn "$HERE/cni/kimik3-host-loopback" "$NODE_DIR/cni/bin/kimik3-host-loopback"
  # The kubelet's and the service proxy's certificates and kubeconfigs: their component rows (ensure_pki).

  write_file "$CONF/registry.yml" 644 registry <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $NODE_REGISTRY_DIR
  delete:
    enabled: true
http:
  addr: $(registry_host)
EOF

  # Plain HTTP to the loopback registry (containerd's hosts.toml), and the same registry standing in
  # for ghcr.io, where the operator renders its images from (planner/images.py): a pod that names
  # ghcr.io/kimik3-operator/vllm-router:0.1.17 gets the registry's kimik3-operator/vllm-router:0.1.17,
  # and nothing is ever pulled from off the machine (the registry is also the `server`).
  local host
  for host in "$(registry_host)" ghcr.io; do
    mkdir -p "$NODE_DIR/certs.d/$host"
    write_file "$NODE_DIR/certs.d/$host/hosts.toml" 644 containerd <<EOF
server = "http://$(registry_host)"
[host."http://$(registry_host)"]
  capabilities = ["pull", "resolve"]
EOF
  done

  # restrict_oom_score_adj: the VM has no CAP_SYS_RESOURCE, so containerd may only raise the score.
  write_file "$CONF/containerd.toml" 644 containerd <<EOF
version = 2
root = "$NODE_DIR/containerd/root"
state = "$NODE_DIR/containerd/state"
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$(pause_image)"
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$NODE_DIR/cni/bin"
    conf_dir = "$NODE_DIR/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$NODE_DIR/certs.d"
EOF

  # The bridge plugin with host-local addresses and no masquerade (ipMasq false): pods reach each
  # other, the node and, through DNAT, the API server and the Services; and, through
  # kimik3-host-loopback, this cluster's fake nodes' pods, which live on the host's loopback
  # (KIMIK3_POD_CIDR). Nothing else.
  write_file "$NODE_DIR/cni/net.d/10-kimik3-e2e.conflist" 644 containerd <<EOF
{
  "cniVersion": "1.0.0",
  "name": "kimik3-e2e-$(node_index)",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$(node_bridge)",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$NODE_DIR/cni/ipam",
        "ranges": [[{"subnet": "$(node_subnet)", "gateway": "$(node_ip)"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "kimik3-host-loopback", "hostLoopback": "$(host_loopback)", "via": "$(host_loopback_via)"}
  ]
}
EOF

  # failCgroupV1 false: this VM mounts cgroup v1 (kubelet 1.36 refuses it by default). No cluster
  # DNS: pods find the API server through the KUBERNETES_SERVICE_* variables. Eviction thresholds
  # low: the node shares the machine's disk with everything else and must not evict our pods.
  write_file "$CONF/kubelet.yaml" 644 kubelet <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $(node_ip)
port: ${PORT[KUBELET_PORT]}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${PORT[KUBELET_HEALTHZ_PORT]}
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
cgroupDriver: cgroupfs
cgroupRoot: $(node_cgroup_root)
failCgroupV1: false
registerWithTaints:
- {key: ${NODE_TAINT%%=*}, value: "$(t=${NODE_TAINT#*=}; echo "${t%%:*}")", effect: ${NODE_TAINT##*:}}
resolvConf: ""
# Not /var/log/pods: the other local cluster's kubelet would collect this one's logs as orphans.
podLogsDir: $NODE_DIR/pod-logs
maxPods: 30
serializeImagePulls: false
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
shutdownGracePeriod: 0s
EOF
}

# The cgroup root of this node's pods, in every v1 hierarchy (the kubelet expects it to exist).
ensure_node_cgroups() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -e $h/cgroup.procs ]] && mkdir -p "$h$(node_cgroup_root)"
  done
}

iptables_first() { # iptables_first TABLE CHAIN RULE...: RULE at the top of CHAIN, once
  local table=$1 chain=$2
  shift 2
  iptables -w -t "$table" -C "$chain" "$@" 2>/dev/null || iptables -w -t "$table" -I "$chain" 1 "$@"
}

# The bridge exists before the kubelet starts, because the kubelet serves on the node address;
# the CNI bridge plugin adopts it (same name, gateway address already set). Idempotent, and never
# open for a moment: the guard chain is replaced atomically, the jumps go first in their chains.
# One running local cluster per index (KIMIK3_PORT_BASE / 100 % 64): its bridge, subnets, Service
# range, chains and cgroup root all derive from it, so a second cluster on the same index would
# quietly share them. The claim is a file in /run naming the cluster's state folder; it holds while
# that cluster's API server runs (a cluster that was killed leaves a claim nobody holds).
index_claim() { echo "/run/kimik3-e2e/index-$(node_index)"; }

claim_node_index() {
  local claim owner pid
  claim="$(index_claim)"
  mkdir -p "${claim%/*}"
  if [[ -s $claim ]] && owner="$(<"$claim")" && [[ $owner != "$STATE" ]] &&
     pid="$(cat "$owner/run/kube-apiserver.pid" 2>/dev/null)" && [[ $pid =~ ^[0-9]+$ ]] &&
     [[ "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" == *kube-apiserver* ]]; then
    die "cluster index $(node_index) (KIMIK3_PORT_BASE / 100 % 64) is the running local cluster's in $owner; choose another KIMIK3_PORT_BASE"
  fi
  echo "$STATE" >"$claim"
}

release_node_index() {
  local claim
  claim="$(index_claim)"
  [[ ! -f $claim || "$(<"$claim")" != "$STATE" ]] || rm -f "$claim"
}

ensure_node_network() {
  local br subnet nat guard svc existing
  claim_node_index
  br="$(node_bridge)" subnet="$(node_subnet)" nat="$(node_nat_chain)" guard="$(node_guard_chain)"
  svc="$(service_cidr)"
  # Someone else's route for our ranges (a VPN, another cluster) is never taken over.
  while read -r existing; do
    [[ -z $existing || $existing == *" dev $br "* ]] ||
      die "a route that is not this cluster's exists ($existing); choose another KIMIK3_PORT_BASE"
  done < <(ip route show exact "$svc"; ip route show exact "$subnet")
  if ! ip link show "$br" >/dev/null 2>&1; then
    ip link add "$br" type bridge
  fi
  ip addr replace "$(node_ip)/24" dev "$br"
  ip link set "$br" up
  # DNAT from the bridge to 127.0.0.1 (the API server) needs loopback destinations accepted there.
  sysctl -qw "net.ipv4.conf.$br.route_localnet=1"
  # The guard: a packet still addressed to the Service range after the nat table (no DNAT rule: no
  # ready endpoint) is refused at once; the bridge forwards only to itself.
  printf '%s\n' '*filter' ":$guard - [0:0]" "-A $guard -d $svc -j REJECT" "-A $guard -i $br -o $br -j ACCEPT" \
    "-A $guard -i $br -j DROP" COMMIT | iptables-restore -w --noflush
  iptables_first filter FORWARD -i "$br" -j "$guard"
  iptables_first filter FORWARD -d "$svc" -j "$guard"
  iptables_first filter OUTPUT -d "$svc" -j "$guard"
  # The Service range is routed to the bridge, never to the default route (an `unreachable` route
  # would fail local connects before the nat OUTPUT chain can DNAT them).
  ip route replace "$svc" dev "$br"
  iptables -w -t nat -N "$nat" 2>/dev/null || true
  iptables_first nat PREROUTING -i "$br" -d "$svc" -j "$nat"
  iptables_first nat OUTPUT -d "$svc" -j "$nat"
  # A pod that reaches a pod of this bridge through a Service gets the reply back through the node.
  iptables_first nat POSTROUTING -s "$subnet" -d "$subnet" -m conntrack --ctstate DNAT -j MASQUERADE
  # This cluster's fake nodes' pods, on the host's loopback (cni/kimik3-host-loopback): DNAT'ed,
  # so the kubelet's guard against outside packets to 127.0.0.0/8 (KUBE-FIREWALL) lets them in.
  iptables_first nat PREROUTING -i "$br" -d "$(host_loopback_via)" -j NETMAP --to "$(host_loopback)"
}

remove_node_network() {
  local br nat guard
  br="$(node_bridge)" nat="$(node_nat_chain)" guard="$(node_guard_chain)"
  while iptables -w -t nat -D PREROUTING -i "$br" -d "$(service_cidr)" -j "$nat" 2>/dev/null; do :; done
  while iptables -w -t nat -D OUTPUT -d "$(service_cidr)" -j "$nat" 2>/dev/null; do :; done
  while iptables -w -t nat -D POSTROUTING -s "$(node_subnet)" -d "$(node_subnet)" -m conntrack --ctstate DNAT -j MASQUERADE 2>/dev/null; do :; done
  while iptables -w -t nat -D PREROUTING -i "$br" -d "$(host_loopback_via)" -j NETMAP --to "$(host_loopback)" 2>/dev/null; do :; done
  while iptables -w -t filter -D FORWARD -i "$br" -j "$guard" 2>/dev/null; do :; done
  while iptables -w -t filter -D FORWARD -d "$(service_cidr)" -j "$guard" 2>/dev/null; do :; done
  while iptables -w -t filter -D OUTPUT -d "$(service_cidr)" -j "$guard" 2>/dev/null; do :; done
  iptables -w -t nat -F "$nat" 2>/dev/null && iptables -w -t nat -X "$nat" 2>/dev/null || true
  iptables -w -t filter -F "$guard" 2>/dev/null && iptables -w -t filter -X "$guard" 2>/dev/null || true
  ip route del "$(service_cidr)" dev "$br" 2>/dev/null || true
  # The kubelet's own machine-wide chains (its CVE-2020-8558 guard and canaries), once no kubelet
  # of another local cluster still runs (one that does would restore them anyway).
  if ! pgrep -x kubelet >/dev/null; then
    local table chain
    while iptables -w -D INPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    while iptables -w -D OUTPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    for table in filter nat mangle; do
      for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
        iptables -w -t "$table" -F "$chain" 2>/dev/null && iptables -w -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  fi
  ip link del "$br" 2>/dev/null || true
  release_node_index
}

# The pause image, into the registry once (podman, with e2e/images/build.sh's storage).
ensure_pause_image() {
  local ref
  ref="$(pause_image)"
  "${CURL[@]}" -f -o /dev/null -H 'Accept: application/vnd.oci.image.manifest.v1+json,application/vnd.docker.distribution.manifest.v2+json' \
    "http://$(registry_host)/v2/$PAUSE_REPOSITORY/manifests/${ref##*:}" 2>/dev/null && return 0
  local tmp
  tmp="$(mktemp -d)"
  install -D -m 0755 /usr/bin/catatonit "$tmp/rootfs/catatonit"
  tar -C "$tmp/rootfs" -cf "$tmp/pause.tar" .
  (
    eval "$("$ROOT/e2e/images/build.sh" env)"
    podman import --quiet --change 'ENTRYPOINT ["/catatonit", "-P"]' --change 'USER 65535:65535' \
      "$tmp/pause.tar" "$ref" >/dev/null
    podman push --quiet --tls-verify=false "$ref" >/dev/null
    podman rmi "$ref" >/dev/null # the registry keeps it
  ) || { rm -rf "$tmp"; die "could not make the pause image $ref"; }
  rm -rf "$tmp"
  log "pause image $ref in the registry"
}

# Kubernetes needs the node object Ready with the taint the kubelet registers.
node_ready() {
  [[ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

# Everything of the node's pods goes before containerd does: the kubelet is stopped first (no pod
# is started again), then every process in the node's cgroups is killed, its mounts and network
# namespaces removed. Only what is ours: our cgroup root, mounts under $NODE_DIR, namespaces whose
# address is in our subnet.
remove_node_pods() {
  local h f pid ns prefix
  for h in /sys/fs/cgroup/*/; do
    [[ -d $h$(node_cgroup_root) ]] || continue
    while IFS= read -r f; do # a cgroup may go while we read: its processes are gone with it
      for pid in $(cat "$f" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    done < <(find "$h$(node_cgroup_root)" -name cgroup.procs 2>/dev/null)
  done
  prefix="$(node_subnet)"; prefix="${prefix%.0/24}."
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    if ip netns exec "$ns" ip -4 -o addr show 2>/dev/null | grep -q " inet ${prefix//./\\.}"; then
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
}

remove_node_state() {
  local m pid
  # containerd's shims outlive it by design; ours name our socket on their command line.
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $CONTAINERD_SOCK" || true); do kill -KILL "$pid" 2>/dev/null || true; done
  # Deepest first; lazily, as a killed container can leave a mount busy for a moment.
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(findmnt -rn -o TARGET | grep -F "$NODE_DIR/" | sort -r)
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -d $h$(node_cgroup_root) ]] || continue
    find "$h$(node_cgroup_root)" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  rm -rf "$NODE_DIR" "$NODE_REGISTRY_DIR"
}
