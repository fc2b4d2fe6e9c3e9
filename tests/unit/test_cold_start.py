"""The predicted cold start of a replica: what each pod reads, at what speed, and what follows the
read; the same figure in the plan, the status fields and the start-up deadlines."""

from __future__ import annotations

import typing

import pytest
from pydantic import ValidationError

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.spec import ModelSource
from kimik3_operator.kimi_k3 import BF16_WEIGHT_BYTES, ROUTED_EXPERT_BYTES
from kimik3_operator.planner import plan_deployment
from kimik3_operator.planner.cold_start import IMAGE_PULL_S, STORAGE_BYTES_PER_S, capture_sizes, predict
from kimik3_operator.planner.loading import CHECKPOINT_BYTES, EXPERT_SCALE_BYTES, LOADERS, Loading, loading
from kimik3_operator.planner.plan import Layout, PlanningError
from kimik3_operator.planner.shaping import capture_grid
from kimik3_operator.planner.timeouts import startup_timeouts
from tests.support.cases import base_deployment

GB300 = {"nvidia.com/gpu.product": "NVIDIA-GB300"}


@pytest.mark.parametrize("ceiling", [1, 3, 4, 8, 100, 248, 255, 256, 257, 512, 1024])
def test_the_graphs_counted_are_the_sizes_on_vllms_capture_grid(ceiling: int) -> None:
    on_grid = {capture_grid(n) for n in range(1, ceiling + 1) if capture_grid(n) <= ceiling}
    assert capture_sizes(ceiling) == len(on_grid)


def test_its_parts_add_up_and_the_first_start_compiles_from_nothing() -> None:
    c = predict(CHECKPOINT_BYTES, 512)
    assert c.ready_seconds == c.image_pull_seconds + c.load_seconds + c.compile_seconds + c.graph_capture_seconds
    assert c.first_ready_seconds - c.ready_seconds == c.first_compile_seconds - c.compile_seconds > 0
    assert c.image_pull_seconds == IMAGE_PULL_S and c.read_source == "default"
    assert c.load_seconds == pytest.approx(c.pod_read_bytes / STORAGE_BYTES_PER_S, abs=1)
    fast = predict(CHECKPOINT_BYTES, 512, 10e9)
    assert fast.read_source == "spec" and fast.load_seconds * 10 == pytest.approx(c.load_seconds, abs=10)
    assert startup_timeouts(fast).distributed_seconds <= startup_timeouts(c).distributed_seconds


DEP16 = Layout(tensor=8, data=2, expert=True)  # two 8-GPU nodes
TP8_ON_TWO = Layout(tensor=8)  # two 4-GPU GB300 trays


def test_each_loader_reads_what_vllm_reads() -> None:
    instant = Loading(LOADERS["InstantTensor"], "auto", expert_filter=False)
    mapped = Loading(LOADERS["Safetensors"], "auto", expert_filter=False)
    # Collective: the replica reads each byte once, spread over its pods; memory-mapped: every node all.
    assert instant.pod_read_bytes(TP8_ON_TWO, 4) == pytest.approx(CHECKPOINT_BYTES / 2)
    assert mapped.pod_read_bytes(TP8_ON_TWO, 4) == pytest.approx(CHECKPOINT_BYTES)
    # The expert filter: a pod's own packed experts, every expert's scales, all dense weights.
    filtered = Loading(LOADERS["Safetensors"], "auto", expert_filter=True).pod_read_bytes(DEP16, 8)
    assert filtered == pytest.approx((ROUTED_EXPERT_BYTES - EXPERT_SCALE_BYTES) / 2 + EXPERT_SCALE_BYTES
                                     + BF16_WEIGHT_BYTES)
    assert filtered < 0.6 * CHECKPOINT_BYTES


@pytest.mark.parametrize(("choice", "vendor", "layout", "eplb", "args"), [
    ("Auto", "nvidia", TP8_ON_TWO, False, []),  # vLLM's default loads it so
    ("Auto", "amd", Layout(tensor=8), False, []),
    ("Auto", "nvidia", DEP16, False,
     ["--load-format", "safetensors", "--enable-ep-weight-filter", "--safetensors-load-strategy", "lazy"]),
    ("Auto", "nvidia", DEP16, True, []),  # EPLB needs every expert
    ("InstantTensor", "nvidia", TP8_ON_TWO, False, ["--load-format", "instanttensor"]),
    # No filter with InstantTensor: it would read per rank with O_DIRECT, no shared page cache.
    ("InstantTensor", "nvidia", DEP16, False, ["--load-format", "instanttensor"]),
])
def test_the_loader_chosen_and_its_flags(choice: str, vendor: str, layout: Layout, eplb: bool,
                                        args: list[str]) -> None:
    how = loading(choice, vendor, layout, eplb, "pool p role decode", vendor_from_nodes=False)
    assert how.args() == args and how.source == ("auto" if choice == "Auto" else "spec")


