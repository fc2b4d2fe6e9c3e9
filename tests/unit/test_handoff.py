"""Prefill/decode pairs vLLM 0.33.0's NIXL handshake would refuse are avoided or refused before any
pod exists (planner/handoff.py, docs/pd-handoff.md); tests/contract/test_handoff_contract.py holds
the same rule to vLLM's own code."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.reasons import INVALID_SPEC, PD_INCOMPATIBLE
from kimik3_operator.planner import PlanningError, plan_deployment, pool_facts
from kimik3_operator.planner.admission import admission_verdict
from kimik3_operator.render.engine import kv_transfer_config
from tests.support.cases import base_deployment
from tests.support.nodes import gb300_rack

GB300 = {"product": "GB300"}


def _body(pools: list[dict[str, Any]], **engine: Any) -> dict[str, Any]:
    body = copy.deepcopy(base_deployment())
    body["spec"]["pools"] = pools
    if engine:
        body["spec"]["engine"] = engine
    return body


def _plan(body: dict[str, Any], nodes: list[dict[str, Any]] | None = None):  # type: ignore[no-untyped-def]
    spec = KimiK3Deployment.model_validate(body).spec
    return plan_deployment(spec, {p.name: pool_facts(p.node_selector, nodes or []) for p in spec.pools})


def _layouts(plan) -> dict[str, tuple[int, int]]:  # type: ignore[no-untyped-def]
    return {f"{p.name}/{r.role}": (r.layout.tensor, r.layout.data) for p, r in plan.role_plans()}


def test_a_gb300_pd_pool_plans_a_pair_that_shares_the_decodes_tensor_size() -> None:
    """Left alone, a prefill would take TP4 x DP2 (the smallest tensor size that fits) beside a TP8
    decode: 46 against 24 kernel blocks per KV block, refused at the first hand-off."""
    plan = _plan(_body([{"name": "g", "gpu": GB300, "prefill": {}, "decode": {"replicas": 2}}]))
    assert _layouts(plan) == {"g/prefill": (8, 1), "g/decode": (8, 1)}
    assert {r.block_size for _, r in plan.role_plans()} == {1536}


def test_on_nodes_too() -> None:
    nodes = gb300_rack()
    plan = _plan(_body([{"name": "g", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"},
                         "prefill": {}, "decode": {"replicas": 2}}]), nodes)
    assert _layouts(plan) == {"g/prefill": (8, 1), "g/decode": (8, 1)}


def test_an_explicit_decode_sets_the_size_the_planner_gives_its_prefill() -> None:
    plan = _plan(_body([{"name": "g", "gpu": GB300, "prefill": {},
                         "decode": {"replicas": 2, "parallelism": {"tensor": 16}}}]))
    assert _layouts(plan) == {"g/prefill": (16, 1), "g/decode": (16, 1)}


def test_an_explicit_prefill_sets_the_size_of_a_decode_in_another_pool() -> None:
    plan = _plan(_body([
        {"name": "p", "gpu": {"product": "B200"}, "prefill": {"replicas": 1, "parallelism": {"tensor": 8, "data": 2,
                                                                                            "expert": True}}},
        {"name": "d", "gpu": GB300, "decode": {"replicas": 2}}]))
    assert _layouts(plan) == {"p/prefill": (8, 2), "d/decode": (8, 1)}


@pytest.mark.parametrize(("pools", "numbers"), [
    # the old design-reference example: TP1 x DP16 prefill, TP8 decode (FP8 KV, DSpark off)
    ([{"name": "g", "gpu": GB300, "prefill": {"replicas": 1, "parallelism": {"tensor": 1, "data": 16, "expert": True}},
       "decode": {"replicas": 2, "parallelism": {"tensor": 8}}}],
     ["TP1 x DP16, EP16 on GB300: KV block 11392 tokens = 178 FLASHINFER_MLA kernel blocks of 64",
      "TP8 on GB300: KV block 1536 tokens = 24 FLASHINFER_MLA kernel blocks of 64"]),
    # across pools and Blackwell products: B200 DEP16 prefill, GB300 TP16 decode
    ([{"name": "p", "gpu": {"product": "B200"}, "prefill": {"replicas": 1, "parallelism": {"tensor": 8, "data": 2,
                                                                                          "expert": True}}},
      {"name": "d", "gpu": GB300, "decode": {"replicas": 2, "parallelism": {"tensor": 16}}}],
     ["pool p role prefill (TP8 x DP2, EP16 on B200: KV block 1536 tokens = 24",
      "pool d role decode (TP16 on GB300: KV block 768 tokens = 12", "24 on the prefill"]),
])
def test_explicit_layouts_vllm_would_refuse_are_refused_at_admission_with_the_numbers(
        pools: list[dict[str, Any]], numbers: list[str]) -> None:
    verdict = admission_verdict(_body(pools))
    assert verdict is not None and verdict.startswith(f"{PD_INCOMPATIBLE}: "), verdict
    assert "nixl/base_worker.py:2766-2779" in verdict
    for number in numbers:
        assert number in verdict, verdict


def test_tensor_sizes_that_do_not_divide_one_another_are_refused_first() -> None:
    """vLLM checks the tensor ratio before the blocks (kv_connector/utils.py:522-539)."""
    body = _body([{"name": "g", "gpu": GB300, "prefill": {"replicas": 1, "parallelism": {"tensor": 12}},
                   "decode": {"replicas": 2, "parallelism": {"tensor": 8}}}])
    with pytest.raises(PlanningError) as refused:
        _plan(body)
    assert refused.value.reason == PD_INCOMPATIBLE and "tensor sizes 12 and 8 do not divide" in refused.value.message


def test_a_decode_with_a_larger_tensor_size_than_its_prefill_is_refused_on_hopper_bf16() -> None:
    """The decode's 768-token kernel block cannot read the prefill's 1,536-token one without
    splitting it in two, which doubles the prefill's blocks per logical block (docs/pd-handoff.md)."""
    body = _body([{"name": "h", "gpu": {"product": "H200"},
                   "prefill": {"replicas": 1, "parallelism": {"tensor": 4, "data": 8, "expert": True}},
                   "decode": {"replicas": 2, "parallelism": {"tensor": 8, "data": 2, "expert": True}}}],
                 kvCacheDtype="auto", maxModelLen=131072)
    with pytest.raises(PlanningError) as refused:
        _plan(body)
    assert "1 on the decode, 2 on the prefill" in refused.value.message


