"""Every per-role engine setting is one row (api/role_settings.py): each row's example value is
followed from the spec to every place the setting shows, and a half-added row is caught."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import ValidationError

from kimik3_operator.api import KimiK3Deployment, RoleStatus
from kimik3_operator.api.owned_flags import owner_of
from kimik3_operator.api.role_settings import ROLE_SETTINGS, RoleSetting
from kimik3_operator.api.spec import RoleEngine
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.planner.plan import EngineShape
from kimik3_operator.render.engine import engine_args
from kimik3_operator.render.plan_fields import ROLE_FIELDS, plan_key, role_fields
from kimik3_operator.render.report import plan_report, shape_line
from tests.support.cases import base_deployment
from tests.support.nodes import gb300_rack


def _body(engine: dict[str, Any] | None = None, extra_args: list[str] | None = None) -> dict[str, Any]:
    """A GB300 DEP16 role (every setting applies to it: EPLB needs expert parallelism over ranks)."""
    body = base_deployment()
    role: dict[str, Any] = {"replicas": 1, "parallelism": {"tensor": 1, "data": 16, "expert": True}}
    if engine:
        role["engine"] = engine
    body["spec"]["pools"][0]["aggregated"] = role
    if extra_args:
        body["spec"]["engine"] = {"extraArgs": extra_args}
    return body


def _plan(body: dict[str, Any]):
    spec = KimiK3Deployment.model_validate(body).spec
    return plan_deployment(spec, {p.name: pool_facts(p.node_selector, gb300_rack()) for p in spec.pools})


def problems(row: RoleSetting) -> list[str]:
    """Where a row's example does not reach: empty for a whole row."""
    out = []
    wire = RoleEngine.model_fields.get(row.name)
    if wire is None:
        return [f"RoleEngine has no field {row.name}"]
    if row.status_field not in RoleStatus.model_fields:
        out.append(f"RoleStatus has no field {row.status_field}")
    if row.status_field not in {f.name for f in dataclasses.fields(EngineShape)}:
        return [*out, f"EngineShape has no attribute {row.status_field}: the planner has no rule for it"]
    given, used = row.example
    plan = _plan(_body({wire.alias or row.name: given}))
    pool = plan.pools[0]
    role = pool.roles[0]
    if getattr(role.shape, row.status_field) != used:
        out.append(f"the planner ignores the spec's {row.name}: it uses {getattr(role.shape, row.status_field)}")
    argv = engine_args(role, plan.engine, worker=False)
    wanted = row.args(used)
    if not any(argv[i:i + len(wanted)] == wanted for i in range(len(argv))):
        out.append(f"the command line lacks {wanted}")
    if role_fields(role).get(row.status_field) != used:
        out.append(f"the status does not show {row.status_field}")
    shown = plan_report(plan)["pools"][0]["roles"][0]
    if shown.get(plan_key(row.status_field)) != used:
        out.append(f"`kimik3 plan -o json` does not show {row.status_field}")
    if (text := row.report_text(used)) not in shape_line(pool, role):
        out.append(f"the plan table does not show {text!r}")
    out += [f"{flag} is not owned" for flag in row.flags if owner_of(flag) is None]
    return out


@pytest.mark.parametrize("row", ROLE_SETTINGS, ids=lambda r: r.name)
def test_each_row_reaches_the_command_line_the_status_and_the_report(row: RoleSetting) -> None:
    assert problems(row) == []


@pytest.mark.parametrize("row", ROLE_SETTINGS, ids=lambda r: r.name)
def test_extra_args_may_not_set_a_rows_flag(row: RoleSetting) -> None:
    with pytest.raises(ValidationError, match="extraArgs sets a flag the operator owns"):
        KimiK3Deployment.model_validate(_body(extra_args=[*row.args(row.example[1]), "--enforce-eager"]))


def test_the_tables_agree_with_the_rows() -> None:
    names = [r.status_field for r in ROLE_SETTINGS]
    assert [f.name for f in dataclasses.fields(EngineShape)] == names, "one EngineShape attribute per row, in order"
    assert list(RoleEngine.model_fields) == [r.name for r in ROLE_SETTINGS]
    assert all(f"shape.{n}" == ROLE_FIELDS[n] for n in names)


def test_a_half_added_row_is_caught() -> None:
    """A row with a spelling and docs but no planner rule (no EngineShape attribute) and no field in
    the models (they are built at import: a real row always has them)."""
    half = RoleSetting("max_num_partial_prefills", int, "Prompts prefilled at once.", ("--max-num-partial-prefills",),
                       "--max-num-partial-prefills.", "partial prefills {}", (2, 2))
    assert problems(half) == ["RoleEngine has no field max_num_partial_prefills"]
    shaped = dataclasses.replace(half, name="max_num_seqs", status="max_num_partial_prefills")
    assert problems(shaped) == ["RoleStatus has no field max_num_partial_prefills",
                                "EngineShape has no attribute max_num_partial_prefills: the planner has no rule for it"]
    ignored = dataclasses.replace(ROLE_SETTINGS[0], example=(40, 41))
    assert "the planner ignores the spec's max_num_seqs: it uses 40" in problems(ignored)
    unrendered = dataclasses.replace(ROLE_SETTINGS[0], render=lambda v: ["--max-num-seqs", str(v + 1)])
    assert problems(unrendered) == ["the command line lacks ['--max-num-seqs', '41']"]
    unowned = dataclasses.replace(ROLE_SETTINGS[0], flags=("--max-num-seqs", "--max-seqs-in-flight"))
    assert problems(unowned) == ["--max-seqs-in-flight is not owned"]
