"""The predicted cold start of a replica: what each pod reads, at what speed, and what follows the
read; the same figure in the plan, the status fields and the start-up deadlines."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.planner import plan_deployment
from kimik3_operator.planner.cold_start import IMAGE_PULL_S, capture_sizes, predict
from kimik3_operator.planner.plan import Layout
from kimik3_operator.planner.shaping import capture_grid
from kimik3_operator.planner.timeouts import STORAGE_BYTES_PER_S, startup_timeouts
from tests.support.cases import base_deployment

GB300 = {"nvidia.com/gpu.product": "NVIDIA-GB300"}


@pytest.mark.parametrize("ceiling", [1, 3, 4, 8, 100, 248, 255, 256, 257, 512, 1024])
def test_the_graphs_counted_are_the_sizes_on_vllms_capture_grid(ceiling: int) -> None:
    on_grid = {capture_grid(n) for n in range(1, ceiling + 1) if capture_grid(n) <= ceiling}
    assert capture_sizes(ceiling) == len(on_grid)


def test_its_parts_add_up_and_the_first_start_compiles_from_nothing() -> None:
    c = predict(Layout(tensor=8), 8, 512)
    assert c.ready_seconds == c.image_pull_seconds + c.load_seconds + c.compile_seconds + c.graph_capture_seconds
    assert c.first_ready_seconds - c.ready_seconds == c.first_compile_seconds - c.compile_seconds > 0
    assert c.image_pull_seconds == IMAGE_PULL_S and c.read_source == "default"
    assert c.load_seconds == pytest.approx(c.pod_read_bytes / STORAGE_BYTES_PER_S, abs=1)


def test_expert_parallel_pods_read_their_experts_only_and_faster_storage_loads_faster() -> None:
    whole = predict(Layout(tensor=8), 8, 512)
    dep16 = predict(Layout(tensor=8, data=2, expert=True), 8, 512)  # two nodes, each half the experts
    assert dep16.pod_read_bytes < 0.6 * whole.pod_read_bytes
    fast = predict(Layout(tensor=8), 8, 512, 10e9)
    assert fast.read_source == "spec" and fast.load_seconds * 10 == pytest.approx(whole.load_seconds, abs=10)
    assert startup_timeouts(fast).distributed_seconds <= startup_timeouts(whole).distributed_seconds


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


@pytest.mark.parametrize("bad", ["1", "500k", "9M", "100m"])
def test_a_throughput_below_10M_per_second_is_refused_as_a_unit_slip(bad: str) -> None:
    with pytest.raises(ValidationError, match="readThroughput is bytes per second"):
        _pd(readThroughput=bad)