def test_instanttensor_on_amd_is_refused_and_waits_for_the_nodes_when_they_named_the_gpu() -> None:
    with pytest.raises(PlanningError, match="needs an NVIDIA GPU") as given:
        loading("InstantTensor", "amd", Layout(tensor=8), False, "pool p role aggregated", vendor_from_nodes=False)
    assert given.value.reason == "InvalidSpec" and not given.value.depends_on_nodes
    with pytest.raises(PlanningError) as labelled:
        loading("InstantTensor", "amd", Layout(tensor=8), False, "pool p role aggregated", vendor_from_nodes=True)
    assert labelled.value.depends_on_nodes


def test_every_loader_is_a_spec_choice() -> None:
    field = ModelSource.model_fields["loading"].annotation
    assert set(typing.get_args(field)) == {"Auto", *LOADERS}


def _pd(**model: object) -> KimiK3Deployment:
    body = base_deployment(name="k3", namespace="inference")
    body["spec"]["model"].update(model)
    body["spec"]["pools"] = [{"name": "gb300", "nodeSelector": GB300, "gpu": {"product": "GB300", "perNode": 4},
                              "interconnect": "NVLink",
                              "prefill": {"replicas": 1, "parallelism": {"tensor": 8}},
                              "decode": {"replicas": 2, "parallelism": {"tensor": 8, "data": 2, "expert": True}}}]
    return KimiK3Deployment.model_validate(body)


def test_the_spec_throughput_reaches_every_role_its_deadlines_and_its_status_fields() -> None:
    default = plan_deployment(_pd().spec, {})
    given = plan_deployment(_pd(readThroughput="4G").spec, {})
    for before, after in zip(default.pools[0].roles, given.pools[0].roles, strict=True):
        assert before.cold_start and after.cold_start and after.timeouts
        assert after.cold_start.read_bytes_per_s == 4_000_000_000 and after.cold_start.read_source == "spec"
        assert after.cold_start.load_seconds < before.cold_start.load_seconds
        assert after.timeouts.load_seconds == after.cold_start.load_seconds
        fields = after.cold_start_fields
        assert fields and fields["readySeconds"] == after.cold_start.ready_seconds and fields["readSource"] == "spec"
    # Decode captures graphs up to its capture size only; prefill up to vLLM's ceiling (its budget is larger).
    prefill, decode = (r.cold_start for r in given.pools[0].roles)
    assert prefill and decode and prefill.graph_capture_seconds != decode.graph_capture_seconds


@pytest.mark.parametrize("bad", ["1", "500k", "9M", "100m", "11T", "10E", "9" * 30 + "E"])
def test_a_throughput_outside_10M_to_10T_per_second_is_refused(bad: str) -> None:
    with pytest.raises(ValidationError, match="readThroughput is bytes per second"):
        _pd(readThroughput=bad)


def test_instanttensor_renders_its_backend_once_and_the_users_value_wins() -> None:
    from kimik3_operator.render.engine import engine_env

    def backends(env: list[dict[str, object]] | None = None) -> list[object]:
        body = _pd(loading="InstantTensor").model_dump(by_alias=True, exclude_none=True)
        if env is not None:
            body["spec"]["engine"] = {"env": env}
        plan = plan_deployment(KimiK3Deployment.model_validate(body).spec, {})
        roles = plan.pools[0].roles
        assert all(r.load_format == "instanttensor" and not r.expert_weight_filter for r in roles)
        return [e["value"] for r in roles for w in (False, True)
                for e in engine_env(r, plan.engine, worker=w) if e["name"] == "INSTANTTENSOR_BACKEND"]

    assert set(backends()) == {"AIO"} and len(backends()) == 4  # two roles, leader and worker
    assert backends([{"name": "INSTANTTENSOR_BACKEND", "value": "BUFFERED"}]) == ["BUFFERED"] * 4
