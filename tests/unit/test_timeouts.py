"""Start-up and collective deadlines grow with what one pod reads off the weights claim, keep their
order (collectives < engine ready < startup probe), and never fall below the floor."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kimik3_operator.kimi_k3 import BF16_WEIGHT_BYTES, ROUTED_EXPERT_BYTES
from kimik3_operator.planner.cold_start import predict
from kimik3_operator.planner.plan import Layout
from kimik3_operator.planner.timeouts import (
    FLOOR_S,
    POD_START_SKEW_S,
    STORAGE_BYTES_PER_S,
    pod_weight_bytes,
    startup_timeouts,
)

TOTAL = ROUTED_EXPERT_BYTES + BF16_WEIGHT_BYTES

layouts = st.builds(Layout, tensor=st.sampled_from((1, 2, 4, 8, 16)), pipeline=st.sampled_from((1, 2, 4)),
                    data=st.sampled_from((1, 2, 4, 8, 16, 18)), expert=st.booleans())


@settings(max_examples=300, deadline=None, database=None)
@given(layout=layouts, gpus_per_pod=st.sampled_from((1, 2, 4, 8)))
def test_deadlines_cover_the_load_and_keep_their_order(layout: Layout, gpus_per_pod: int) -> None:
    gpus_per_pod = min(gpus_per_pod, layout.gpus)
    read = pod_weight_bytes(layout, gpus_per_pod)
    assert 0 < read <= TOTAL * 1.0001  # a pod never reads more than the checkpoint
    t = startup_timeouts(predict(layout, gpus_per_pod, 512))
    assert t.distributed_seconds >= max(FLOOR_S, read / STORAGE_BYTES_PER_S + POD_START_SKEW_S)
    assert t.startup_probe_seconds > t.engine_ready_seconds > t.distributed_seconds
    assert all(v % 300 == 0 for v in (t.distributed_seconds, t.engine_ready_seconds))


@settings(max_examples=100, deadline=None, database=None)
@given(layout=layouts)
def test_a_pod_with_more_of_the_replica_reads_more_and_waits_longer(layout: Layout) -> None:
    sizes = [g for g in (1, 2, 4, 8) if g <= layout.gpus]
    reads = [pod_weight_bytes(layout, g) for g in sizes]
    waits = [startup_timeouts(predict(layout, g, 512)).engine_ready_seconds for g in sizes]
    assert reads == sorted(reads) and waits == sorted(waits)


def test_a_whole_replica_on_one_node_reads_the_whole_checkpoint() -> None:
    assert abs(pod_weight_bytes(Layout(tensor=8), 8) - TOTAL) < 1e6
    slower = startup_timeouts(predict(Layout(tensor=8), 8, 512, STORAGE_BYTES_PER_S / 4))
    assert slower.distributed_seconds > startup_timeouts(predict(Layout(tensor=8), 8, 512)).distributed_seconds
