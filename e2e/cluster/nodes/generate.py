#!/usr/bin/env python3
"""Write the fake GPU node pools of the local e2e cluster (one YAML file per pool, next to this script)
and the ResourceSlices of their ComputeDomain channels (../compute-domain/resourceslices.yaml).

The YAML files are committed so that tests and `kimik3 plan --nodes` can read them directly; this
script is their source. Edit the POOLS table and run `python3 e2e/cluster/nodes/generate.py`.

Why each field is there:
- annotation kwok.x-k8s.io/node=fake: kwok only manages nodes matching this selector (cluster.sh
  starts it with --manage-nodes-with-annotation-selector), so it never touches anything else.
- label type=kwok: one selector for "all fake nodes" (cluster.sh waits on it).
- nvidia.com/gpu.* labels: the names GPU Feature Discovery publishes; the operator reads pool facts
  from them (product, count, memory in MiB as nvidia-smi reports it, compute capability, and the
  NVLink clique "<clusterUUID>.<cliqueID>" that only NVL72 racks have).
- status.capacity/allocatable: Node create keeps status, and kwok's node-initialize stage keeps the
  capacity it finds, so the scheduler sees nvidia.com/gpu and rdma/ib as extended resources.
  Node *updates* drop status: change capacity later with `kubectl patch --subresource=status`.
- GPU nodes carry the taint GPU node pools commonly carry (nvidia.com/gpu=present:NoSchedule, as
  EKS and GKE GPU node groups set it): only pods that tolerate it land there. The operator's serving
  pods tolerate it (planner/scheduling.py); routers and staging Jobs do not, and land on the CPU
  nodes (cpu.yaml: no GPU, no taint), as on a platform team's cluster.

Each NVL72 tray (a node with a clique) also gets the ResourceSlice that the kubelet plugin of NVIDIA's
DRA driver publishes for ComputeDomains: driver compute-domain.nvidia.com, pool = node name, the one
device `channel-0` (type=channel, id=0) that the DeviceClass compute-domain-default-channel.nvidia.com
selects. A device serves one claim at a time, so a tray serves one ComputeDomain pod at a time. The
real plugin also publishes a `daemon-0` device for its IMEX daemon pods; nothing here needs it.
"""

from __future__ import annotations

import pathlib
import uuid

HERE = pathlib.Path(__file__).resolve().parent

# Two GB300 racks (two NVLink cliques) so tests can check a replica never straddles racks.
# name prefix, file, node count, GPUs per node, product label, MiB per GPU, compute capability,
# GPU family, CPU arch, CPUs, memory, NVLink clique of the whole pool (NVL72 racks only).
def gb300_rack(n: int) -> dict:
    """One GB300 NVL72 rack: 18 Grace trays x 4 GPUs, one NVLink clique. The clusterUUID is uuid5 of
    "gb300-rack<n>.e2e.kimik3.dev", so the clique label is stable across runs."""
    return dict(
        file=f"gb300-nvl72-rack{n}.yaml",
        comment=f"GB300 NVL72 rack {n}: 18 compute trays x 4 GPUs, one NVLink domain (clique).",
        prefix=f"gb300-rack{n}-",
        count=18,
        digits=2,
        gpus=4,
        product="NVIDIA-GB300",
        memory_mib=284208,
        cc=(10, 3),
        family="blackwell",
        arch="arm64",  # Grace CPUs
        cpu="144",
        memory="960Gi",
        instance_type="gb300-nvl72-tray",
        clique=f"{uuid.uuid5(uuid.NAMESPACE_DNS, f'gb300-rack{n}.e2e.kimik3.dev')}.0",
    )


POOLS = [
    gb300_rack(0),
    gb300_rack(1),
    dict(
        file="b200-hgx.yaml",
        comment="Four HGX B200 nodes: 8 GPUs each, NVLink inside a node, InfiniBand (rdma/ib) between nodes.",
        prefix="b200-hgx-",
        count=4,
        digits=1,
        gpus=8,
        product="NVIDIA-B200",
        memory_mib=183359,
        cc=(10, 0),
        family="blackwell",
        arch="amd64",
        cpu="224",
        memory="2Ti",
        instance_type="hgx-b200",
        clique=None,
    ),
    dict(
        file="h200-hgx.yaml",
        comment="Two HGX H200 nodes: 8 GPUs each, NVLink inside a node, InfiniBand (rdma/ib) between nodes.",
        prefix="h200-hgx-",
        count=2,
        digits=1,
        gpus=8,
        product="NVIDIA-H200",
        memory_mib=143771,
        cc=(9, 0),
        family="hopper",
        arch="amd64",
        cpu="192",
        memory="2Ti",
        instance_type="hgx-h200",
        clique=None,
    ),
]

