"""Replica counts the spec leaves out, and the predictions each role carries.

Rate matching as AIConfigurator does it: a prefill replica serves 1 / prefill-time prompts per
second (at 90% utilisation), a decode replica serves its SLO-bounded batch over the step time
and the output length (at 92%); each omitted role gets the replicas that cover the request rate
the explicit roles of its kind leave. Prefill and decode pair across pools, so the rate is shared
by all roles of one kind. A TTFT or ITL target the layout cannot meet even unloaded is an error.
Without a workload, omitted replicas default to the smallest sensible set: one aggregated or
prefill replica and two decode replicas (1P1D is a known corruption trap, vllm#52627).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Set

from ..api import KimiK3DeploymentSpec
from ..api.reasons import INVALID_SPEC, SLO_UNATTAINABLE
from ..api.role_settings import given as role_setting
from ..api.spec import Workload
from ..kimi_k3 import PUBLISHED
from .catalog import CATALOG
from .perf import (
    CALIBRATION,
    DECODE_UTILISATION,
    EFFICIENCY,
    PREFILL_UTILISATION,
    TTFT_QUEUEING,
    decode_batch1,
    decode_step_ms,
    fixed_ms,
    max_decode_batch,
    prefill_latency_seconds,
    prefill_seconds,
    replicas_for,
)
from .plan import EngineSettings, PlanningError, PoolPlan, RolePlan
from .shaping import decode_seqs

DEFAULT_REPLICAS = {"aggregated": 1, "prefill": 1, "decode": 2}
DEFAULT_WORKLOAD = Workload()


def _context(w: Workload) -> int:
    return w.input_tokens + w.output_tokens // 2


def acceptance(engine: EngineSettings, workload: Workload) -> float:
    """Tokens a sequence emits per decode step: 1 without speculation; with it the workload's
    measured acceptanceLength, else the acceptance the perf model's calibration implies (the one
    that reproduces the published DSpark point), which the table's low/high bounds bracket."""
    k = engine.speculative_tokens
    if not k:
        return 1.0
    if workload.acceptance_length is None:
        return min(CALIBRATION.implied_acceptance, 1.0 + k)
    if workload.acceptance_length > 1 + k:
        raise PlanningError(
            INVALID_SPEC,
            f"workload.acceptanceLength {workload.acceptance_length} exceeds 1 + numSpeculativeTokens ({1 + k}): "
            "a verify step emits at most its drafts plus one token")
    return workload.acceptance_length


def predict(pool: PoolPlan, role: RolePlan, engine: EngineSettings, workload: Workload,
            itl_ms: float | None, max_num_seqs: int | None = None) -> dict[str, float]:
    """Per-replica predictions for one role at the workload's shape. The decode batch is also held
    to what the engine will run: `max_num_seqs` per data-parallel rank when the spec sets it, else
    the shaping's CUDA-graph bound (shaping.decode_seqs), so the rate a replica is credited with is
    one its scheduler admits."""
    gpu = CATALOG[pool.gpu_product] if pool.gpu_product else None
    if gpu is None:
        return {}
    kv = engine.kv_dtype_family
    layout, rdma = role.layout, role.crosses_rdma
    out: dict[str, float] = {}
    if role.role in ("decode", "aggregated"):
        k = engine.speculative_tokens
        base = decode_batch1(gpu, layout, rdma, context=_context(workload), kv_dtype=kv)
        out["decodeTokensPerSecondBatch1"] = base.value
        out["decodeStepMsBatch1"] = base.inputs["stepMs"]
        out["bytesPerGpuGBBatch1"] = base.inputs["bytesPerGpuGB"]
        accept = acceptance(engine, workload)
        if k:
            low, high = PUBLISHED.acceptance_range
            for name, value in (("", accept), ("AtLowAcceptance", low), ("AtHighAcceptance", high)):
                p = decode_batch1(gpu, layout, rdma, context=_context(workload), kv_dtype=kv,
                                  spec_tokens=k, acceptance=value)
                out[f"speculativeTokensPerSecondBatch1{name}"] = p.value
            out["speculativeAcceptance"] = accept
            out["speculativeAcceptanceLow"], out["speculativeAcceptanceHigh"] = low, high
        batch = max_decode_batch(gpu, layout, rdma, _context(workload), kv, k, itl_ms, engine.max_model_len,
                                 acceptance=accept)
        batch = min(batch, layout.data * (max_num_seqs or decode_seqs(None, layout.data, k, gpu)))
        if batch:
            step = decode_step_ms(gpu, layout, rdma, batch, _context(workload), kv, spec_tokens=k)
            out["decodeBatchAtSlo"] = float(batch)
            out["decodeStepMsAtSlo"] = step
            out["decodeItlMsAtSlo"] = step / accept
            out["decodeRequestsPerSecond"] = batch * accept / (step / 1e3) / workload.output_tokens
        else:
            out["decodeRequestsPerSecond"] = 0.0
    if role.role in ("prefill", "aggregated"):
        out["prefillRequestsPerSecond"] = 1 / prefill_seconds(gpu, layout, workload.input_tokens)
        out["ttftSeconds"] = prefill_latency_seconds(gpu, layout, workload.input_tokens)
    if role.role == "aggregated" and out.get("decodeRequestsPerSecond"):
        out["requestsPerSecond"] = 1 / (1 / out["prefillRequestsPerSecond"] + 1 / out["decodeRequestsPerSecond"])
    out["fixedMs"] = fixed_ms(role.crosses_rdma, gpu, layout.tensor)
    out["efficiency"] = EFFICIENCY
    return out


