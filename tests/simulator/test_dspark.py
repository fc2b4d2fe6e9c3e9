"""DSpark speculative decoding on golden gb300-tp16-dspark (aggregated TP16, 7 speculative tokens):
several tokens per step at the configured acceptance, tokens per second as the plan predicts for
the published acceptance range's two ends, and vLLM's spec-decode counters."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from .sims import role_report, simulator, words

SCENARIO = "gb300-tp16-dspark"


@pytest.mark.parametrize("end,acceptance", [("Low", None), ("High", "4.73")])
def test_dspark_emits_several_tokens_per_step_at_the_planned_speed(end: str, acceptance: str | None,
                                                                   tmp_path: Path) -> None:
    role = role_report(SCENARIO, "aggregated")
    expected_acceptance = role["predicted"][f"speculativeAcceptance{end}"]
    env = {"K3SIM_GPU_PRODUCT": role["gpuProduct"], **({"K3SIM_DSPARK_ACCEPTANCE": acceptance} if acceptance else {})}
    with simulator(role["command"], tmp_path, env) as sim:
        events = sim.stream("/v1/completions", {"prompt": words(8192, "spark"), "max_tokens": 160,
                                                "stream_options": {"include_usage": True}})
        chunks: list[tuple[float, Any]] = [(t, e) for t, e in events if isinstance(e, dict) and e["choices"]]
        per_step = [len(e["choices"][0]["text"].split()) for _, e in chunks]
        assert sum(per_step) == events[-2][1]["usage"]["completion_tokens"] == 160
        decoded = per_step[1:-1]  # the first token comes from prefill; the last step may be cut by max_tokens
        assert set(decoded) <= {int(expected_acceptance), int(expected_acceptance) + 1}
        assert statistics.mean(decoded) == pytest.approx(expected_acceptance, abs=0.1)
        tokens_per_s = sum(per_step[1:]) / (chunks[-1][0] - chunks[0][0])
        planned = role["predicted"][f"speculativeTokensPerSecondBatch1At{end}Acceptance"]
        print(f"\nDSpark at acceptance {expected_acceptance}: {tokens_per_s:.0f} tok/s (plan {planned:.0f}), "
              f"{statistics.mean(decoded):.2f} tokens per step")
        assert tokens_per_s == pytest.approx(planned, rel=0.15)
        drafts = sim.metric("vllm:spec_decode_num_drafts_total")
        assert drafts == len(per_step) - 1
        assert sim.metric("vllm:spec_decode_num_draft_tokens_total") == 7 * drafts
        accepted = sim.metric("vllm:spec_decode_num_accepted_tokens_total")
        assert accepted == sum(per_step[1:]) - drafts  # every step also emits its bonus token
        assert sim.metric("vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0") == drafts
