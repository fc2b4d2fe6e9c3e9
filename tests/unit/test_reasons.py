"""Condition reasons are spelled once: the catalogue holds each, valid for metav1.Condition, and
no operator module spells one as a literal."""

from __future__ import annotations

import re
from pathlib import Path

from kimik3_operator.api import reasons

CATALOGUE = {name: value for name, value in vars(reasons).items() if name.isupper() and isinstance(value, str)}
PACKAGE = Path(reasons.__file__).resolve().parents[1]


def test_reasons_are_distinct_camel_case_condition_reasons() -> None:
    assert len(set(CATALOGUE.values())) == len(CATALOGUE) > 10
    for value in CATALOGUE.values():
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]*", value) and len(value) <= 64, value
    assert reasons.PLANNING <= set(CATALOGUE.values())


FOREIGN = {Path("contract/kueue.py"), Path("reconcile/failing.py")}
"""Another project's words read back from the cluster, which a reason may repeat on purpose
(Kueue's Workload condition `Admitted`, after which our condition and its reason are named; the
kubelet's container states, CrashLoopBackOff or OOMKilled, which a failing replica's reason repeats)."""


def test_no_operator_module_spells_a_reason() -> None:
    literal = re.compile("[\"'](" + "|".join(CATALOGUE.values()) + ")[\"']")
    spelled = [f"{path.relative_to(PACKAGE)}: {m.group(0)}" for path in PACKAGE.rglob("*.py")
               if path != Path(reasons.__file__).resolve() and path.relative_to(PACKAGE) not in FOREIGN
               for m in literal.finditer(path.read_text())]
    assert spelled == []


def test_every_reason_a_pass_ends_with_is_in_pass_errors() -> None:
    """The error counter's series start from PASS_ERRORS (metrics.py): a PlanningError raised with a
    reason outside it would have no series until it first happens."""
    raised = {m.group(1) for path in PACKAGE.rglob("*.py")
              for m in re.finditer(r"PlanningError\(\s*([A-Z_]+)\b", path.read_text())}
    assert raised and {getattr(reasons, name) for name in raised} <= reasons.PASS_ERRORS
