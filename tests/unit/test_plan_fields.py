"""`kimik3 plan -o json` and the status show a plan's facts from one mapping: the same values, and
the same keys but for the one the two camel-casings spell differently."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from kimik3_operator.api import PoolStatus, RoleStatus
from kimik3_operator.api.status import RouterStatus
from kimik3_operator.reconcile.status import compute_status
from kimik3_operator.render.plan_fields import POOL_FIELDS, ROLE_FIELDS, ROUTER_FIELDS, plan_key
from kimik3_operator.render.report import plan_report

from .test_status import OWNER, _plan


def test_every_fact_is_a_status_field() -> None:
    """The status models ignore unknown fields: a misspelt one would vanish silently."""
    assert set(POOL_FIELDS) <= set(PoolStatus.model_fields)
    assert set(ROLE_FIELDS) <= set(RoleStatus.model_fields)
    assert set(ROUTER_FIELDS) <= set(RouterStatus.model_fields)


def test_plan_output_and_status_show_the_same_facts() -> None:
    plan = _plan()
    report = plan_report(plan)
    status = compute_status(owner=OWNER, generation=1, previous=None, plan=plan, error=None, workloads={}, now="t")
    assert len(report["pools"]) == len(status.pools) > 0
    for shown, pool in zip(report["pools"], status.pools, strict=True):
        assert {f: shown[plan_key(f)] for f in POOL_FIELDS} == {f: getattr(pool, f) for f in POOL_FIELDS}
        for shown_role, role in zip(shown["roles"], pool.roles, strict=True):
            shown_facts = {f: shown_role[plan_key(f)] for f in ROLE_FIELDS}
            assert shown_facts == {f: _wire(getattr(role, f)) for f in ROLE_FIELDS}
    assert len(report["routers"]) == len(status.routers) > 0
    for shown, router in zip(report["routers"], status.routers, strict=True):
        assert {f: shown[plan_key(f)] for f in ROUTER_FIELDS} == {f: getattr(router, f) for f in ROUTER_FIELDS}


def _wire(value: Any) -> Any:
    """A nested status object as the plan output spells it."""
    return value.model_dump(by_alias=True, exclude_none=True) if isinstance(value, BaseModel) else value


def test_status_and_plan_output_spell_every_fact_the_same() -> None:
    keys = {f: (m.model_fields[f].alias, plan_key(f))
            for m, table in ((PoolStatus, POOL_FIELDS), (RoleStatus, ROLE_FIELDS), (RouterStatus, ROUTER_FIELDS))
            for f in table}
    assert all(status == shown for status, shown in keys.values()), keys
    assert keys["all2all_backend"] == ("all2allBackend", "all2allBackend")
