"""`kimik3 plan NAMESPACE/NAME --diff`: which roles applying the plan would roll, and why.

A role rolls when its LeaderWorkerSet's template changes. The planned templates (render/workloads.py)
are compared with the live ones where the operator's decisions show: the engine container's image,
command line (flag by flag, so a user sees `--max-num-seqs 8 -> 16` rather than "changed"),
environment and resources; the init containers that wait for the staged weights (their commits); the
grace period and node selector. Fields the API server defaults are not compared. A new
compatibility hash rolls every paired role together as a new revision (docs/decisions/
compatibility-scoped-rollouts.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..planner import Plan
from .names import Owner, workload_name
from .workloads import leader_worker_set


def flags(argv: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """A command line as {flag: its values}; what precedes the first flag is keyed by ''."""
    out: dict[str, tuple[str, ...]] = {}
    key, values = "", list[str]()
    for arg in argv:
        if arg.startswith("--"):
            out[key] = tuple(values)
            key, values = arg, []
        else:
            values.append(arg)
    out[key] = tuple(values)
    return out


def _words(values: tuple[str, ...]) -> str:
    return " ".join(values) if values else "(on)"


def argv_changes(live: Sequence[str], planned: Sequence[str]) -> list[str]:
    before, after = flags(live), flags(planned)
    out = []
    for flag in [*before, *(f for f in after if f not in before)]:
        name = flag or "the command"
        if flag not in after:
            out.append(f"- {name} {_words(before[flag])}".rstrip())
        elif flag not in before:
            out.append(f"+ {name} {_words(after[flag])}".rstrip())
        elif before[flag] != after[flag]:
            out.append(f"{name} {_words(before[flag])} -> {_words(after[flag])}")
    return out


def _env_value(entry: Mapping[str, Any]) -> Any:
    """What a variable is set to, without what the API server defaults (a fieldRef's apiVersion)."""
    if "valueFrom" not in entry:
        return entry.get("value", "")
    return {kind: {k: v for k, v in (ref or {}).items() if k != "apiVersion"}
            for kind, ref in entry["valueFrom"].items()}


def env_changes(live: Sequence[Mapping[str, Any]], planned: Sequence[Mapping[str, Any]]) -> list[str]:
    """The variables added, removed or set otherwise."""
    before = {e.get("name"): _env_value(e) for e in live}
    after = {e.get("name"): _env_value(e) for e in planned}
    return ([f"+ env {n}" for n in after if n not in before] + [f"- env {n}" for n in before if n not in after]
            + [f"env {n} changed" for n in after if n in before and before[n] != after[n]])


def _template(lws: Mapping[str, Any], which: str) -> Mapping[str, Any] | None:
    return (((lws.get("spec") or {}).get("leaderWorkerTemplate") or {}).get(which) or {}).get("spec")


def container_changes(live: Mapping[str, Any], planned: Mapping[str, Any]) -> list[str]:
    out = []
    if live.get("image") != planned.get("image"):
        out.append(f"image {live.get('image')} -> {planned.get('image')}")
    out += argv_changes(list(live.get("command") or []), list(planned.get("command") or []))
    out += env_changes(live.get("env") or [], planned.get("env") or [])
    if live.get("resources") != planned.get("resources"):
        out.append(f"resources {live.get('resources')} -> {planned.get('resources')}")
    return out


def pod_changes(live: Mapping[str, Any], planned: Mapping[str, Any]) -> list[str]:
    out = []
    for kind in ("containers", "initContainers"):
        now = {c.get("name"): c for c in live.get(kind) or []}
        for want in planned.get(kind) or []:
            have = now.pop(want["name"], None)
            if have is None:
                out.append(f"+ {kind[:-1]} {want['name']}")
            elif kind == "containers":
                out += container_changes(have, want)
            elif have.get("command") != want.get("command"):  # a weights wait: its commit
                out.append(f"{want['name']} {' '.join(have.get('command') or [])[-60:]!r} -> "
                           f"{' '.join(want.get('command') or [])[-60:]!r}")
        out += [f"- {kind[:-1]} {name}" for name in now]
    for key in ("terminationGracePeriodSeconds", "nodeSelector"):
        if live.get(key) != planned.get(key):
            out.append(f"{key} {live.get(key)} -> {planned.get(key)}")
    return out


def roll_diff(plan: Plan, owner: Owner, live_hash: str | None, workloads: Sequence[Mapping[str, Any]]) -> list[str]:
    """Lines for people: the compatibility hash, then each planned role (rolls, and why; unchanged;
    new), then each live LeaderWorkerSet the plan no longer has."""
    lines = []
    if live_hash and live_hash != plan.compat_hash:
        lines.append(f"compatibility hash {live_hash} -> {plan.compat_hash}: a new revision, every paired "
                     "role rolls with it")
    else:
        lines.append(f"compatibility hash {plan.compat_hash}: unchanged" if live_hash
                     else f"compatibility hash {plan.compat_hash}: nothing serves yet")
    by_name = {w["metadata"]["name"]: w for w in workloads}
    for pool, role in plan.role_plans():
        name = workload_name(owner, pool.name, role.role)
        where = f"{pool.name}/{role.role} (LeaderWorkerSet {name})"
        lws = by_name.pop(name, None)
        if lws is None:
            lines.append(f"{where}: new")
            continue
        planned = leader_worker_set(owner, plan, pool, role)
        reasons = []
        multi = _template(planned, "leaderTemplate") is not None
        for which, prefix in (("leaderTemplate", "leader: "), ("workerTemplate", "worker: " if multi else "")):
            want, have = _template(planned, which), _template(lws, which)
            if want is None or have is None:
                if want is not None or have is not None:
                    reasons.append(f"{which} {'added' if have is None else 'removed'}")
                continue
            reasons += [prefix + c for c in pod_changes(have, want)]
        lines.append(f"{where}: " + ("rolls: " + "; ".join(reasons) if reasons else "unchanged"))
    lines += [f"LeaderWorkerSet {name}: removed (no longer planned)" for name in sorted(by_name)]
    return lines
