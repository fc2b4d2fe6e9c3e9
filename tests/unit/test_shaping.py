"""Per-role engine shaping: each rule over varied roles, GPUs, batches and speculation depths."""

from __future__ import annotations

import itertools

import pytest

from kimik3_operator.api.role_settings import Eplb
from kimik3_operator.kimi_k3 import BYTES_PER_EXPERT, MOE_LAYERS, NUM_EXPERTS
from kimik3_operator.planner import Layout
from kimik3_operator.planner.catalog import CATALOG
from kimik3_operator.planner.memory import memory_fit
from kimik3_operator.planner.shaping import (
    PREFILL_TOKENS_CEILING,
    PREFILL_TOKENS_FLOOR,
    capture_ceiling,
    capture_grid,
    redundant_experts,
    shape,
)

GPUS = [CATALOG[g] for g in ("GB300", "B200", "H200", "MI355X")]
BATCHES = [None, 1.0, 7.0, 64.0, 333.0, 5000.0]
LAYOUTS = [Layout(tensor=8), Layout(tensor=16), Layout(tensor=8, data=2, expert=True),
           Layout(tensor=1, data=16, expert=True), Layout(tensor=4, pipeline=2)]
COMMON = {"max_model_len": None, "kv_dtype": "fp8", "ssm_dtype": "float32"}


def _vllm_grid(ceiling: int) -> list[int]:
    """vLLM 0.33.0's default capture sizes up to `ceiling` (config/vllm.py:2573-2590)."""
    return sorted({s for s in [1, 2, 4, *range(8, 256, 8), *range(256, ceiling + 1, 16)] if s <= ceiling})


@pytest.mark.parametrize("tokens", [1, 3, 5, 8, 9, 255, 256, 257, 300, 1023, 1024, 4100])
def test_capture_lands_on_the_smallest_grid_size_at_or_above_the_batch(tokens: int) -> None:
    grid = _vllm_grid(8192)
    assert capture_grid(tokens) == min(s for s in grid if s >= tokens)


@pytest.mark.parametrize(("role", "gpu", "layout", "batch", "k"),
                         list(itertools.product(("decode", "aggregated"), GPUS, LAYOUTS, BATCHES, (0, 1, 3, 7))))
