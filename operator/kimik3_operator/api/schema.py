"""Turn pydantic's JSON schema into a Kubernetes structural schema.

The API server accepts only structural schemas: no $ref, a type on every node, no
additionalProperties beside properties, no anyOf-with-null for optional fields. Defaults are
kept for scalars only: the API server applies them before CEL runs, so rules can read a
defaulted field without `has()`, and pydantic applies the very same values when the operator
parses the object. Object and list defaults are dropped, so an omitted block stays omitted.
"""

from __future__ import annotations

import copy
from typing import Any

_DROP = {"title", "$defs"}
_SCALARS = {"string", "integer", "number", "boolean"}


def structural(json_schema: dict[str, Any]) -> dict[str, Any]:
    """Return a structural copy of a pydantic JSON schema (with $defs) for a CRD."""
    defs = json_schema.get("$defs", {})
    return _convert(json_schema, defs)


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    target = copy.deepcopy(defs[ref.rsplit("/", 1)[-1]])
    # Keep what the use site says about the field (description, default) over the def's own.
    extras = {k: v for k, v in node.items() if k != "$ref"}
    return {**target, **extras}


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _resolve(node, defs)
    node = _collapse_optional(node, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _convert(value, defs)
            # `false` from extra="forbid" is implied for structural schemas: drop it.
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            # JSON Schema 2020 gives the bound itself; Kubernetes' OpenAPI v3 wants the bound in
            # minimum/maximum plus a boolean flag.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        else:
            out[key] = copy.deepcopy(value)
    if "enum" in out and "type" not in out:
        out["type"] = _type_of(out["enum"][0])
    if "properties" in out:
        out.setdefault("type", "object")
    if "default" in out and out.get("type") not in _SCALARS:
        del out["default"]
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _collapse_optional(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """`X | None` is anyOf [X, null]; optional fields are simply omitted on the wire."""
    options = node.get("anyOf")
    if not options:
        return node
    kept = [o for o in options if o.get("type") != "null"]
    if len(kept) != 1:
        raise ValueError(f"unsupported union in CRD schema: {options}")
    merged = {**_resolve(kept[0], defs), **{k: v for k, v in node.items() if k != "anyOf"}}
    if merged.get("default", 0) is None:
        del merged["default"]
    return merged


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"
