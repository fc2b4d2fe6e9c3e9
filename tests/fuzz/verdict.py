"""Verdicts on a body, in one vocabulary for pydantic, the CRD schema and the API server.

A verdict is `accepted`, `schema` (some structural error: type, bound, pattern, enum, unknown or
missing field, list-map duplicate) or `cel` (only cross-field rules failed), plus the rule
messages seen. Pydantic skips a model's rules when its fields already failed, and the API server
skips some CEL after a structural error, so only the category and "every rule pydantic names, the
API server names too" are comparable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.planner.admission import admission_verdict
from tests.support.cases import all_rules

RULE_MESSAGES: tuple[str, ...] = tuple(sorted({m for _, m in all_rules()}))
WEBHOOK_DENIED = 'admission webhook "kimik3deployments.serving.kimik3.dev" denied the request:'
NOT_CHECKED = "some validation rules were not checked because the object was invalid"
CEL_DATA_ERROR = "invalid data, expected"
"""The API server's CEL met a value of the wrong type (e.g. 8.0 where the schema says integer):
a type error, not a rule verdict."""


@dataclass(frozen=True)
class Verdict:
    category: str  # accepted | schema | cel | webhook
    rules: frozenset[str] = frozenset()
    detail: tuple[str, ...] = field(default=(), compare=False)


def _rule_of(message: str) -> str | None:
    return next((m for m in RULE_MESSAGES if m in message), None)


def pydantic_verdict(body: dict[str, Any]) -> tuple[Verdict, KimiK3Deployment | None]:
    """What the operator (and `kimik3 plan`) make of a body. Any exception other than
    ValidationError propagates: that is a bug the fuzz reports."""
    try:
        return Verdict("accepted"), KimiK3Deployment.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors()
    rules = {r for e in errors if e["type"] == "value_error" and (r := _rule_of(e["msg"]))}
    structural = [e for e in errors if not (e["type"] == "value_error" and _rule_of(e["msg"]))]
    detail = tuple(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
    return Verdict("schema" if structural else "cel", frozenset(rules), detail), None


def cluster_verdict(body: dict[str, Any]) -> tuple[Verdict, KimiK3Deployment | None]:
    """What the API server with our webhook makes of a body: pydantic's verdict, and for an
    accepted body the webhook's (the planner refuses it whatever nodes exist)."""
    verdict, cr = pydantic_verdict(body)
    if cr is not None and (refusal := admission_verdict(body)):
        return Verdict("webhook", detail=(refusal,)), cr
    return verdict, cr


def api_verdict(status: int, response: dict[str, Any] | None) -> Verdict:
    """The API server's answer to a create: 201 accepted; 400 (strict decoding: unknown field) is
    structural; 422 causes are CEL when they carry a rule message, structural otherwise."""
    if status in (200, 201):
        return Verdict("accepted")
    response = response or {}
    message = str(response.get("message", ""))
    if WEBHOOK_DENIED in message:
        return Verdict("webhook", detail=(message.split(WEBHOOK_DENIED, 1)[1].strip(),))
    if status != 422:
        return Verdict("schema", detail=(f"{status}: {message}",))
    causes = [str(c.get("message", "")) for c in (response.get("details") or {}).get("causes") or []] or [message]
    causes = [c for c in causes if NOT_CHECKED not in c]
    rules = {r for c in causes if CEL_DATA_ERROR not in c and (r := _rule_of(c))}
    structural = [c for c in causes if CEL_DATA_ERROR in c or not _rule_of(c)]
    return Verdict("schema" if structural else "cel", frozenset(rules), tuple(causes))


def agree(ours: Verdict, theirs: Verdict) -> bool:
    """Same category and, when only rules failed, every rule pydantic names is one the API server
    names (pydantic skips a parent's rules once a child's failed; the API server runs them all)."""
    if ours.category == theirs.category == "webhook":
        return ours.detail == theirs.detail  # the planner's reason, word for word
    return ours.category == theirs.category and (ours.category != "cel" or ours.rules <= theirs.rules)
