"""What admission refuses before a staging Job ever runs: a plain http:// model endpoint (the token or the
S3 credentials would cross the network in clear) unless ``model.allowInsecureEndpoint`` says so, and a
pvc:// path with a ``..`` component (it would leave its claim). Both the CRD's CEL rules (evaluated by
tests/fuzz's translator) and pydantic answer, with the same verdict, and for pvc:// the stager's own
parser agrees.
"""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kimik3_operator.api.crd import openapi_schema
from kimik3_operator.stager import parse_uri
from tests.fuzz.openapi import validate
from tests.fuzz.test_model_uri import cel_holds, pydantic_accepts
from tests.support.cases import base_deployment

from .stager_world import replay

pytestmark = pytest.mark.timeout(240)  # a replay is bounded; a stall fails here, not at the suite's 600 s

SCHEMA = openapi_schema()
MODEL_SCHEMA = SCHEMA["properties"]["spec"]["properties"]["model"]
HOSTS = st.text(string.ascii_lowercase + string.digits + "-.", min_size=1, max_size=30).filter(
    lambda h: h.strip(".-") != "")
PATHS = st.text(string.ascii_lowercase + string.digits + "/-_", max_size=20)


def _with_model(**model: Any) -> dict[str, Any]:
    body = base_deployment()
    body["spec"]["model"].update(model)
    return body


def _admitted(body: dict[str, Any]) -> tuple[bool, bool]:
    """(the CRD admits it, pydantic admits it)."""
    model = body["spec"]["model"]
    crd = not validate(body, SCHEMA) and all(
        cel_holds(r["rule"], model) for r in MODEL_SCHEMA.get("x-kubernetes-validations", ()))
    return crd, pydantic_accepts(body)


def test_a_plain_http_endpoint_needs_the_explicit_opt_in() -> None:
    @replay(150)
    @given(scheme=st.sampled_from(["http", "https"]), host=HOSTS, port=st.one_of(st.none(), st.integers(1, 65535)),
           path=PATHS, opt_in=st.sampled_from([None, False, True]), uri=st.sampled_from(
               ["hf://moonshotai/Kimi-K3", "s3://k3-weights/kimi-k3"]))
    def one(scheme: str, host: str, port: int | None, path: str, opt_in: bool | None, uri: str) -> None:
        endpoint = f"{scheme}://{host}{f':{port}' if port else ''}/{path}".rstrip("/")
        model: dict[str, Any] = {"uri": uri, "endpoint": endpoint}
        if opt_in is not None:
            model["allowInsecureEndpoint"] = opt_in
        crd, ours = _admitted(_with_model(**model))
        assert crd == ours == (scheme == "https" or opt_in is True), (endpoint, opt_in, crd, ours)

    one()


def test_a_pvc_path_never_climbs_out_of_its_claim() -> None:
    @replay(150)
    @given(before=st.lists(PATHS.filter(lambda p: p and "/" not in p), max_size=3),
           after=st.lists(PATHS.filter(lambda p: p and "/" not in p), max_size=3), trailing=st.booleans())
    def one(before: list[str], after: list[str], trailing: bool) -> None:
        uri = "pvc://weights/" + "/".join([*before, "..", *after]) + ("/" if trailing else "")
        crd, ours = _admitted(_with_model(uri=uri))
        assert not crd and not ours, uri
        try:
            parse_uri(uri)
        except Exception as exc:  # noqa: BLE001 - the reason is checked right below
            assert getattr(exc, "reason", "") == "InvalidUri", exc
        else:
            raise AssertionError(f"the stager parses {uri!r}")

    one()
