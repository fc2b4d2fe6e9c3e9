"""Every router argument list the renderer produces goes through vllm-router 0.1.17's own parser and
validation (the launcher's, then the Rust core's), and means what the plan meant: the mode, the
engine lists, the policies, listeners on every address.

The router lives in its own cached venv, the router image's exact lock (scripts/router-venv.sh,
built on first use); the check runs there as a subprocess (router_check.py)."""

from __future__ import annotations

import copy
import json
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any, get_args

import pytest

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.v1alpha1 import RouterPolicy
from kimik3_operator.planner import Plan, plan_deployment, pool_facts
from kimik3_operator.reconcile.pairing import leader_endpoints
from kimik3_operator.render import Owner, RoleEndpoints
from kimik3_operator.render.router import POLICY_FLAG, RouterTargets, router_args, router_targets
from tests.golden.scenarios import SCENARIOS, leader_pods
from tests.golden.test_golden import OWNER_UID, plan_scenario, rendered_objects
from tests.support.cases import load_examples
from tests.support.nodes import all_pools

ROOT = Path(__file__).resolve().parents[2]
Case = tuple[list[str], RouterTargets]


def _owner(body: dict[str, Any]) -> Owner:
    return Owner(name=body["metadata"]["name"], namespace=body["metadata"]["namespace"], uid=OWNER_UID)


def _targets(body: dict[str, Any], plan: Plan, pods: list[dict[str, Any]]) -> list[RouterTargets]:
    return router_targets(_owner(body), plan, leader_endpoints(plan, pods, plan.compat_hash))


def golden_cases() -> dict[str, Case]:
    """The args of every golden router Deployment, with what the renderer meant by them."""
    out = {}
    for scenario, body in sorted(SCENARIOS.items()):
        plan = plan_scenario(body)
        deployments = {o["metadata"]["name"]: o for o in rendered_objects(scenario) if o["kind"] == "Deployment"}
        for targets in _targets(body, plan, leader_pods(scenario, plan.compat_hash)):
            (container,) = deployments[targets.name]["spec"]["template"]["spec"]["containers"]
            out[f"golden/{scenario}/{targets.name}"] = (container["args"], targets)
    return out


def _every_role_ready(body: dict[str, Any]) -> list[Case]:
    """Each router of `body` (planned on the test fleet) with one ready leader per role."""
    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, all_pools()) for p in spec.pools})
    endpoints = [RoleEndpoints(pool.name, role.role, (f"10.244.{i}.{j + 2}",), plan.compat_hash)
                 for i, (pool, role) in enumerate(plan.role_plans()) for j in range(2)]
    return [(router_args(t), t) for t in router_targets(_owner(body), plan, endpoints)]


def policy_cases() -> dict[str, Case]:
    """Every policy of the API, as a P/D router's prefill and decode policy and as an aggregated one;
    and a deployment with both kinds of router."""
    examples = dict(load_examples())
    out = {}
    for policy in get_args(RouterPolicy):
        for example, router in (("pd-gb300-decode-b200-prefill.yaml", {"prefillPolicy": policy,
                                                                       "decodePolicy": policy}),
                                ("gb300-aggregated-tp8.yaml", {"policy": policy})):
            body = copy.deepcopy(examples[example])
            body["spec"]["router"] = router
            for args, targets in _every_role_ready(body):
                out[f"policy/{policy}/{targets.plan.mode}"] = (args, targets)
    for args, targets in _every_role_ready(examples["design-reference.yaml"]):
        out[f"mixed/{targets.name}"] = (args, targets)
    return out


def cases() -> dict[str, Case]:
    return {**golden_cases(), **policy_cases()}


@lru_cache(maxsize=1)
def router_python() -> Path:
    """The python of the cached router venv (built on first use)."""
    venv = subprocess.run([str(ROOT / "scripts" / "router-venv.sh")], capture_output=True, text=True, timeout=900)
    assert venv.returncode == 0, f"could not build the router venv:\n{venv.stderr[-3000:]}"
    return Path(venv.stdout.strip().splitlines()[-1]) / "bin" / "python"