def _check_slo(where: str, role: RolePlan, predicted: dict[str, float], ttft_ms: float | None,
               itl_ms: float | None) -> None:
    ttft = predicted.get("ttftSeconds")
    if ttft_ms is not None and ttft is not None and ttft * TTFT_QUEUEING * 1e3 > ttft_ms:
        raise PlanningError(
            SLO_UNATTAINABLE,
            f"{where}: predicted TTFT {ttft * 1e3:.0f} ms x {TTFT_QUEUEING} under load exceeds the "
            f"{ttft_ms:.0f} ms target; use more GPUs per prefill replica or shorter prompts")
    if itl_ms is not None and role.role in ("decode", "aggregated") and not predicted.get("decodeBatchAtSlo"):
        raise PlanningError(
            SLO_UNATTAINABLE,
            f"{where}: even one sequence needs {predicted.get('decodeStepMsBatch1', 0):.1f} ms per step, "
            f"over the {itl_ms:.0f} ms inter-token target")


def assign_replicas(spec: KimiK3DeploymentSpec, engine: EngineSettings, pools: tuple[PoolPlan, ...],
                    omitted: Set[tuple[str, str]]) -> tuple[PoolPlan, ...]:
    """Fill in omitted replicas and attach predictions to every role."""
    workload = spec.workload or DEFAULT_WORKLOAD
    ttft_ms = spec.slo.ttft_milliseconds if spec.slo else None
    itl_ms = spec.slo.itl_milliseconds if spec.slo else None
    given = {(p.name, name): role_setting(r.engine, "max_num_seqs") for p in spec.pools for name, r in p.roles()}
    predicted = {(p.name, r.role): predict(p, r, engine, workload, itl_ms, given.get((p.name, r.role)))
                 for p in pools for r in p.roles}
    for pool in pools:
        for role in pool.roles:
            _check_slo(f"pool {pool.name} role {role.role}", role, predicted[(pool.name, role.role)], ttft_ms, itl_ms)

    capacity_key = {"prefill": "prefillRequestsPerSecond", "decode": "decodeRequestsPerSecond",
                    "aggregated": "requestsPerSecond"}
    utilisation = {"prefill": PREFILL_UTILISATION, "decode": DECODE_UTILISATION,
                   "aggregated": min(PREFILL_UTILISATION, DECODE_UTILISATION)}
    has_pd = any(r.role != "aggregated" for p in pools for r in p.roles)
    has_agg = any(r.role == "aggregated" for p in pools for r in p.roles)
    rate = workload.requests_per_second / (2 if has_pd and has_agg else 1)
    chosen: dict[tuple[str, str], int] = {}
    for kind in ("prefill", "decode", "aggregated"):
        keys = [(p.name, r.role) for p in pools for r in p.roles if r.role == kind]
        missing = [k for k in keys if k in omitted]
        if not missing:
            continue
        if spec.workload is None:
            chosen.update({k: DEFAULT_REPLICAS[kind] for k in missing})
            continue
        served = sum(_replicas(pools, k) * predicted[k].get(capacity_key[kind], 0) * utilisation[kind]
                     for k in keys if k not in omitted)
        share = max(0.0, rate - served) / len(missing)
        for k in missing:
            chosen[k] = replicas_for(share, predicted[k].get(capacity_key[kind], 0), utilisation[kind]) \
                if share > 0 else 1
    _avoid_one_to_one(pools, chosen)
    return tuple(
        dataclasses.replace(pool, roles=tuple(
            dataclasses.replace(role, replicas=chosen.get((pool.name, role.role), role.replicas),
                                replicas_source=("workload" if spec.workload else "default")
                                if (pool.name, role.role) in omitted else "spec",
                                predicted=predicted[(pool.name, role.role)])
            for role in pool.roles))
        for pool in pools)


def _avoid_one_to_one(pools: tuple[PoolPlan, ...], chosen: dict[tuple[str, str], int]) -> None:
    """Rate matching never lands on 1P1D, the known NIXL corruption trap (traps.py): a decode
    role whose replicas we chose gets a second one instead."""
    def total(kind: str) -> int:
        return sum(chosen.get((p.name, r.role), r.replicas) for p in pools for r in p.roles if r.role == kind)
    if total("prefill") == 1 and total("decode") == 1:
        for key in chosen:
            if key[1] == "decode":
                chosen[key] = 2
                return


def _replicas(pools: tuple[PoolPlan, ...], key: tuple[str, str]) -> int:
    return next(r.replicas for p in pools if p.name == key[0] for r in p.roles if r.role == key[1])

