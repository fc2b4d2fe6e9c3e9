"""Kimi K3's figures agree with one another: the flat figures the perf model counts with match
what the exact shapes give."""

from __future__ import annotations

import pytest

from kimik3_operator import kimi_k3 as k3


def test_layer_counts_add_up() -> None:
    assert k3.KDA_LAYERS + k3.MLA_LAYERS == k3.LAYERS
    assert k3.MOE_LAYERS == k3.LAYERS - 1  # the first layer's MLP is dense


def test_flat_kda_state_matches_the_per_layer_shapes() -> None:
    exact = k3.kda_state_bytes(1, 0, "float32") * k3.KDA_LAYERS
    assert exact == pytest.approx(k3.KDA_STATE_BYTES, rel=1e-3)


def test_kda_state_shards_over_tensor_parallel_ranks_and_grows_with_drafts() -> None:
    assert k3.kda_state_bytes(8, 0, "float32") == k3.kda_state_bytes(1, 0, "float32") // 8
    assert k3.kda_state_bytes(8, 0, "bfloat16") < k3.kda_state_bytes(8, 0, "float32")
    assert k3.kda_state_bytes(8, 7, "float32") > k3.kda_state_bytes(8, 0, "float32")


def test_routed_expert_bytes_are_every_expert_of_every_moe_layer() -> None:
    total = k3.BYTES_PER_EXPERT * k3.NUM_EXPERTS * k3.MOE_LAYERS
    assert total == pytest.approx(k3.ROUTED_EXPERT_BYTES, rel=1e-3)


def test_published_acceptance_range_is_ordered() -> None:
    low, high = k3.PUBLISHED.acceptance_range
    assert 1 < low < high <= 1 + k3.PUBLISHED.dspark_tokens

