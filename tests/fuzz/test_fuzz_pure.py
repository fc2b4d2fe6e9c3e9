"""Bad input, pure: hypothesis-generated KimiK3Deployment bodies through pydantic, the CRD schema,
the planner and the renderer (no cluster; the e2e twin is e2e/tests/test_fuzz.py).

For every body: pydantic accepts or raises ValidationError, never anything else, and refuses every
defect that alone invalidates an object; the CRD's openAPIV3Schema (validated as kube-apiserver
does, openapi.py) finds a structural error exactly when pydantic does. An accepted spec plans or
fails with a PlanningError reason from the closed set; a plan renders deterministically, every
child owned and labelled, the model token only ever as a secretKeyRef, and extraArgs never
repeating a flag the operator renders.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

from hypothesis import HealthCheck, example, given, settings

from kimik3_operator.api.crd import openapi_schema
from kimik3_operator.api.reasons import PLANNING
from kimik3_operator.planner import PlanningError, plan_deployment
from kimik3_operator.render import Owner
from tests.support.cases import INVALID, ROOT

from .checks import check_children
from .fleet import facts_for
from .openapi import validate
from .strategies import Case, cases
from .verdict import RULE_MESSAGES, pydantic_verdict

EXAMPLES = 1000
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
OWNER_UID = "0f0f0f0f-0000-4000-8000-000000000000"


def test_fuzzed_specs() -> None:
    schema = openapi_schema()
    seen: Counter[str] = Counter()
    started = time.monotonic()

    def every_rule(test):  # each rule's own negative example runs whatever hypothesis draws
        for message, build in sorted(INVALID.items()):
            test = example(Case(build(), f"cel:{message}", must_reject=True))(test)
        return test

    @FUZZ
    @every_rule
    @given(cases())
    def one(case: Case) -> None:
        seen["generated"] += 1
        verdict, cr = pydantic_verdict(case.body)
        seen[f"verdict:{verdict.category}"] += 1
        seen.update(f"rule:{r}" for r in verdict.rules)
        if case.must_reject:
            assert cr is None, f"pydantic accepted a body with defect {case.defect}"
        structural = validate(case.body, schema)
        assert (verdict.category == "schema") == bool(structural), (
            f"CRD schema and pydantic disagree on {case.defect}: schema says {structural or 'valid'}, "
            f"pydantic says {verdict.category} {list(verdict.detail)}")
        if cr is None:
            return
        facts = facts_for(cr.spec)
        try:
            plan = plan_deployment(cr.spec, facts)
        except PlanningError as exc:
            assert exc.reason in PLANNING, f"unknown planner reason {exc.reason}: {exc.message}"
            seen[f"planner:{exc.reason}"] += 1
            return
        seen["planned"] += 1
        owner = Owner(name=cr.metadata.name, namespace="fuzz", uid=OWNER_UID)
        check_children(cr, plan, plan_deployment(cr.spec, facts), owner)

    one()
    print(f"\nfuzz (pure): {dict(sorted(seen.items()))} in {time.monotonic() - started:.1f}s")
    assert seen["generated"] >= EXAMPLES
    # The generator must keep reaching every outcome, or the fuzz silently stops testing them.
    assert seen["planned"] >= EXAMPLES // 10 and seen["verdict:schema"] >= EXAMPLES // 10
    assert {f"rule:{m}" for m in RULE_MESSAGES} <= set(seen), "a CEL rule was never exercised"
    assert len([k for k in seen if k.startswith("planner:")]) >= 5, "too few planner failure modes reached"



def test_the_corpus_is_the_same_in_every_process() -> None:
    """The batch corpus (corpus.py) is what CI's contract tests run. A draw that follows the order of
    a set of strings made it differ with PYTHONHASHSEED, and hypothesis's pool of constants from the
    modules loaded so far made it differ with what the run had imported: either way CI tested other
    specs than a developer's run (a CI failure on main that never reproduced alone did exactly that).
    Two processes, other hash seeds, other modules imported first: one corpus."""
    digests = set()
    for seed, first in (("1", ""), ("2", "import kimik3_operator.render, tests.fuzz.checks; ")):
        run = subprocess.run([sys.executable, "-c", f"{first}from tests.fuzz.corpus import digest; print(digest())"],
                             capture_output=True, text=True, timeout=300, cwd=ROOT,
                             env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT}"})
        assert run.returncode == 0, run.stderr[-2000:]
        digests.add(run.stdout.strip())
    assert len(digests) == 1, digests
