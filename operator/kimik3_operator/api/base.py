"""Base model for the API and the cross-field rules that live both in CEL and in pydantic.

A rule is written once, as a `Rule`: its CEL text goes into the CRD (so the API server rejects
the object at `kubectl apply`) and its Python predicate runs as a pydantic validator (so the
operator, `kimik3 plan` and the tests reject the same object with the same message). Tests feed
a negative example per rule to both and compare.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, ClassVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import CoreSchema, core_schema


@dataclass(frozen=True)
class Rule:
    """One cross-field constraint: CEL for the API server, a predicate for pydantic."""

    cel: str
    message: str
    check: Callable[[Any], bool]
    field_path: str | None = None  # CEL fieldPath: which field `kubectl` blames
    message_expression: str | None = None
    """CEL that names the offending value; its text starts with `message`."""
    explain: Callable[[Any], str] | None = None
    """The pydantic twin of message_expression."""


@dataclass(frozen=True)
class list_map:
    """Annotation for a list of named things: a list-map keyed by `key` in the CRD (stable
    identity under server-side apply), and unique keys in pydantic as the API server requires."""

    key: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        # Twice: on the wire form before the items are validated, as the API server checks list-map
        # keys whatever else is wrong with the items (else an item's own error would hide the
        # duplicate, and pydantic and the API server would refuse the same body for different
        # reasons); and on the models, for lists built in Python.
        return core_schema.no_info_before_validator_function(
            self._unique_wire, core_schema.no_info_after_validator_function(self._unique, handler(source)))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        json_schema = handler(schema)
        json_schema["x-kubernetes-list-type"] = "map"
        json_schema["x-kubernetes-list-map-keys"] = [self.key]
        return json_schema

    def _unique(self, items: list[Any]) -> list[Any]:
        self._refuse_duplicates([getattr(item, self.key) for item in items])
        return items

    def _unique_wire(self, value: Any) -> Any:
        if isinstance(value, list):
            self._refuse_duplicates([item[self.key] for item in value
                                     if isinstance(item, dict) and isinstance(item.get(self.key), str)])
        return value

    def _refuse_duplicates(self, keys: list[Any]) -> None:
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        if duplicates:
            raise ValueError(f"duplicate {self.key}: {', '.join(map(str, duplicates))}")


def _add_rules(cls: type[BaseModel], schema: CoreSchema, handler: GetJsonSchemaHandler) -> dict[str, Any]:
    json_schema = handler(schema)
    target = handler.resolve_ref_schema(json_schema)
    rules: tuple[Rule, ...] = getattr(cls, "rules", ())
    if rules:
        target["x-kubernetes-validations"] = [
            {"rule": r.cel, "message": r.message,
             **({"messageExpression": r.message_expression} if r.message_expression else {}),
             **({"fieldPath": r.field_path} if r.field_path else {})}
            for r in rules
        ]
    return json_schema


_WIRE = ConfigDict(alias_generator=to_camel, frozen=True, use_attribute_docstrings=True)
"""camelCase on the wire, snake_case in Python, immutable, attribute docstrings as descriptions."""

_CEL_READS = re.compile(r"self\.(\w+)")
"""The fields a CEL rule touches. `has(self.x)` counts: the API server converts the field's value when
a rule reaches it even to test its presence, and an integral float in an integer field then fails the
rule ("invalid data, expected int, got float64"; found by the e2e fuzz on retention.intervalTokens)."""


def _is_integer(annotation: Any) -> bool:
    """int, Annotated[int, ...] or an optional one."""
    if get_origin(annotation) is Annotated:
        return _is_integer(get_args(annotation)[0])
    return annotation is int or any(_is_integer(a) for a in get_args(annotation) if a is not type(None))


@cache
def _integer_fields(cls: type[BaseModel]) -> frozenset[str]:
    """Wire names of the integer fields whose integral floats the API server takes as integers:
    all of them except those a CEL rule reads (CEL sees the float and fails)."""
    read = {name for rule in getattr(cls, "rules", ()) for name in _CEL_READS.findall(rule.cel)}
    return frozenset(wire for name, f in cls.model_fields.items()
                     if _is_integer(f.annotation) and (wire := f.alias or name) not in read)


class SpecModel(BaseModel):
    """Base of every spec model. It validates what the API server validates, the same way, so
    `kimik3 plan -f` and `kubectl apply` agree on every object: unknown fields (snake_case
    spellings included) are rejected, no type is coerced into another (no "8" for 8, no 1 for
    true), nulls are dropped as the API server prunes them, and a number without a fraction
    (8.0) is an integer, as in JSON Schema."""

    model_config = ConfigDict(**_WIRE, extra="forbid", strict=True, validate_by_name=False, validate_by_alias=True)

    rules: ClassVar[tuple[Rule, ...]] = ()

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: CoreSchema, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return _add_rules(cls, schema, handler)

    @model_validator(mode="before")
    @classmethod
    def _as_the_api_server_reads_it(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        integers = _integer_fields(cls)
        out: dict[str, Any] = {}
        for key, value in data.items():
            if value is None:
                continue  # no field is nullable: the API server prunes the null before validating
            if isinstance(value, dict):
                value = {k: v for k, v in value.items() if v is not None}  # map values too
            elif key in integers and isinstance(value, float) and value.is_integer():
                value = int(value)
            out[key] = value
        return out

    @model_validator(mode="after")
    def _check_rules(self) -> SpecModel:
        for rule in type(self).rules:
            if not rule.check(self):
                raise ValueError(rule.explain(self) if rule.explain else rule.message)
        return self

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, unset fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class StatusModel(BaseModel):
    """Base of status and read-only models: tolerant of fields a newer operator (or the API
    server) wrote."""

    model_config = ConfigDict(**_WIRE, extra="ignore", populate_by_name=True)

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def first_error(exc: ValidationError) -> str:
    """`path: why` of the first problem pydantic found in a whole resource (the path starts at
    the resource, e.g. `spec.pools.0.aggregated`): the one line an InvalidSpec status, `kimik3
    plan` and the webhook print."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])
