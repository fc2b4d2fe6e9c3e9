"""Golden manifests: every child of each scenario, one YAML file per object, plus the plan JSON.

Reviewers read manifest diffs, not code diffs. Regenerate after an intended change with
`KIMIK3_UPDATE_GOLDEN=1 pytest tests/golden` and read the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.planner import Plan, plan_deployment, pool_facts, with_staged
from kimik3_operator.reconcile.pairing import revision_pairs
from kimik3_operator.render import Owner, render_children
from kimik3_operator.render.report import plan_report
from tests.support.nodes import all_pools

from .scenarios import SCENARIOS, leader_pods

HERE = Path(__file__).resolve().parent
UPDATE = os.environ.get("KIMIK3_UPDATE_GOLDEN") == "1"
OWNER_UID = "00000000-0000-0000-0000-000000000000"


STAGED_COMMIT = "5eed" * 10
"""What the staging Jobs reported: goldens show the steady state, serving pods included."""


def plan_scenario(body: dict[str, Any]) -> Plan:
    spec = KimiK3Deployment.model_validate(body).spec
    nodes = all_pools()
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, nodes) for p in spec.pools})
    return with_staged(plan, {s.name: STAGED_COMMIT for s in plan.weights.sources})


def rendered_objects(name: str) -> list[dict[str, Any]]:
    """Every child of scenario `name` in the steady state: staged, its leader pods ready."""
    body = SCENARIOS[name]
    plan = plan_scenario(body)
    owner = Owner(name=body["metadata"]["name"], namespace=body["metadata"]["namespace"], uid=OWNER_UID)
    return render_children(owner, plan, routers=revision_pairs(plan, leader_pods(name, plan.compat_hash)))


def rendered(name: str) -> dict[str, str]:
    body = SCENARIOS[name]
    plan = plan_scenario(body)
    files = {f"{o['kind'].lower()}-{o['metadata']['name']}.yaml": yaml.safe_dump(o, sort_keys=False, width=120)
             for o in rendered_objects(name)}
    files["cr.yaml"] = yaml.safe_dump(body, sort_keys=False)
    files["plan.json"] = json.dumps(plan_report(plan), indent=2) + "\n"
    return files


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden(name: str) -> None:
    folder = HERE / name
    files = rendered(name)
    if UPDATE:
        folder.mkdir(exist_ok=True)
        for stale in folder.iterdir():
            stale.unlink()
        for filename, text in files.items():
            (folder / filename).write_text(text)
    committed = {p.name: p.read_text() for p in folder.iterdir()} if folder.exists() else {}
    assert sorted(committed) == sorted(files), "objects added or removed: regenerate with KIMIK3_UPDATE_GOLDEN=1"
    for filename, text in files.items():
        assert committed[filename] == text, f"{name}/{filename} differs: regenerate with KIMIK3_UPDATE_GOLDEN=1"


def test_every_scenario_is_golden() -> None:
    assert sorted(p.name for p in HERE.iterdir() if p.is_dir() and not p.name.startswith("__")) == sorted(SCENARIOS)
