"""Validate a body against the CRD's openAPIV3Schema the way kube-apiserver does, for the
keywords our schema uses.

`jsonschema` is not a dependency of this project, and it would not match the API server anyway:
the API server prunes nulls of non-nullable fields before validating, accepts integral floats as
integers, matches `pattern` with Go's RE2 (ASCII `\\s`, `$` only at the very end), enforces list-map
key uniqueness and rejects unknown fields under `fieldValidation=Strict`. This module does exactly
those things and refuses a schema keyword it does not know, so a new constraint cannot slip past
unchecked. CEL (`x-kubernetes-validations`) is not evaluated: that is the Rule objects' business;
only its one structural effect is: a rule that reads an integer field given as 8.0 fails, since
CEL gets the float the JSON decoder made.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

KNOWN = {
    "type", "properties", "additionalProperties", "required", "items", "enum", "default", "description",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern",
    "minItems", "maxItems", "maxProperties", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
    "x-kubernetes-validations",
}
INT64 = (-(1 << 63), (1 << 63) - 1)
CEL_READS = re.compile(r"(?<!has\()self\.(\w+)")
GO_SPACE = r"\t\n\f\r "  # RE2's \s: ASCII only, and no \v


@cache
def go_regex(pattern: str) -> re.Pattern[str]:
    r"""Python `re` with RE2's meaning for the constructs our patterns use: `\s` is [\t\n\f\r ]
    (inside or outside a class) and a final `$` matches only at the end of the text."""
    out, in_class, i = [], False, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and pattern[i + 1] == "s":
            out.append(GO_SPACE if in_class else f"[{GO_SPACE}]")
            i += 2
            continue
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
        elif ch == "]" and in_class:
            in_class = False
        out.append(r"\Z" if ch == "$" and not in_class and i == len(pattern) - 1 else ch)
        i += 1
    return re.compile("".join(out))


def _kind_ok(kind: str, value: Any) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == "number":
        return True
    if kind == "integer":  # JSON numbers: 8.0 is an integer; beyond int64 the decoder makes a float
        if isinstance(value, float):
            return value.is_integer() and INT64[0] <= value <= INT64[1]
        return INT64[0] <= value <= INT64[1]
    raise ValueError(f"unknown type {kind}")


def _json_equal(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (
        not isinstance(a, bool) and not isinstance(b, bool) and isinstance(a, (int, float))
        and isinstance(b, (int, float)) and a == b)


def prune_nulls(value: Any) -> Any:
    """What the API server stores before validating: object fields and map values that are null
    are dropped (no field is `nullable`); nulls inside lists stay and fail their item type."""
    if isinstance(value, dict):
        return {k: prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [prune_nulls(v) for v in value]
    return value


def errors(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Every structural violation of `value` (already pruned) against `schema`."""
    unknown = set(schema) - KNOWN
    if unknown:
        raise ValueError(f"{path or '<root>'}: schema keyword(s) this validator does not know: {sorted(unknown)}")
    out: list[str] = []
    kind = schema.get("type")
    if kind and not _kind_ok(kind, value):
        return [f"{path}: must be of type {kind}"]
    if "enum" in schema and not any(_json_equal(value, e) for e in schema["enum"]):
        out.append(f"{path}: unsupported value {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low = schema.get("minimum")
        if low is not None and (value <= low if schema.get("exclusiveMinimum") else value < low):
            out.append(f"{path}: below minimum")
        high = schema.get("maximum")
        if high is not None and (value >= high if schema.get("exclusiveMaximum") else value > high):
            out.append(f"{path}: above maximum")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
            out.append(f"{path}: length out of range")
        if "pattern" in schema and not go_regex(schema["pattern"]).search(value):
            out.append(f"{path}: does not match {schema['pattern']}")
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            out.append(f"{path}: item count out of range")
        if schema.get("x-kubernetes-list-type") == "map":
            keys = [json.dumps([item.get(k) for k in schema["x-kubernetes-list-map-keys"]], sort_keys=True)
                    for item in value if isinstance(item, dict)]
            if len(keys) != len(set(keys)):
                out.append(f"{path}: duplicate list-map key")
        for i, item in enumerate(value):
            out += errors(item, schema.get("items", {}), f"{path}[{i}]")
    if isinstance(value, dict):
        if len(value) > schema.get("maxProperties", len(value)):
            out.append(f"{path}: too many properties")
        out += [f"{path}.{k}: required" for k in schema.get("required", ()) if k not in value]
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for rule in schema.get("x-kubernetes-validations", ()):
            for name in CEL_READS.findall(rule["rule"]):
                if (props or {}).get(name, {}).get("type") == "integer" and isinstance(value.get(name), float):
                    out.append(f"{path}.{name}: CEL reads the float {value[name]!r}")
        for k, v in value.items():
            if props is not None and k in props:
                out += errors(v, props[k], f"{path}.{k}")
            elif isinstance(extra, dict):
                out += errors(v, extra, f"{path}.{k}")
            elif props is not None:
                out.append(f"{path}.{k}: unknown field")
    return out


def validate(body: Any, schema: dict[str, Any]) -> list[str]:
    """The structural verdict of the API server on `body` (empty: valid). Metadata is the API
    server's own ObjectMeta: only the name constraint the CRD adds is checked here."""
    body = prune_nulls(body)
    if isinstance(body, dict) and isinstance(body.get("metadata"), dict):
        body = {**body, "metadata": {k: v for k, v in body["metadata"].items() if k == "name"}}
    return errors(body, schema)
