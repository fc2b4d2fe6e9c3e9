"""The perf model's pure timing functions, as a caller timing single requests uses them: a prefix
hit saves exactly the prefix's own prefill, and speculative verify steps cost more than plain ones."""

from __future__ import annotations

import pytest

from kimik3_operator.planner import Layout
from kimik3_operator.planner.catalog import CATALOG
from kimik3_operator.planner.perf import decode_batch1, decode_step_ms, prefill_latency_seconds, prefill_seconds

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