def test_without_prefix_caching_the_block_rule_does_not_apply() -> None:
    body = _body([{"name": "g", "gpu": GB300,
                   "prefill": {"replicas": 1, "parallelism": {"tensor": 4, "data": 2, "expert": True}},
                   "decode": {"replicas": 2, "parallelism": {"tensor": 8}}}],
                 prefixCaching={"enabled": False})
    assert _layouts(_plan(body)) == {"g/prefill": (4, 2), "g/decode": (8, 1)}


def test_aggregated_pools_pair_with_nothing() -> None:
    plan = _plan(_body([{"name": "a", "gpu": GB300, "aggregated": {"replicas": 1, "parallelism": {"tensor": 8}}},
                        {"name": "b", "gpu": GB300, "aggregated": {"replicas": 1, "parallelism": {"tensor": 16}}}]))
    assert _layouts(plan) == {"a/aggregated": (8, 1), "b/aggregated": (16, 1)}


def test_fp8_ds_mla_is_refused_since_no_dense_mla_backend_stores_it() -> None:
    verdict = admission_verdict(_body([{"name": "a", "gpu": GB300, "aggregated": {"replicas": 1}}],
                                      kvCacheDtype="fp8_ds_mla"))
    assert verdict is not None and verdict.startswith(f"{INVALID_SPEC}: pool a: engine.kvCacheDtype fp8_ds_mla")


def test_decodes_recompute_a_failed_pull_and_prefills_keep_vllms_default() -> None:
    plan = _plan(_body([{"name": "g", "gpu": GB300, "prefill": {}, "decode": {"replicas": 2}}]))
    configs = {r.role: kv_transfer_config(r) for _, r in plan.role_plans()}
    assert configs["decode"] == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer",
                                 "kv_buffer_device": "cuda", "kv_load_failure_policy": "recompute"}
    assert configs["prefill"] is not None and "kv_load_failure_policy" not in configs["prefill"]


