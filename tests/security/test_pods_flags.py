"""Attack: a name that the renderer passes as a flag's value starts with '-'.

`--served-model-name --x` and the stager's `--revision --dest=...` would be read as options of their
own. Admission refuses such a name, in CEL (the CRD) and in pydantic (the operator, the webhook,
`kimik3 plan`) alike; tests/support/cases.py holds one negative example per rule, which
tests/unit/test_api.py feeds to pydantic and the e2e admission test to the API server.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.crd import openapi_schema
from tests.support.cases import base_deployment

FIELDS = {"servedName": "the model's name", "revision": "a branch, tag or commit"}


@pytest.mark.parametrize("field", sorted(FIELDS))
@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(rest=st.text(max_size=40))
def test_a_name_starting_with_a_dash_is_refused(field: str, rest: str) -> None:
    body = copy.deepcopy(base_deployment())
    body["spec"]["model"][field] = ("-" + rest)[:128]
    with pytest.raises(ValidationError, match=f"{field} is {FIELDS[field]}, not a flag"):
        KimiK3Deployment.model_validate(body)
    body["spec"]["model"][field] = ("x" + rest)[:128]
    KimiK3Deployment.model_validate(body)


def test_the_crd_carries_the_same_rules() -> None:
    model = openapi_schema()["properties"]["spec"]["properties"]["model"]
    rules = {r["fieldPath"]: r["rule"] for r in model["x-kubernetes-validations"] if "fieldPath" in r}
    for field in FIELDS:
        assert rules[f".{field}"] == f"!has(self.{field}) || !self.{field}.startsWith('-')"
