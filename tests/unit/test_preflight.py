"""`kimik3 preflight` (planner/preflight.py): what a cluster lacks for a KimiK3Deployment, from what
it serves and what its nodes advertise; exit 1 only when something every deployment needs is missing."""

from __future__ import annotations

from typing import Any

from kimik3_operator.cli import main
from kimik3_operator.contract.kinds import COMPUTE_DOMAIN, LEADER_WORKER_SET
from kimik3_operator.planner.preflight import REQUIREMENTS, ClusterView, preflight, table

LWS = (LEADER_WORKER_SET.api_version, LEADER_WORKER_SET.kind)
CD = (COMPUTE_DOMAIN.api_version, COMPUTE_DOMAIN.kind)
DEFAULT = {"metadata": {"name": "nfs", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}}


def node(name: str, product: str, gpus: int = 8, clique: str | None = None, rdma: int = 0) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": product}
    if clique:
        labels["nvidia.com/gpu.clique"] = clique
    allocatable = {"nvidia.com/gpu": str(gpus), "cpu": "100", "memory": "1000Gi"}
    if rdma:
        allocatable["rdma/ib"] = str(rdma)
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def _verdicts(view: ClusterView) -> dict[str, str]:
    return {f.requirement: f.verdict for f in preflight(view)}


def test_an_empty_cluster_misses_what_every_deployment_needs_and_says_what_to_install() -> None:
    findings = preflight(ClusterView(served=frozenset(), nodes=[], storage_classes=[]))
    missing = {f.requirement for f in findings if f.verdict == "missing"}
    assert missing == {"LeaderWorkerSet", "GPU nodes", "Storage"}
    assert all(f.hint for f in findings if f.verdict != "ok")
    assert [f.requirement for f in findings] == [r.name for r in REQUIREMENTS]
    text = table(findings)
    assert "install LeaderWorkerSet" in text and "missing" in text


def test_nvl72_trays_need_cliques_and_compute_domains_hgx_nodes_need_rdma() -> None:
    racks = [node(f"gb300-{i}", "NVIDIA-GB300", 4, clique="c1" if i else None) for i in range(3)]
    boards = [node("b200-0", "NVIDIA-B200")]
    view = ClusterView(served=frozenset({LWS}), nodes=racks + boards, storage_classes=[DEFAULT])
    v = _verdicts(view)
    assert (v["NVLink cliques"], v["ComputeDomain"], v["RDMA"]) == ("warn", "warn", "warn")
    assert (v["LeaderWorkerSet"], v["GPU nodes"], v["Storage"]) == ("ok", "ok", "ok")
    fixed = [node(f"gb300-{i}", "NVIDIA-GB300", 4, clique="c1") for i in range(3)] + [
        node("b200-0", "NVIDIA-B200", rdma=8)]
    v = _verdicts(ClusterView(served=frozenset({LWS, CD}), nodes=fixed, storage_classes=[DEFAULT]))
    assert (v["NVLink cliques"], v["ComputeDomain"], v["RDMA"]) == ("ok", "ok", "ok")


def test_gpus_without_a_known_product_label_cannot_be_planned() -> None:
    view = ClusterView(served=frozenset({LWS}), nodes=[node("x", "NVIDIA-Mystery-9000")], storage_classes=[DEFAULT])
    (gpu,) = [f for f in preflight(view) if f.requirement == "GPU nodes"]
    assert gpu.verdict == "missing" and "NVIDIA-Mystery-9000" in gpu.found
    mixed = ClusterView(served=frozenset({LWS}), nodes=[node("x", "NVIDIA-Mystery-9000"), node("y", "NVIDIA-H200")],
                        storage_classes=[DEFAULT])
    assert _verdicts(mixed)["GPU nodes"] == "warn"


def test_no_default_storage_class_is_a_warning_naming_the_spec_field() -> None:
    view = ClusterView(served=frozenset({LWS}), nodes=[node("y", "NVIDIA-H200")],
                       storage_classes=[{"metadata": {"name": "fast"}}])
    (storage,) = [f for f in preflight(view) if f.requirement == "Storage"]
    assert storage.verdict == "warn" and "storageClassName" in storage.found


def test_without_a_cluster_it_says_so_in_one_line(capsys: Any, monkeypatch: Any, tmp_path: Any) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    assert main(["preflight", "--context", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no cluster to check") and len(err.strip().splitlines()) == 1