CPU_POOL = dict(
    file="cpu.yaml",
    comment="Four CPU nodes (no GPU, no taint): where routers, staging Jobs and other workloads run.",
    prefix="cpu-",
    count=4,
    digits=1,
    gpus=0,
    arch="amd64",
    cpu="64",
    memory="256Gi",
    instance_type="cpu-general",
    clique=None,
)
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

# Shared-device RDMA resource as k8s-rdma-shared-dev-plugin / the NVIDIA Network Operator publish it:
# a count of pods that may share the HCAs, not a NIC count.
RDMA_RESOURCE = "rdma/ib"
RDMA_SHARES = "64"


def node_name(pool: dict, index: int) -> str:
    return f"{pool['prefix']}{index:0{pool['digits']}d}"


def node(pool: dict, index: int) -> str:
    name = node_name(pool, index)
    labels = {
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": pool["arch"],
        "node.kubernetes.io/instance-type": pool["instance_type"],
        "topology.kubernetes.io/region": "e2e",
        "topology.kubernetes.io/zone": "e2e-a",
    }
    resources = {"cpu": pool["cpu"], "memory": pool["memory"], "ephemeral-storage": "3Ti", "pods": "110"}
    if pool["gpus"]:
        labels.update({
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": pool["product"],
            "nvidia.com/gpu.count": str(pool["gpus"]),
            "nvidia.com/gpu.memory": str(pool["memory_mib"]),
            "nvidia.com/gpu.family": pool["family"],
            "nvidia.com/gpu.compute.major": str(pool["cc"][0]),
            "nvidia.com/gpu.compute.minor": str(pool["cc"][1]),
        })
        resources.update({"nvidia.com/gpu": str(pool["gpus"]), RDMA_RESOURCE: RDMA_SHARES})
    if pool["clique"]:
        labels["nvidia.com/gpu.clique"] = pool["clique"]
    out = [
        "apiVersion: v1",
        "kind: Node",
        "metadata:",
        f"  name: {name}",
        "  annotations:",
        "    kwok.x-k8s.io/node: fake",
        '    node.alpha.kubernetes.io/ttl: "0"',
        "  labels:",
    ]
    out += [f'    {k}: "{v}"' for k, v in labels.items()]
    if pool["gpus"]:
        out += ["spec:", "  taints:", *[f"  - {{key: {GPU_TAINT['key']}, value: {GPU_TAINT['value']}, "
                                        f"effect: {GPU_TAINT['effect']}}}"]]
    out += ["status:", "  capacity:"]
    out += [f'    {k}: "{v}"' for k, v in resources.items()]
    out += ["  allocatable:"]
    out += [f'    {k}: "{v}"' for k, v in resources.items()]
    out += [
        "  nodeInfo:",
        f"    architecture: {pool['arch']}",
        "    operatingSystem: linux",
    ]
    return "\n".join(out) + "\n"


COMPUTE_DOMAIN_DRIVER = "compute-domain.nvidia.com"
RESOURCE_SLICES = HERE.parent / "compute-domain" / "resourceslices.yaml"


def channel_slice(name: str) -> str:
    return "\n".join(
        [
            "apiVersion: resource.k8s.io/v1",
            "kind: ResourceSlice",
            "metadata:",
            f"  name: {name}-{COMPUTE_DOMAIN_DRIVER}",
            "spec:",
            f"  driver: {COMPUTE_DOMAIN_DRIVER}",
            f"  nodeName: {name}",
            "  pool:",
            f"    name: {name}",
            "    generation: 1",
            "    resourceSliceCount: 1",
            "  devices:",
            "  - name: channel-0",
            "    attributes:",
            "      type: {string: channel}",
            "      id: {int: 0}",
        ]
    ) + "\n"


def main() -> None:
    slices = []
    for pool in [*POOLS, CPU_POOL]:
        docs = [node(pool, i) for i in range(pool["count"])]
        header = (
            f"# {pool['comment']}\n"
            "# Generated by generate.py in this folder: edit that and rerun, do not edit by hand.\n"
        )
        (HERE / pool["file"]).write_text(header + "---\n".join(docs))
        if pool["clique"]:
            slices += [channel_slice(node_name(pool, i)) for i in range(pool["count"])]
    header = (
        "# ComputeDomain channel ResourceSlices, one per NVL72 tray, as NVIDIA's DRA kubelet plugin publishes them.\n"
        "# Generated by ../nodes/generate.py: edit that and rerun, do not edit by hand.\n"
    )
    RESOURCE_SLICES.write_text(header + "---\n".join(slices))


if __name__ == "__main__":
    main()
