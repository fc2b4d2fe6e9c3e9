"""`kimik3 plan` output: the plan as a JSON contract other tools read, and as a table for people.

Environment values that only exist in the pod (downward API, Secrets, the LWS environment)
appear as `$(NAME)`, the way the kubelet would expand them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api.role_settings import ROLE_SETTINGS
from ..planner import Plan, PoolPlan, RolePlan, RouterPlan
from ..planner.layout import describe
from ..planner.perf import CALIBRATION
from .engine import engine_args, engine_env
from .plan_fields import plan_keys, pool_fields, role_fields, router_fields


def _env_dict(env: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e["value"] if "value" in e else f"$({e['name']})" for e in env}


def role_report(plan: Plan, pool: PoolPlan, role: RolePlan) -> dict[str, Any]:
    multi = role.nodes_per_replica > 1  # otherwise the replica's only pod is its leader
    return {
        **plan_keys(role_fields(role)),
        "command": engine_args(role, plan.engine, worker=False,
                               scale_out=plan.router_tokenizes(pool.name, role.role)),
        "env": _env_dict(engine_env(role, plan.engine, worker=False, vendor=pool.vendor)),
        "worker": {
            "command": engine_args(role, plan.engine, worker=True),
            "env": _env_dict(engine_env(role, plan.engine, worker=True, vendor=pool.vendor)),
        } if multi else None,
        "predicted": {k: round(v, 3) for k, v in role.predicted.items()},
    }


def router_report(router: RouterPlan) -> dict[str, Any]:
    """Its engine lists are the ready leaders of the moment: only the live Deployment shows them."""
    return {
        **plan_keys(router_fields(router)),
        "replicas": router.replicas,
        "routes": [{"pool": pool, "role": role} for pool, role in router.routes],
    }


def plan_report(plan: Plan) -> dict[str, Any]:
    return {
        "pools": [{
            **plan_keys(pool_fields(pool)),
            "arch": pool.arch,
            "roles": [role_report(plan, pool, role) for role in pool.roles],
        } for pool in plan.pools],
        "routers": [router_report(router) for router in plan.routers],
        "compatibilityHash": plan.compat_hash,
        "gpus": plan.gpus,
        "calibration": CALIBRATION.as_dict(),
    }


def capacity_line(capacity: Mapping[str, Any]) -> str:
    """One line: fits or not, and per pool the nodes/GPUs needed against present/free."""
    pools = "; ".join(f"{p['pool']} needs {p['nodesNeeded']} nodes/{p['gpusNeeded']} GPUs, "
                      f"has {p['nodes']} nodes/{p['gpusFree']} GPUs free" for p in capacity["pools"])
    verdict = "fits" if capacity["fits"] else f"does NOT fit now ({capacity['reason']})"
    return f"capacity: {verdict}; {pools}"


def plan_table(plan: Plan, capacity: Mapping[str, Any] | None = None) -> str:
    header = ("POOL", "GPU", "FABRIC", "ROLE", "REPLICAS", "GPUS/REPL", "NODES/REPL", "LAYOUT", "ALL2ALL", "MOE",
              "TOK/S@1", "TTFT")
    rows = [header]
    for pool in plan.pools:
        for role in pool.roles:
            p = role.predicted
            rows.append((
                pool.name, f"{pool.gpu_product}x{pool.gpus_per_node}", pool.interconnect, role.role,
                f"{role.replicas}" + ("" if role.replicas_source == "spec" else f" ({role.replicas_source})"),
                str(role.gpus_per_replica), str(role.nodes_per_replica), describe(role.layout),
                role.all2all_backend or "-", role.moe_backend or "-",
                f"{p['decodeTokensPerSecondBatch1']:.0f}" if "decodeTokensPerSecondBatch1" in p else "-",
                f"{p['ttftSeconds'] * 1e3:.0f} ms" if "ttftSeconds" in p else "-",
            ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows]
    lines += [f"router: {r.mode}, {r.replicas} replicas, "
              + ", ".join(f"{role} {policy}" for role, policy in r.policies)
              + " -> " + ", ".join(f"{pool}/{role}" for pool, role in r.routes) for r in plan.routers]
    if not plan.routers:
        lines.append("router: none (spec.router.replicas 0)")
    lines += [shape_line(pool, role) for pool in plan.pools for role in pool.roles if role.shape]
    lines += [cold_start_line(pool, role) for pool in plan.pools for role in pool.roles if role.cold_start]
    lines.append(f"total GPUs: {plan.gpus}; prefill/decode compatibility hash: {plan.compat_hash}")
    if capacity is not None:
        lines.append(capacity_line(capacity))
    return "\n".join(lines)


def cold_start_line(pool: PoolPlan, role: RolePlan) -> str:
    """A role's predicted time to Ready and what it is made of (docs/cold-start.md)."""
    c = role.cold_start
    assert c is not None
    return (f"cold start {pool.name}/{role.role}: Ready in {_duration(c.ready_seconds)} after scheduling "
            f"(first start {_duration(c.first_ready_seconds)}) = image {_duration(c.image_pull_seconds)}"
            f" + weights {c.pod_read_bytes / 1e12:.2f} TB per pod{_via(role)} at {c.read_bytes_per_s / 1e9:g} GB/s"
            f" ({c.read_source}) {_duration(c.load_seconds)} + compile {_duration(c.compile_seconds)}"
            f" (empty cache {_duration(c.first_compile_seconds)}) + CUDA graphs {_duration(c.graph_capture_seconds)}")


def _via(role: RolePlan) -> str:
    how = role.loading
    if how is None:
        return ""
    return f" via {how.loader.load_format}" + (", own experts only" if how.expert_filter else "")


def _duration(seconds: int) -> str:
    return f"{seconds} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def shape_line(pool: PoolPlan, role: RolePlan) -> str:
    """A role's engine shape and, with speculation, its point prediction beside the bounds."""
    s, p = role.shape, role.predicted
    assert s is not None
    parts = [text for setting in ROLE_SETTINGS
             if (text := setting.report_text(getattr(s, setting.status_field))) is not None]
    if "speculativeTokensPerSecondBatch1" in p:
        parts.append(f"spec {p['speculativeTokensPerSecondBatch1']:.0f} tok/s@1 at acceptance "
                     f"{p['speculativeAcceptance']:.2f} ({p['speculativeTokensPerSecondBatch1AtLowAcceptance']:.0f}"
                     f"-{p['speculativeTokensPerSecondBatch1AtHighAcceptance']:.0f})")
    return f"engine {pool.name}/{role.role} (per DP rank): " + ", ".join(parts)
