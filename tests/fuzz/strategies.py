"""Hypothesis strategies for KimiK3Deployment bodies as users write them (camelCase dicts).

`cases()` draws a plausible deployment (plausible.py: pools on the fake nodes' labels, every role
shape, parallelism, replicas, engine options, speculation, workload/SLO, extraArgs, env) and,
about half the time, gives it one targeted defect (defects.py):

- `cel:*`: the negative case of each CEL rule (api/base.py Rule objects);
- schema defects derived from the CRD's own openAPIV3Schema, so every constraint the models
  declare is reached without listing fields here: numbers just outside their bounds, strings
  and lists one over their maximum, values outside an enum, strings that fail a pattern,
  unknown fields (including snake_case spellings), wrong JSON types, missing required fields,
  duplicate list-map keys, nulls inside lists;
- spellings of flags the operator owns in extraArgs (aliases, abbreviations, underscores,
  dotted JSON keys, as vLLM's FlexibleArgumentParser accepts them);
- defects with no expected verdict, where only the comparison with the API server can judge:
  nulls (pruned by the API server), integral floats for integers, numbers exactly on a bound,
  non-ASCII and \\v whitespace in pattern-checked strings.

`Case.must_reject` is True when the defect alone makes the object invalid whatever else it
holds; the tests assert pydantic refuses those.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from .defects import DEFECTS
from .plausible import Draw, maybe, plausible_bodies


@dataclass(frozen=True)
class Case:
    body: dict[str, Any]
    defect: str | None = None
    """What was done to the plausible body, e.g. "range:spec.pools[].aggregated.replicas"."""
    must_reject: bool = False


@st.composite
def cases(draw: Draw, defect_percent: int = 50) -> Case:
    body = draw(plausible_bodies())
    if not maybe(draw, defect_percent):
        return Case(body)
    mutated = copy.deepcopy(body)
    applied = draw(st.sampled_from(DEFECTS))(draw, mutated)
    if applied is None:
        return Case(body)
    return Case(mutated, *applied)
