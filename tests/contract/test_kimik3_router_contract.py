"""Every kimik3-router command line the renderer produces goes through kimik3-router's own parser
(`--check-args`: exit 0, or 2 with the reason), for every golden scenario, every policy in both
modes, and a deployment with both kinds of router; and the parser is no rubber stamp. The binary is
built from router/ by scripts/router-build.sh (cargo, cached)."""

from __future__ import annotations

import copy
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any, get_args

import pytest

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.router_policies import BY_NAME
from kimik3_operator.api.spec import RouterPolicy
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.render import Owner
from kimik3_operator.render.router import POLICY_FLAG, RouterTargets, router_args, router_targets
from tests.golden.scenarios import SCENARIOS
from tests.golden.test_golden import OWNER_UID, plan_scenario
from tests.support.cases import load_examples
from tests.support.nodes import all_pools

ROOT = Path(__file__).resolve().parents[2]
Case = tuple[list[str], RouterTargets]


@lru_cache(maxsize=1)
def router() -> str:
    built = subprocess.run([str(ROOT / "scripts" / "router-build.sh")], capture_output=True, text=True, timeout=1200)
    assert built.returncode == 0, f"could not build kimik3-router:\n{built.stderr[-3000:]}"
    return built.stdout.strip().splitlines()[-1]


def check(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([router(), "--check-args", *args], capture_output=True, text=True, timeout=30)


def _owner(body: dict[str, Any]) -> Owner:
    return Owner(name=body["metadata"]["name"], namespace=body["metadata"]["namespace"], uid=OWNER_UID)


def _kimik3(body: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(body)
    body["spec"]["router"] = {**body["spec"].get("router", {}), "implementation": "KimiK3Router"}
    return body


def cases() -> dict[str, Case]:
    out: dict[str, Case] = {}
    for scenario, body in sorted(SCENARIOS.items()):
        body = _kimik3(body)
        for t in router_targets(_owner(body), plan_scenario(body), {"0123456789abcdef": 1}):
            out[f"golden/{scenario}/{t.deployment}"] = (router_args(_owner(body), t), t)
    examples = dict(load_examples())
    for policy in get_args(RouterPolicy):
        decode = policy if BY_NAME[policy].decode else "RoundRobin"  # spec.router's rules refuse it on decodes
        for example, given in (("pd-gb300-decode-b200-prefill.yaml", {"prefillPolicy": policy, "decodePolicy": decode}),
                               ("gb300-aggregated-tp8.yaml", {"policy": policy})):
            body = _kimik3({**examples[example], "spec": {**examples[example]["spec"], "router": given}})
            spec = KimiK3Deployment.model_validate(body).spec
            plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, all_pools()) for p in spec.pools})
            for t in router_targets(_owner(body), plan):
                out[f"policy/{policy}/{t.plan.mode}/{t.deployment}"] = (router_args(_owner(body), t), t)
    return out


@pytest.mark.parametrize("case", sorted(cases()))
def test_the_router_accepts_every_rendered_command_line(case: str) -> None:
    args, targets = cases()[case]
    result = check(args)
    assert result.returncode == 0, result.stderr
    flags = dict(zip(args[::2], args[1::2], strict=False))
    for role, name in targets.plan.policies:
        assert POLICY_FLAG[name] in args, (role, name, args)
    assert flags["--served-model-name"] == targets.plan.served_name


def test_the_contract_covers_every_scenario_policy_and_mode() -> None:
    names = sorted(cases())
    assert {n.split("/")[1] for n in names if n.startswith("policy/")} == set(get_args(RouterPolicy))
    assert {t.plan.mode for _, t in cases().values()} == {"PrefillDecode", "Aggregated"}
    assert {n.split("/")[1] for n in names if n.startswith("golden/")} == set(SCENARIOS)


def test_the_check_refuses_what_the_router_would_refuse() -> None:
    pd = next(args for name, (args, t) in cases().items() if t.plan.mode == "PrefillDecode")
    broken = {
        "misspelt": [a.replace("--decode-selector", "--decode-selektor") for a in pd],
        "unknown policy": [a.replace("cache_aware", "cache-aware") for a in pd],
        "no decode": [a for i, a in enumerate(pd) if a != "--decode-selector"
                      and (i == 0 or pd[i - 1] != "--decode-selector")],
        "bad number": [a.replace("1800", "1800s") for a in pd],
        "twice": [*pd, "--mode", "pd"],
    }
    for name, args in broken.items():
        assert args != pd, name
        result = check(args)
        assert result.returncode == 2 and result.stderr.strip(), (name, result)