@pytest.mark.parametrize("args", [["--kv-offloading-size", "64"], ["--kv_offloading_backend=native"],
                                  ["--kv-offloading", "64"], ["--block-size", "2048"]])
def test_offload_and_block_size_flags_are_refused_in_extra_args(args: list[str]) -> None:
    body = _body([{"name": "a", "gpu": GB300, "aggregated": {"replicas": 1}}], extraArgs=args)
    with pytest.raises(ValidationError) as refused:
        KimiK3Deployment.model_validate(body)
    message = json.dumps(refused.value.errors(include_url=False), default=str)
    assert "extraArgs sets a flag the operator owns" in message
    assert ("config/vllm.py:1151-1185" in message) or ("planner/handoff.py" in message)


def test_a_decode_is_never_laid_out_again_for_an_explicit_prefill() -> None:
    """Forcing the decode to TP1 x DP16 would double its GPUs and cut its batch-1 speed from 111 to
    42 tokens/s: refused with the numbers instead."""
    verdict = admission_verdict(_body([{"name": "g", "gpu": GB300, "decode": {"replicas": 2},
                                        "prefill": {"replicas": 1, "parallelism": {"tensor": 1, "data": 16,
                                                                                   "expert": True}}}]))
    assert verdict is not None and verdict.startswith(f"{PD_INCOMPATIBLE}: ") and "role decode (TP8 on GB300" in verdict


def test_the_refusal_says_why_a_re_planned_prefill_did_not_fit() -> None:
    body = _body([{"name": "p", "gpu": {"product": "B200"}, "prefill": {"replicas": 1}},
                  {"name": "d", "gpu": GB300, "decode": {"replicas": 2, "parallelism": {"tensor": 16}}}])
    with pytest.raises(PlanningError) as refused:
        _plan(body)
    assert refused.value.reason == PD_INCOMPATIBLE and not refused.value.depends_on_nodes
    assert "its prefill planned at tensor size 16: pool p role prefill:" in refused.value.message


def test_with_the_gpu_left_to_the_nodes_the_refusal_is_a_condition_that_nodes_may_clear() -> None:
    body = _body([{"name": "g", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"},
                   "prefill": {"replicas": 1, "parallelism": {"tensor": 4, "data": 2, "expert": True}},
                   "decode": {"replicas": 2, "parallelism": {"tensor": 8}}}])
    with pytest.raises(PlanningError) as refused:
        _plan(body, gb300_rack())
    assert refused.value.reason == PD_INCOMPATIBLE and refused.value.depends_on_nodes
    assert admission_verdict(body) is None


def test_a_change_of_a_paired_roles_block_is_a_new_revision() -> None:
    """Old prefills of another block would be refused by every new decode: the hash must change, so
    the change rolls with the hold (new prefills pair only with new decodes)."""
    def hashed(decode_tensor: int) -> str:
        return _plan(_body([{"name": "g", "gpu": GB300, "prefill": {},
                             "decode": {"replicas": 2, "parallelism": {"tensor": decode_tensor}}}])).compat_hash
    assert hashed(8) != hashed(16)
    same = _body([{"name": "g", "gpu": GB300, "prefill": {}, "decode": {"replicas": 3}}])
    assert _plan(same).compat_hash == hashed(8)  # replicas are not part of the hand-off


@pytest.mark.parametrize("args", [["--attention-backend", "FLASHMLA"], ["-ac", '{"backend":"FLASHMLA"}'],
                                  ["--attention-config.backend=FLASHMLA"], ["--mamba-cache-dtype", "float32"],
                                  ["--kv-cache-dtype-skip-layers", "3"]])
def test_flags_that_pick_the_backend_or_move_the_block_are_refused(args: list[str]) -> None:
    body = _body([{"name": "a", "gpu": GB300, "aggregated": {"replicas": 1}}], extraArgs=args)
    with pytest.raises(ValidationError) as refused:
        KimiK3Deployment.model_validate(body)
    assert "extraArgs sets a flag the operator owns" in str(refused.value)
