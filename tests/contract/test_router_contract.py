"""Every vllm-router argument list the renderer produces (spec.router.implementation VllmRouter, the
fallback) goes through vllm-router 0.1.17's own parser and
validation (the launcher's, then the Rust core's), and means what the plan meant: the mode, the
discovery of its engines (namespace, port, the selectors of one revision), the policies, listeners
on every address, and no static engine list.

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
from kimik3_operator.api.router_policies import lacking
from kimik3_operator.api.spec import RouterPolicy
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.render import Owner
from kimik3_operator.render.front import ROUTER_LOOPBACK_PORT
from kimik3_operator.render.router import ADD_WAIT_SECONDS, POLICY_FLAG, RouterTargets, router_args, router_targets
from tests.golden.scenarios import SCENARIOS
from tests.golden.test_golden import OWNER_UID, plan_scenario
from tests.support.cases import load_examples
from tests.support.nodes import all_pools

ROOT = Path(__file__).resolve().parents[2]
Case = tuple[list[str], RouterTargets, Owner]


def _owner(body: dict[str, Any]) -> Owner:
    return Owner(name=body["metadata"]["name"], namespace=body["metadata"]["namespace"], uid=OWNER_UID)


def golden_cases() -> dict[str, Case]:
    """The vllm-router args of every golden router Deployment, with what the renderer meant by them."""
    out = {}
    for scenario, body in sorted(SCENARIOS.items()):
        for targets in router_targets(_owner(body), plan_scenario(vllm_router(body))):
            out[f"golden/{scenario}/{targets.deployment}"] = (router_args(_owner(body), targets), targets, _owner(body))
    return out


def vllm_router(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with spec.router.implementation VllmRouter, and CacheAware for a policy it lacks."""
    body = copy.deepcopy(body)
    router = {k: "CacheAware" if k.endswith(("olicy", "Policy")) and v in lacking("VllmRouter") else v
              for k, v in body["spec"].get("router", {}).items()}
    body["spec"]["router"] = {**router, "implementation": "VllmRouter"}
    return body


def _every_router(body: dict[str, Any]) -> list[Case]:
    """Each vllm-router of `body` (planned on the test fleet), for its own revision and an older one."""
    body = vllm_router(body)
    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, all_pools()) for p in spec.pools})
    owner = _owner(body)
    return [(router_args(owner, t), t, owner) for t in router_targets(owner, plan, {"0123456789abcdef": 1})]


def policy_cases() -> dict[str, Case]:
    """Every policy of the API, as a P/D router's prefill and decode policy and as an aggregated one;
    and a deployment with both kinds of router."""
    examples = dict(load_examples())
    out = {}
    for policy in get_args(RouterPolicy):
        if policy in lacking("VllmRouter"):
            continue
        for example, router in (("pd-gb300-decode-b200-prefill.yaml", {"prefillPolicy": policy,
                                                                       "decodePolicy": policy}),
                                ("gb300-aggregated-tp8.yaml", {"policy": policy})):
            body = copy.deepcopy(examples[example])
            body["spec"]["router"] = router
            for args, targets, owner in _every_router(body):
                out[f"policy/{policy}/{targets.plan.mode}/{targets.deployment}"] = (args, targets, owner)
    for args, targets, owner in _every_router(examples["design-reference.yaml"]):
        out[f"mixed/{targets.deployment}"] = (args, targets, owner)
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
    return run_check({name: args for name, (args, _, _) in cases().items()})


def meant(targets: RouterTargets, owner: Owner) -> dict[str, Any]:
    """What the router must understand from the args rendered for `targets`."""
    policy = {role: POLICY_FLAG[name] for role, name in targets.plan.policies}
    pd = targets.plan.mode == "PrefillDecode"

    def selector(role: str) -> dict[str, str]:
        out = {"app.kubernetes.io/managed-by": "kimik3-operator", "serving.kimik3.dev/deployment": owner.name,
               "serving.kimik3.dev/role": role, "leaderworkerset.sigs.k8s.io/worker-index": "0"}
        return {**out, "serving.kimik3.dev/compat-hash": targets.compat_hash} if pd and targets.compat_hash else out

    return {
        "mode": targets.plan.mode,
        "prefill": [], "decode": [], "bootstrap_ports": [], "worker_urls": [],  # found, never listed
        "policy": "cache_aware" if pd else policy["aggregated"],  # P/D mode ignores it
        "prefill_policy": policy.get("prefill"), "decode_policy": policy.get("decode"),
        "kv_connector": "nixl",
        # on the pod's loopback, behind its front (render/front.py); metrics for Prometheus
        "host": "127.0.0.1", "port": ROUTER_LOOPBACK_PORT, "prometheus_host": "0.0.0.0", "prometheus_port": 29000,
        "service_discovery": True, "service_discovery_namespace": owner.namespace, "service_discovery_port": 8000,
        "selector": {} if pd else selector("aggregated"),
        "prefill_selector": selector("prefill") if pd else {}, "decode_selector": selector("decode") if pd else {},
        "worker_startup_timeout_secs": ADD_WAIT_SECONDS,
    }


@pytest.mark.parametrize("case", sorted(cases()))
def test_the_router_accepts_rendered_args_and_reads_them_as_meant(case: str) -> None:
    verdict = verdicts()[case]
    assert verdict["ok"], "\n".join(verdict["errors"])
    _, targets, owner = cases()[case]
    assert verdict["parsed"] == meant(targets, owner)


def test_the_contract_covers_every_scenario_policy_and_mode() -> None:
    names = sorted(cases())
    assert len([n for n in names if n.startswith("golden/")]) == len(SCENARIOS)
    assert {n.split("/")[1] for n in names if n.startswith("policy/")} == set(get_args(RouterPolicy)) - set(
        lacking("VllmRouter"))
    assert {t.plan.mode for _, t, _ in cases().values()} == {"PrefillDecode", "Aggregated"}
    assert len([n for n in names if n.startswith("mixed/")]) == 3  # two P/D revisions, one aggregated


def test_the_check_fails_what_the_router_would_refuse() -> None:
    """The check is not a rubber stamp: a misspelt or abbreviated flag, a selector the router would
    drop (no `=`), and a P/D router with neither a decode list nor discovery all fail or read
    otherwise than meant."""
    pd = next(v for n, v in golden_cases().items() if "b200-dep16-disaggregated" in n)
    args, targets, owner = pd
    spelled = {
        "misspelt": [a.replace("--health-check-interval-secs", "--health-check-intervall-secs") for a in args],
        "abbreviated": [a.replace("--health-check-interval-secs", "--health-check-interval") for a in args],
        "no-discovery": [a for a in args if a != "--service-discovery"],
        "colon-selector": [a.replace("serving.kimik3.dev/role=decode", "serving.kimik3.dev/role:decode") for a in args],
    }
    assert all(variant != args for variant in spelled.values())
    found = run_check(spelled)
    assert {name: v["ok"] for name, v in found.items() if name != "colon-selector"} == {
        "misspelt": False, "abbreviated": False, "no-discovery": False}
    assert found["misspelt"]["errors"][0].startswith("parse: unrecognized arguments: --health-check-intervall-secs")
    assert found["abbreviated"]["errors"][0].startswith("parse: --health-check-interval is not spelled")
    assert found["no-discovery"]["errors"] == ["launcher: PD disaggregation mode requires --prefill"] or \
        found["no-discovery"]["errors"][0].startswith("launcher: PD disaggregation mode requires")
    # dropped silently by the router's parser: the contract's comparison is what catches it
    assert found["colon-selector"]["parsed"]["decode_selector"] != meant(targets, owner)["decode_selector"]
