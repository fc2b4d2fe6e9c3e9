"""Start-up and collective deadlines grow with what one pod reads off the weights claim, keep their
order (collectives < engine ready < startup probe), and never fall below the floor."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kimik3_operator.planner.cold_start import STORAGE_BYTES_PER_S, predict
from kimik3_operator.planner.loading import CHECKPOINT_BYTES, LOADERS, Loading
from kimik3_operator.planner.plan import Layout
from kimik3_operator.planner.timeouts import FLOOR_S, POD_START_SKEW_S, startup_timeouts

layouts = st.builds(Layout, tensor=st.sampled_from((1, 2, 4, 8, 16)), pipeline=st.sampled_from((1, 2, 4)),
                    data=st.sampled_from((1, 2, 4, 8, 16, 18)), expert=st.booleans())
loadings = st.builds(Loading, loader=st.sampled_from(list(LOADERS.values())), source=st.just("auto"),
                     expert_filter=st.booleans())


@settings(max_examples=300, deadline=None, database=None)
@given(layout=layouts, how=loadings, gpus_per_pod=st.sampled_from((1, 2, 4, 8)))
def test_deadlines_cover_the_load_and_keep_their_order(layout: Layout, how: Loading, gpus_per_pod: int) -> None:
    gpus_per_pod = min(gpus_per_pod, layout.gpus)
    read = how.pod_read_bytes(layout, gpus_per_pod)
    assert 0 < read <= CHECKPOINT_BYTES * 1.0001  # a pod never reads more than the checkpoint
    t = startup_timeouts(predict(read, 512))
    assert t.distributed_seconds >= max(FLOOR_S, read / STORAGE_BYTES_PER_S + POD_START_SKEW_S)
    assert t.startup_probe_seconds > t.engine_ready_seconds > t.distributed_seconds
    assert all(v % 300 == 0 for v in (t.distributed_seconds, t.engine_ready_seconds))


@settings(max_examples=100, deadline=None, database=None)
@given(layout=layouts, how=loadings)
def test_a_pod_with_more_of_the_replica_reads_more_and_waits_longer(layout: Layout, how: Loading) -> None:
    sizes = [g for g in (1, 2, 4, 8) if g <= layout.gpus]
    reads = [how.pod_read_bytes(layout, g) for g in sizes]
    waits = [startup_timeouts(predict(r, 512)).engine_ready_seconds for r in reads]
    assert reads == sorted(reads) and waits == sorted(waits)


def test_slower_storage_waits_longer() -> None:
    read = Loading(LOADERS["Safetensors"], "auto", expert_filter=False).pod_read_bytes(Layout(tensor=8), 8)
    assert abs(read - CHECKPOINT_BYTES) < 1e6
    slower = startup_timeouts(predict(read, 512, STORAGE_BYTES_PER_S / 4))
    assert slower.distributed_seconds > startup_timeouts(predict(read, 512)).distributed_seconds
