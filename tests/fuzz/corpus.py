"""A fixed list of generated cases, for checks that need the whole batch at once (one vLLM
subprocess, one sample of live deployments) rather than one example at a time.

Derandomized and database-less, so every run and every process gets the same list. One more
source of difference is shut off: hypothesis (6.170) draws 5% of its numbers and strings from the
literals of the project's modules loaded so far (providers._get_local_constants), so the list
depended on which modules the test run had imported before it (a contract test alone drew other
specs than in the full suite). While the list is drawn that pool is empty.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from unittest import mock

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.internal.conjecture import providers

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.planner import Plan, PlanningError, plan_deployment

from .fleet import facts_for
from .strategies import Case, cases
from .verdict import pydantic_verdict

CORPUS = 1500
"""How many cases the vLLM contract tests draw (tests/contract/test_vllm_fuzz.py)."""


@lru_cache(maxsize=4)
def generate(count: int) -> tuple[Case, ...]:
    out: list[Case] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(cases())
    def collect(case: Case) -> None:
        out.append(case)

    # A private hook, kept on purpose: no setting turns the local-constant pool off (module docstring).
    # Its cache of allowed constants may hold the pool of earlier tests: emptied before and after.
    providers.CONSTANTS_CACHE.cache.clear()
    try:
        with mock.patch.object(providers, "_get_local_constants", lambda: providers.Constants()):
            collect()
    finally:
        providers.CONSTANTS_CACHE.cache.clear()
    return tuple(out)


def digest(count: int = CORPUS) -> str:
    """One hash of the bodies `generate(count)` draws (the same in every process, or CI and a
    developer's run test different specs: tests/fuzz/test_fuzz_pure.py)."""
    return hashlib.sha256(json.dumps([c.body for c in generate(count)], sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Planned:
    index: int
    case: Case
    cr: KimiK3Deployment
    plan: Plan


def planned(count: int) -> list[Planned]:
    """The accepted cases among `generate(count)` that plan on the fake nodes."""
    out = []
    for i, case in enumerate(generate(count)):
        _, cr = pydantic_verdict(case.body)
        if cr is None:
            continue
        try:
            out.append(Planned(i, case, cr, plan_deployment(cr.spec, facts_for(cr.spec))))
        except PlanningError:
            continue
    return out