def test_decode_graphs_cover_every_sequence_times_its_verify_tokens(role, gpu, layout, batch, k) -> None:
    s = shape(role, gpu, layout, None, batch_at_slo=batch, input_tokens=8192, spec_tokens=k, **COMMON)
    assert s.max_cudagraph_capture_size is not None
    assert s.max_cudagraph_capture_size >= s.max_num_seqs * (1 + k)
    assert s.max_num_batched_tokens >= s.max_cudagraph_capture_size >= s.max_num_seqs >= 1
    # no wider than vLLM's own graph ceiling, so no decode step falls back to eager
    assert s.max_num_seqs * (1 + k) <= max(capture_ceiling(gpu), 1 + k)
    if batch is not None and batch / layout.data * (1 + k) <= capture_ceiling(gpu):
        assert s.max_num_seqs == -(-batch // layout.data)  # the SLO batch, spread over the DP ranks
    if role == "decode":
        assert s.max_num_batched_tokens == s.max_cudagraph_capture_size and s.long_prefill_token_threshold is None
    else:
        assert s.max_num_batched_tokens >= 8192 and s.long_prefill_token_threshold is not None


@pytest.mark.parametrize(("prompt", "max_len"), list(itertools.product((100, 8192, 9000, 20000, 40000, 500000),
                                                                       (None, 4096, 1 << 20))))
def test_prefill_takes_the_typical_prompt_in_one_step_within_bounds(prompt: int, max_len: int | None) -> None:
    s = shape("prefill", CATALOG["B200"], Layout(tensor=8), None, batch_at_slo=None, input_tokens=prompt,
              max_model_len=max_len, kv_dtype="fp8", spec_tokens=0, ssm_dtype="float32")
    assert PREFILL_TOKENS_FLOOR <= s.max_num_batched_tokens <= PREFILL_TOKENS_CEILING
    if prompt <= PREFILL_TOKENS_CEILING:
        assert s.max_num_batched_tokens >= prompt
    threshold = s.long_prefill_token_threshold
    assert threshold is not None and threshold <= s.max_num_batched_tokens
    assert threshold >= min(prompt, s.max_num_batched_tokens, max_len or prompt)
    assert max_len is None or threshold <= max_len  # vLLM refuses a threshold past max_model_len
    assert s.max_cudagraph_capture_size is None and 1 <= s.max_num_seqs <= s.max_num_batched_tokens


@pytest.mark.parametrize(("gpu", "layout"), list(itertools.product(GPUS + [CATALOG["B300"]], LAYOUTS)))
def test_eplb_only_for_nvidia_dep_where_one_more_expert_per_rank_fits(gpu, layout) -> None:
    got = redundant_experts(gpu, layout, "flashinfer_cutlass", spec_tokens=0, **COMMON)
    fit = memory_fit(gpu, layout.tensor, layout.pipeline, layout.data, layout.expert, max_model_len=None,
                     kv_dtype="fp8")
    room = fit.shortfall + MOE_LAYERS * BYTES_PER_EXPERT / layout.pipeline <= 0
    expected = gpu.vendor == "nvidia" and layout.expert and layout.data > 1 and room
    assert (got is not None) == expected
    if got is not None:
        ep = layout.tensor * layout.data
        assert got == ep and (NUM_EXPERTS + got) % ep == 0


def test_no_eplb_with_mega_moe() -> None:
    dep = Layout(tensor=1, data=16, expert=True)
    assert redundant_experts(CATALOG["GB300"], dep, "flashinfer_cutlass", spec_tokens=0, **COMMON) == 16
    assert redundant_experts(CATALOG["GB300"], dep, "deep_gemm_mega_moe", spec_tokens=0, **COMMON) is None


@pytest.mark.parametrize("role", ["prefill", "decode", "aggregated"])
def test_overrides_win_and_the_capture_follows_an_overridden_batch(role: str) -> None:
    dep = Layout(tensor=1, data=16, expert=True)
    given = {"max_num_seqs": 40, "long_prefill_token_threshold": 0,
             "eplb": Eplb.model_validate({"enabled": True, "redundantExperts": 32})}
    s = shape(role, CATALOG["GB300"], dep, None, batch_at_slo=900, input_tokens=8192, spec_tokens=3,
              overrides=given, **COMMON)
    assert (s.max_num_seqs, s.long_prefill_token_threshold, s.eplb_redundant_experts) == (40, 0, 32)
    if role != "prefill":
        assert s.max_cudagraph_capture_size == 160
    off = shape(role, CATALOG["GB300"], dep, None, batch_at_slo=900, input_tokens=8192, spec_tokens=3,
                overrides={"eplb": Eplb.model_validate({"enabled": False}), "max_num_batched_tokens": 2048,
                           "max_cudagraph_capture_size": 64},
                **COMMON)
    assert off.eplb_redundant_experts is None and off.max_num_batched_tokens == 2048
    assert off.max_cudagraph_capture_size == 64


@pytest.mark.parametrize(("engine", "reason_text"), [
    ({"maxNumSeqs": 64, "maxNumBatchedTokens": 32}, "maxNumBatchedTokens must be at least maxNumSeqs"),
    ({"longPrefillTokenThreshold": 8192}, "exceeds engine.maxModelLen 4096"),
    ({"eplb": {"enabled": True}}, "EPLB needs expert parallelism"),
])
def test_what_vllm_would_refuse_is_refused_before_rendering(engine: dict, reason_text: str) -> None:
    from pydantic import ValidationError

    from kimik3_operator.api import KimiK3Deployment
    from kimik3_operator.planner import PlanningError, plan_deployment, pool_facts
    from tests.support.cases import base_deployment
    from tests.support.nodes import gb300_rack

    body = base_deployment()
    body["spec"]["engine"] = {"maxModelLen": 4096}
    body["spec"]["pools"][0]["aggregated"] = {"replicas": 1, "parallelism": {"tensor": 8}, "engine": engine}
    with pytest.raises((PlanningError, ValidationError)) as info:
        spec = KimiK3Deployment.model_validate(body).spec
        plan_deployment(spec, {p.name: pool_facts(p.node_selector, gb300_rack()) for p in spec.pools})
    assert reason_text in str(info.value)
