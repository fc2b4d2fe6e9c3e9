"""The planner's prefill/decode rule (planner/handoff.py) against vLLM 0.33.0 itself
(handoff_check.py, in vLLM's venv): every pair the planner emits in the golden scenarios and the
fuzz corpus passes vLLM's handshake, each role's MLA backend, kernel block and blocks per logical
block are vLLM's, and over a matrix of GPUs, KV and KDA dtypes, speculative tokens and tensor sizes
the planner refuses exactly the pairs vLLM refuses."""

from __future__ import annotations

import itertools
import json
import subprocess
from functools import lru_cache
from typing import Any

from kimik3_operator.kimi_k3 import kv_cache_family
from kimik3_operator.planner.blocks import block_size
from kimik3_operator.planner.catalog import CATALOG, GpuSpec
from kimik3_operator.planner.handoff import (
    MLA_BACKENDS,
    HandoffBlocks,
    handshake_problem,
    kernel_block,
    mla_backend,
)
from kimik3_operator.planner.plan import Layout, Plan, PlanningError
from tests.fuzz.corpus import CORPUS, planned
from tests.golden.scenarios import SCENARIOS
from tests.golden.test_golden import plan_scenario

from .test_vllm_contract import ROOT, vllm_python

TENSORS = (1, 2, 3, 4, 6, 8, 16)
"""Tensor sizes of the matrix: divisors of K3's 96 heads, with pairs that do not divide one another."""
KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla")


def _blocks(name: str, role: str, gpu: GpuSpec, kv: str, block: int, tensor: int) -> HandoffBlocks | None:
    """The planner's view of one role; None where it finds no MLA backend."""
    try:
        backend = mla_backend(gpu, kv)
    except PlanningError:
        return None
    return HandoffBlocks(where=name, role=role, layout=Layout(tensor=tensor), gpu=gpu.product, backend=backend,
                         block=block, kernel=kernel_block(block, MLA_BACKENDS[backend]))


def _wire(b: HandoffBlocks | None, name: str, role: str, gpu: GpuSpec, kv: str, block: int,
          tensor: int) -> dict[str, Any]:
    return {"name": name, "role": role, "vendor": gpu.vendor, "tensor": tensor, "block": block, "kv_cache_dtype": kv,
            "capability": list(gpu.compute_capability) if gpu.compute_capability else None,
            "planner": None if b is None else {"backend": b.backend, "kernel": b.kernel, "per_logical": b.per_logical}}


def plan_case(name: str, plan: Plan) -> dict[str, Any] | None:
    roles = []
    for pool, role in plan.role_plans():
        if role.role not in ("prefill", "decode") or not pool.gpu_product or role.block_size is None:
            continue
        gpu, kv, where = CATALOG[pool.gpu_product], plan.engine.kv_cache_dtype, f"{pool.name}/{role.role}"
        b = _blocks(where, role.role, gpu, kv, role.block_size, role.layout.tensor)
        roles.append(_wire(b, where, role.role, gpu, kv, role.block_size, role.layout.tensor))
    if {r["role"] for r in roles} != {"prefill", "decode"}:
        return None
    return {"name": name, "prefix_caching": plan.engine.prefix_caching, "roles": roles, "emitted": True}


@lru_cache(maxsize=1)
def emitted_cases() -> tuple[dict[str, Any], ...]:
    cases = [plan_case(f"golden/{n}", plan_scenario(body)) for n, body in sorted(SCENARIOS.items())]
    cases += [plan_case(f"fuzz/{item.index}", item.plan) for item in planned(CORPUS)]
    return tuple(c for c in cases if c is not None)


def matrix_cases() -> list[dict[str, Any]]:
    """Every GPU x KV dtype x KDA dtype x speculative tokens x prefix caching, with a prefill and a
    decode at each tensor size of TENSORS."""
    cases = []
    for (product, gpu), kv, ssm, spec, caching in itertools.product(
            CATALOG.items(), KV_DTYPES, ("float32", "bfloat16"), (0, 7), (True, False)):
        roles = []
        for role, t in itertools.product(("prefill", "decode"), TENSORS):
            block = block_size(t, kv_cache_family(kv), ssm, spec)
            roles.append(_wire(_blocks(f"{role}-tp{t}", role, gpu, kv, block, t), f"{role}-tp{t}", role, gpu, kv,
                               block, t))
        cases.append({"name": f"matrix/{product}/{kv}/{ssm}/{spec}/{caching}", "prefix_caching": caching,
                      "roles": roles, "emitted": False})
    return cases


@lru_cache(maxsize=1)
def verdicts() -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    cases = [*emitted_cases(), *matrix_cases()]
    run = subprocess.run([str(vllm_python()), str(ROOT / "tests" / "contract" / "handoff_check.py")],
                         input=json.dumps(cases), capture_output=True, text=True, timeout=900)
    assert run.returncode in (0, 1), f"handoff_check.py failed to run:\n{run.stderr[-3000:]}"
    return {v["name"]: v for v in json.loads(run.stdout)}, cases


def test_the_cited_vllm_source_is_the_one_read() -> None:
    source = verdicts()[0]["sources"]
    assert source["ok"], "\n".join(source["errors"])


def test_each_role_cuts_its_block_as_vllm_does() -> None:
    by_name, cases = verdicts()
    wrong = [(c["name"], r["name"], r["planner"], by_name[c["name"]]["roles"][r["name"]])
             for c in cases for r in c["roles"]
             if (r["planner"] or {"backend": None, "kernel": None, "per_logical": None})
             != by_name[c["name"]]["roles"][r["name"]]]
    assert not wrong, wrong[:5]


def test_the_planner_refuses_exactly_the_pairs_vllm_refuses() -> None:
    by_name, cases = verdicts()
    checked = mismatched = 0
    for case in cases:
        roles = {r["name"]: r for r in case["roles"] if r["planner"] is not None}
        refused = {(p, d) for p, d, _ in by_name[case["name"]]["refused"]}
        for p in (r for r in roles.values() if r["role"] == "prefill"):
            for d in (r for r in roles.values() if r["role"] == "decode"):
                mine = handshake_problem(_as_blocks(p), _as_blocks(d), case["prefix_caching"])
                checked += 1
                mismatched += (mine is not None) != ((p["name"], d["name"]) in refused)
    print(f"\n{checked} prefill/decode pairs judged by the planner and by vLLM 0.33.0's handshake code")
    assert checked > 1000 and mismatched == 0


def test_every_pair_the_planner_emits_passes_the_handshake() -> None:
    by_name, _ = verdicts()
    emitted = emitted_cases()
    refused = {c["name"]: by_name[c["name"]]["refused"] for c in emitted if by_name[c["name"]]["refused"]}
    platforms = {(r["vendor"], tuple(r["capability"] or ()), r["kv_cache_dtype"]) for c in emitted for r in c["roles"]}
    print(f"\n{len(emitted)} planned deployments with prefill and decode; (vendor, capability, KV dtype): "
          f"{sorted(platforms)}")
    assert len(emitted) >= 3 and len(platforms) >= 2
    assert not refused, dict(list(refused.items())[:5])


def _as_blocks(r: dict[str, Any]) -> HandoffBlocks:
    planner = r["planner"]
    return HandoffBlocks(where=r["name"], role=r["role"], layout=Layout(tensor=r["tensor"]), gpu="",
                         backend=planner["backend"], block=r["block"], kernel=planner["kernel"])
