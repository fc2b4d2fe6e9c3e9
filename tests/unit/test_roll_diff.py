"""`kimik3 plan --diff` (render/roll_diff.py) and the staged commits `kimik3 plan NS/NAME` plans with:
the golden scenarios' rendered LeaderWorkerSets stand for the live ones."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kimik3_operator.cli import staged_commits
from kimik3_operator.planner import plan_deployment
from kimik3_operator.render import Owner
from kimik3_operator.render.roll_diff import argv_changes, env_changes, roll_diff
from kimik3_operator.render.weights import job_name
from tests.golden.scenarios import SCENARIOS
from tests.golden.test_golden import STAGED_COMMIT, plan_scenario, rendered_objects

SCENARIO = "gb300-pd-one-clique"


def _owner(body: dict[str, Any]) -> Owner:
    return Owner(name=body["metadata"]["name"], namespace=body["metadata"]["namespace"], uid="")


def _live(name: str) -> list[dict[str, Any]]:
    return [o for o in rendered_objects(name) if o["kind"] == "LeaderWorkerSet"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_what_runs_as_planned_rolls_nothing(name: str) -> None:
    body = SCENARIOS[name]
    plan = plan_scenario(body)
    lines = roll_diff(plan, _owner(body), plan.compat_hash, _live(name))
    assert lines[0] == f"compatibility hash {plan.compat_hash}: unchanged"
    assert lines[1:] and all(line.endswith(": unchanged") for line in lines[1:]), lines


def test_a_changed_setting_names_the_role_and_the_flag() -> None:
    body = copy.deepcopy(SCENARIOS[SCENARIO])
    live, before = _live(SCENARIO), plan_scenario(body)
    decode = next(p for p in body["spec"]["pools"] if "decode" in p)["decode"]
    decode.setdefault("engine", {})["maxNumSeqs"] = 96
    after = plan_scenario(body)
    lines = roll_diff(after, _owner(body), before.compat_hash, live)
    (rolls,) = [line for line in lines if "rolls:" in line]
    assert "/decode (LeaderWorkerSet " in rolls and "--max-num-seqs" in rolls and "-> 96" in rolls, rolls
    assert sum(line.endswith(": unchanged") for line in lines[1:]) == len(live) - 1


def test_new_removed_and_a_new_revision() -> None:
    body = SCENARIOS[SCENARIO]
    plan = plan_scenario(body)
    live = _live(SCENARIO)
    gone = copy.deepcopy(live[0])
    gone["metadata"]["name"] = "k3-clique-old-pool-decode"
    lines = roll_diff(plan, _owner(body), "0123456789abcdef", [*live[1:], gone])
    assert lines[0] == f"compatibility hash 0123456789abcdef -> {plan.compat_hash}: a new revision, every paired " \
                       "role rolls with it"
    assert any(line.endswith(f"(LeaderWorkerSet {live[0]['metadata']['name']}): new") for line in lines), lines
    assert lines[-1] == "LeaderWorkerSet k3-clique-old-pool-decode: removed (no longer planned)"


def test_flags_and_env_compare_as_values_not_text() -> None:
    assert argv_changes(["vllm", "serve", "--a", "1", "--b", "--c", "x"],
                        ["vllm", "serve", "--a", "2", "--c", "x", "--d"]) == ["--a 1 -> 2", "- --b (on)", "+ --d (on)"]
    # The API server adds a fieldRef's apiVersion: not a change.
    live = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
            {"name": "OLD", "value": "1"}, {"name": "X", "value": "1"}]
    planned = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
               {"name": "X", "value": "2"}, {"name": "NEW", "value": ""}]
    assert env_changes(live, planned) == ["+ env NEW", "- env OLD", "env X changed"]


def test_the_cli_plans_with_the_commits_status_says_were_staged() -> None:
    body = SCENARIOS[SCENARIO]
    owner = _owner(body)
    spec_plan = plan_scenario(body)  # staged at STAGED_COMMIT
    from tests.golden.test_golden import KimiK3Deployment, all_pools, pool_facts  # type: ignore[attr-defined]
    spec = KimiK3Deployment.model_validate(body).spec
    nodes = all_pools()
    unstaged = plan_deployment(spec, {p.name: pool_facts(p.node_selector, nodes) for p in spec.pools})
    status = {"weights": [{"name": s.name, "job": job_name(owner, s), "phase": "Staged", "commit": STAGED_COMMIT}
                          for s in unstaged.weights.sources]}
    assert staged_commits(unstaged, owner, status) == {s.name: STAGED_COMMIT for s in unstaged.weights.sources}
    from kimik3_operator.planner import with_staged
    assert with_staged(unstaged, staged_commits(unstaged, owner, status) or {}).compat_hash == spec_plan.compat_hash
    assert unstaged.compat_hash != spec_plan.compat_hash  # what the CLI printed before
    # Anything short of every source staged for this plan's Jobs: the plan as it is.
    first = status["weights"][0]
    for broken in ({**first, "phase": "Staging"}, {**first, "commit": None}, {**first, "job": "another-job"}):
        assert staged_commits(unstaged, owner, {"weights": [broken, *status["weights"][1:]]}) is None
    assert staged_commits(unstaged, owner, {}) is None
