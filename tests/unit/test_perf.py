"""The perf model's pure timing functions, as a caller timing single requests uses them: a prefix
hit saves exactly the prefix's own prefill, and speculative verify steps cost more than plain ones."""

from __future__ import annotations

import math

import pytest

from kimik3_operator.planner import Layout
from kimik3_operator.planner.catalog import CATALOG
from kimik3_operator.planner.perf import (
    allreduce_us,
    decode_batch1,
    decode_step_ms,
    fixed_ms,
    prefill_latency_seconds,
    prefill_seconds,
    tensor_allreduce_ms,
)

GB300 = CATALOG["GB300"]
TP8 = Layout(tensor=8)
DEP16 = Layout(tensor=4, data=4, expert=True)


@pytest.mark.parametrize("layout", [TP8, DEP16])
@pytest.mark.parametrize(("prompt", "hit"), [(8192, 4096), (131072, 32768), (1000, 0)])
def test_a_prefix_hit_saves_exactly_the_prefix_prefill(layout: Layout, prompt: int, hit: int) -> None:
    rest = prefill_seconds(GB300, layout, prompt, cached_tokens=hit)
    assert rest + prefill_seconds(GB300, layout, hit) == pytest.approx(prefill_seconds(GB300, layout, prompt))


def test_one_prompt_runs_on_one_data_parallel_rank() -> None:
    whole = prefill_seconds(GB300, DEP16, 8192, cached_tokens=1024)
    assert prefill_latency_seconds(GB300, DEP16, 8192, cached_tokens=1024) == whole * DEP16.data


@pytest.mark.parametrize("hit", [-1, 8193])
def test_a_hit_outside_the_prompt_is_refused(hit: int) -> None:
    with pytest.raises(ValueError, match="cached_tokens"):
        prefill_seconds(GB300, TP8, 8192, cached_tokens=hit)


def test_verify_steps_cost_more_and_grow_with_batch() -> None:
    plain = decode_step_ms(GB300, TP8, False, 32, 8192, "fp8")
    verify = decode_step_ms(GB300, TP8, False, 32, 8192, "fp8", spec_tokens=7)
    assert plain < verify < decode_step_ms(GB300, TP8, False, 64, 8192, "fp8", spec_tokens=7)


@pytest.mark.parametrize("spec_tokens", [0, 7])
def test_a_batch_of_one_steps_as_fast_as_the_lone_user_prediction(spec_tokens: int) -> None:
    lone = decode_batch1(GB300, TP8, False, context=8192, spec_tokens=spec_tokens, kv_dtype="fp8")
    step = decode_step_ms(GB300, TP8, False, 1, 8192, "fp8", spec_tokens=spec_tokens)
    assert step == pytest.approx(lone.inputs["stepMs"])


@pytest.mark.parametrize("tokens", [1, 8, 256, 4096])
def test_wider_tensor_groups_pay_more_all_reduce_and_tp8_keeps_its_calibration(tokens: int) -> None:
    """TP8's fixed latency is the calibrated one; TP16 adds what its all-reduces cost beyond TP8's
    (more hops, same message), never less; narrower groups keep the calibration."""
    for gpu in (GB300, CATALOG["B200"], CATALOG["H200"]):
        for rdma in (False, True):
            base = fixed_ms(rdma)
            assert fixed_ms(rdma, gpu, 8, tokens) == base == fixed_ms(rdma, gpu, 4, tokens)
            costs = [tensor_allreduce_ms(gpu, tp, tokens, rdma) for tp in (1, 2, 4, 8, 16, 32)]
            assert costs[0] == 0 and costs == sorted(costs)
            assert base < fixed_ms(rdma, gpu, 16, tokens) < fixed_ms(rdma, gpu, 32, tokens)


@pytest.mark.parametrize("ranks", [2, 4, 8, 16, 64])
@pytest.mark.parametrize("nbytes", [14336, 1 << 20, 1 << 28])
def test_an_all_reduce_is_bounded_by_its_latency_and_bandwidth_floors(ranks: int, nbytes: int) -> None:
    """No faster than moving 2 (p - 1) / p of the message per rank or than log2 p hops each way;
    no slower than a double binary tree (NCCL would pick the better of ring and tree)."""
    link, hop = 900.0, 1.0
    t = allreduce_us(ranks, nbytes, link, hop)
    transfer = nbytes / (link * 1e3)
    assert t >= 2 * (ranks - 1) / ranks * transfer and t >= 2 * math.ceil(math.log2(ranks)) * hop
    assert t <= 2 * math.ceil(math.log2(ranks)) * hop + 2 * transfer
    assert allreduce_us(1, nbytes, link, hop) == 0


def test_tp16_batch1_is_slower_than_bandwidth_alone_predicts() -> None:
    """Halving the bytes per GPU (TP8 -> TP16) no longer comes for free: the extra all-reduce hops
    cost every step."""
    tp8, tp16 = decode_batch1(GB300, TP8, False), decode_batch1(GB300, Layout(tensor=16), False)
    assert tp16.inputs["fixedMs"] > tp8.inputs["fixedMs"]
    assert tp16.inputs["stepMs"] - tp16.inputs["fixedMs"] < tp8.inputs["stepMs"] - tp8.inputs["fixedMs"]
