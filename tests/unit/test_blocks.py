"""The block size vLLM 0.33.0 aligns Kimi K3 to, against values computed with vLLM's own
`_align_hybrid_block_size` for the K3 shapes (TP x KV dtype x SSM dtype x speculative tokens)."""

from __future__ import annotations

import pytest

from kimik3_operator.planner.blocks import block_size, round_interval

# (tp) -> [bf16/fp32 S0, S7, bf16/bf16 S0, S7, fp8/fp32 S0, S7, fp8/bf16 S0, S7]
VLLM = {
    1: [5760, 6144, 2944, 3456, 11392, 12288, 5888, 6784],
    4: [1536, 1536, 768, 896, 2944, 3072, 1536, 1792],
    8: [768, 768, 384, 512, 1536, 1536, 768, 896],
    16: [384, 384, 256, 256, 768, 768, 384, 512],
}
COLUMNS = [(kv, ssm, s) for kv, ssm in (("bf16", "float32"), ("bf16", "bfloat16"), ("fp8", "float32"),
                                        ("fp8", "bfloat16")) for s in (0, 7)]


@pytest.mark.parametrize("tp", sorted(VLLM))
def test_block_size_matches_vllm(tp: int) -> None:
    assert [block_size(tp, kv, ssm, s) for kv, ssm, s in COLUMNS] == VLLM[tp]


@pytest.mark.parametrize(("requested", "granularity", "effective"), [
    (32768, 768, 33024), (33024, 768, 33024), (1, 768, 768), (1152, 768, 1536), (1151, 768, 768),
])
def test_round_interval(requested: int, granularity: int, effective: int) -> None:
    assert round_interval(requested, granularity) == effective