def run_check(batch: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """router_check.py's verdict per case name, all cases in one subprocess."""
    run = subprocess.run([str(router_python()), str(ROOT / "tests" / "contract" / "router_check.py")],
                         input=json.dumps([{"name": n, "args": a} for n, a in batch.items()]),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode in (0, 1), f"router_check.py failed to run:\n{run.stderr[-3000:]}"
    return {v["name"]: v for v in json.loads(run.stdout)}


@lru_cache(maxsize=1)
def verdicts() -> dict[str, dict[str, Any]]:
    return run_check({name: args for name, (args, _) in cases().items()})


def meant(targets: RouterTargets) -> dict[str, Any]:
    """What the router must understand from the args rendered for `targets`."""
    policy = {role: POLICY_FLAG[name] for role, name in targets.plan.policies}
    pd = targets.plan.mode == "PrefillDecode"
    return {
        "mode": targets.plan.mode,
        "prefill": list(targets.urls("prefill")), "decode": list(targets.urls("decode")),
        "bootstrap_ports": [None] * len(targets.urls("prefill")),  # NIXL: no Mooncake bootstrap port
        "worker_urls": list(targets.urls("aggregated")),
        "policy": "cache_aware" if pd else policy["aggregated"],  # P/D mode ignores it
        "prefill_policy": policy.get("prefill"), "decode_policy": policy.get("decode"),
        "kv_connector": "nixl",
        "host": "0.0.0.0", "port": 8000, "prometheus_host": "0.0.0.0", "prometheus_port": 29000,
    }


@pytest.mark.parametrize("case", sorted(cases()))
def test_the_router_accepts_rendered_args_and_reads_them_as_meant(case: str) -> None:
    verdict = verdicts()[case]
    assert verdict["ok"], "\n".join(verdict["errors"])
    assert verdict["parsed"] == meant(cases()[case][1])


def test_the_contract_covers_every_scenario_policy_and_mode() -> None:
    names = sorted(cases())
    assert len([n for n in names if n.startswith("golden/")]) == len(SCENARIOS)
    assert {n.split("/")[1] for n in names if n.startswith("policy/")} == set(get_args(RouterPolicy))
    assert {c.plan.mode for c in (t for _, t in cases().values())} == {"PrefillDecode", "Aggregated"}
    assert len([n for n in names if n.startswith("mixed/")]) == 2


def test_the_check_fails_what_the_router_would_refuse() -> None:
    """The check is not a rubber stamp: a misspelt or abbreviated flag, an engine URL without a
    scheme, and a P/D router with no decode engine (why a router waits at 0 replicas) all fail."""
    (args, _) = next(iter(golden_cases().values()))
    pd_args, _ = golden_cases()["golden/b200-dep16-disaggregated/k3-b200-router"]
    spelled = {
        "misspelt": [a.replace("--health-check-interval-secs", "--health-check-intervall-secs") for a in args],
        "abbreviated": [a.replace("--health-check-interval-secs", "--health-check-interval") for a in args],
        "no-scheme": [a.replace("http://", "") for a in args],
        "no-decode": [a for i, a in enumerate(pd_args) if a != "--decode" and (i == 0 or pd_args[i - 1] != "--decode")],
    }
    assert all(variant != args for variant in spelled.values())
    found = run_check(spelled)
    assert {name: v["ok"] for name, v in found.items()} == dict.fromkeys(spelled, False)
    assert found["misspelt"]["errors"][0].startswith("parse: unrecognized arguments: --health-check-intervall-secs")
    assert found["abbreviated"]["errors"][0].startswith("parse: --health-check-interval is not spelled")
    assert found["no-scheme"]["errors"][0].startswith("core: Configuration validation failed")
    assert found["no-decode"]["errors"] == ["launcher: PD disaggregation mode requires --decode"]
