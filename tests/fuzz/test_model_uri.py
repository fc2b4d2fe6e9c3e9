"""One model-URI grammar: for generated URIs, the CRD (its pattern read the way the API server's RE2
reads it, and its CEL rules), pydantic and the stager's own parser all accept or all refuse, for
both fields that hold a model URI. A URI admission lets through is one the staging Job can stage.

The CEL rules are evaluated by translating the few constructs they use (has, startsWith, endsWith,
contains, string +, !, &&, ||, !=) into Python; a rule using anything else fails the test instead of
being skipped.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from huggingface_hub.utils import HFValidationError, validate_repo_id
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.crd import openapi_schema
from kimik3_operator.api.quantity import quantity
from kimik3_operator.contract.uri import MAX_LENGTH, PATTERN
from kimik3_operator.stager import WeightsError, parse_uri
from tests.support.cases import base_deployment

from .openapi import validate

SCHEMA = openapi_schema()
SPEC = SCHEMA["properties"]["spec"]["properties"]
NAME_CHARS = string.ascii_letters + string.digits + "._-"
SPECIAL_PARTS = ("", ".", "..", "...", "a..b", "a--b", "-a", "a-", "a.", "_a", "a_", "x.git", ".git", "Kimi-K3",
                 "kimi-k3", "sub dir", "tab\there", "\u00e9", "x\u2028y", "v\x0b1", "ends\n", "%2e%2e", "a/..",
                 "UPPER", "a.b")


def _with_model_uri(uri: str) -> dict[str, Any]:
    body = base_deployment()
    body["spec"]["model"]["uri"] = uri
    return body


def _with_draft_uri(uri: str) -> dict[str, Any]:
    body = base_deployment()
    body["spec"]["engine"] = {"speculative": {"method": "DSpark", "draftModelUri": uri}}
    return body


Where = Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, Any]]]
FIELDS: dict[str, tuple[Callable[[str], dict[str, Any]], Where]] = {
    "spec.model.uri": (_with_model_uri, lambda b: (b["spec"]["model"], SPEC["model"])),
    "spec.engine.speculative.draftModelUri": (
        _with_draft_uri,
        lambda b: (b["spec"]["engine"]["speculative"],
                   SPEC["engine"]["properties"]["speculative"])),
}
"""Each field: how to put a URI there, and (the object, its schema node) whose CEL rules apply."""


class _CelString(str):
    def startsWith(self, prefix: str) -> bool:
        return self.startswith(prefix)

    def endsWith(self, suffix: str) -> bool:
        return self.endswith(suffix)

    def contains(self, part: str) -> bool:
        return part in self

    def __add__(self, other: str) -> _CelString:  # type: ignore[override]
        return _CelString(str(self) + other)


class _CelObject:
    def __init__(self, fields: dict[str, Any]) -> None:
        self._fields = fields

    def __getattr__(self, name: str) -> Any:
        value = self._fields.get(name)
        return _CelString(value) if isinstance(value, str) else value


class _CelQuantity:
    def __init__(self, text: str) -> None:
        self.value = quantity(text)

    def compareTo(self, other: _CelQuantity) -> int:
        return (self.value > other.value) - (self.value < other.value)


CEL_CALLS = {"has", "startsWith", "endsWith", "contains", "quantity", "compareTo"}


def cel_holds(rule: str, obj: dict[str, Any]) -> bool:
    calls = set(re.findall(r"(\w+)\(", rule))
    assert calls <= CEL_CALLS, f"CEL this test cannot evaluate: {sorted(calls - CEL_CALLS)} in {rule}"
    python = re.sub(r"!(?!=)", " not ", rule.replace("||", " or ").replace("&&", " and "))
    return bool(eval(python, {"has": lambda v: v is not None, "quantity": _CelQuantity}, {"self": _CelObject(obj)}))


def crd_accepts(body: dict[str, Any], where: Where) -> bool:
    if validate(body, SCHEMA):
        return False
    obj, node = where(body)
    return all(cel_holds(r["rule"], obj) for r in node.get("x-kubernetes-validations", ()))


def pydantic_accepts(body: dict[str, Any]) -> bool:
    try:
        KimiK3Deployment.model_validate(body)
    except ValidationError:
        return False
    return True


def stager_accepts(uri: str) -> bool:
    try:
        parse_uri(uri)
    except WeightsError as exc:
        assert exc.reason == "InvalidUri"
        return False
    return True


PART = st.one_of(
    st.sampled_from(SPECIAL_PARTS),
    st.text(NAME_CHARS, min_size=1, max_size=10),
    st.text(NAME_CHARS + "/ \t\u00e9", max_size=12),
    st.text(string.ascii_lowercase + string.digits, min_size=94, max_size=98),  # around the Hub's 96
    st.text(string.ascii_lowercase + "-", min_size=60, max_size=66),  # around a bucket's 63
    st.text(string.ascii_lowercase + "-", min_size=250, max_size=256),  # around a claim's 253
)


GRAMMAR = st.from_regex(PATTERN, fullmatch=True)
"""URIs the pattern accepts (the CEL rules may still refuse them)."""


@st.composite
def uris(draw: Any) -> str:
    """A third from the grammar, a third from the grammar with one flaw spliced in, a third assembled
    from parts around every bound."""
    kind = draw(st.integers(0, 2))
    if kind < 2:
        uri = draw(GRAMMAR)
        if kind == 1:
            at = draw(st.integers(0, len(uri)))
            uri = uri[:at] + draw(st.sampled_from(SPECIAL_PARTS + ("/", "//", "/../", "--", ".."))) + uri[at:]
        return uri
    scheme = draw(st.sampled_from(("hf", "s3", "pvc", "hf", "s3", "pvc", "oci", "HF", "http", "")))
    sep = draw(st.sampled_from(("://",) * 8 + (":/", "//", ":///")))
    uri = scheme + sep + "/".join(draw(st.lists(PART, max_size=4)))
    if draw(st.integers(0, 4)) == 0:  # around the total length bound
        uri += "/" + "a" * max(0, MAX_LENGTH - len(uri) - 1 + draw(st.integers(-1, 1)))
    return uri


KNOWN = ("hf://moonshotai/Kimi-K3", "s3://models/kimi-k3/v1", "pvc://weights/kimi-k3", "pvc://weights",
         "pvc://claim/../x", "pvc://claim/a/..", "pvc://claim/..a/b..", "hf://" + "o" * 97 + "/name",
         "hf://" + "o" * 96 + "/name", "hf://org/" + "n" * 97, "hf://a--b/c", "hf://org/name.git", "hf://org/name/",
         "hf://org/name.", "oci://registry.example/k3:1", "s3://Bad_Bucket/x", "s3://bucket/key with space",
         "pvc://" + "c" * 254, "s3://bucket/" + "k" * (MAX_LENGTH - 12), "s3://bucket/" + "k" * (MAX_LENGTH - 11))


def _known(test: Any) -> Any:
    for uri in KNOWN:
        test = example(uri)(test)
    return test


def test_admission_refuses_exactly_what_the_stager_refuses() -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=400, deadline=None, derandomize=True, database=None, print_blob=False,
              suppress_health_check=[HealthCheck.too_slow])
    @_known
    @given(uris())
    def one(uri: str) -> None:
        stager = stager_accepts(uri)
        seen["accepted" if stager else "refused"] += 1
        if stager and uri.startswith("hf://"):
            try:  # what the stager's Hub client checks before any request
                validate_repo_id(parse_uri(uri).authority)
            except HFValidationError as exc:
                raise AssertionError(f"{uri!r} passes admission but the Hub client refuses it: {exc}") from exc
        for field, (put, where) in FIELDS.items():
            body = put(uri)
            crd = crd_accepts(body, where)
            assert crd == stager, f"{field}={uri!r}: the CRD {'accepts' if crd else 'refuses'}, the stager does not"
            ours = pydantic_accepts(body)
            assert ours == stager, f"{field}={uri!r}: pydantic {'accepts' if ours else 'refuses'}, the stager does not"

    one()
    assert seen["accepted"] >= 100 and seen["refused"] >= 100, f"the generator lost one side: {dict(seen)}"


def test_the_cel_translation_is_not_vacuous() -> None:
    """The evaluator above must refuse what the rules are there to refuse."""
    model = SPEC["model"]["x-kubernetes-validations"]
    assert not all(cel_holds(r["rule"], {"uri": "pvc://claim/../x"}) for r in model)
    assert not all(cel_holds(r["rule"], {"uri": "hf://a--b/c"}) for r in model)
    assert all(cel_holds(r["rule"], {"uri": "pvc://claim/..x/y.."}) for r in model)


@pytest.mark.parametrize(("uri", "accepted"), [
    ("hf://moonshotai/Kimi-K3", True), ("hf://moonshotai/Kimi-K3-DSpark", True), ("hf://o/" + "n" * 96, True),
    ("hf://" + "o" * 97 + "/Kimi-K3", False), ("hf://moonshotai/Kimi--K3", False), ("hf://org/name/", False),
    ("hf://org/name.git", False), ("hf://org/name-", False), ("s3://models/kimi-k3/v1", True),
    ("s3://models", True), ("s3://models/../x", True), ("s3://Models/x", False), ("pvc://weights/kimi-k3", True),
    ("pvc://weights", True), ("pvc://claim/../x", False), ("pvc://claim/a/..", False), ("pvc://claim/..a", True),
    ("pvc://my.claim/x", False), ("oci://registry.example/k3:1", False), ("hf:/org/name", False),
])
def test_verdicts_on_named_uris(uri: str, accepted: bool) -> None:
    """The cases that used to pass admission and fail in the Job, and their neighbours."""
    assert stager_accepts(uri) is accepted
    assert pydantic_accepts(_with_model_uri(uri)) is accepted
