"""Targeted defects for a plausible body: each returns (label, must_reject) or None when the
body offers nothing to break that way.

Schema defects are derived from the CRD's own openAPIV3Schema, so every constraint the models
declare is reached without listing fields here: numbers just outside (or exactly on) their
bounds, strings and lists one over their maximum, values outside an enum, strings that fail a
pattern or hold non-ASCII and \\v whitespace, unknown fields (snake_case spellings too), wrong
JSON types, missing required fields, list-map duplicates, nulls, integral floats. Then each CEL
rule's negative case, and spellings of flags the operator owns in extraArgs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from hypothesis import strategies as st

from kimik3_operator.api import spec as api
from kimik3_operator.api.crd import openapi_schema
from kimik3_operator.api.owned_flags import OWNED_FLAGS

from .openapi import go_regex
from .plausible import Draw, maybe

Path = tuple[str | int, ...]
Defect = Callable[[Draw, dict[str, Any]], "tuple[str, bool] | None"]
TP_NON_DIVISORS = tuple(t for t in range(1, 97) if 96 % t)

OWNED_ALIASES = ("--device-memory-utilization=0.95", "--disable-expert-parallel",
                 "--disable-auto-tool-choice", "--no-enable-auto-tool-choice", "--mamba-ssm-cache-dtype=bfloat16",
                 "--no-fail-on-environ-validation", "--no-enable-expert-parallel",
                 "--speculative-config.num_speculative_tokens=9", "--kv-transfer-config.kv_role=kv_both",
                 "--speculative_config.method=mtp", "--tensor_parallel_size=4", "--gpu_memory_utilization=0.5",
                 "--max_model_len=1024", "--tensor-parallel=4", "--max-model=5", "-n4", "-e", "-qfp8",
                 "--enable-hybrid-kv-cache-manager", "--no-disable-hybrid-kv-cache-manager")
"""Spellings vLLM 0.33.0's parser maps onto flags the operator renders (seen in its parser: aliases
of one dest, --no-/--disable- negations, `_` for `-`, unique prefixes, `--json-flag.key=value`)."""

@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return openapi_schema()


def _walk(value: Any, node: dict[str, Any], path: Path = ()) -> list[tuple[Path, Any, dict[str, Any]]]:
    """(path, value, schema node) of every value present in the body."""
    out = [(path, value, node)]
    if isinstance(value, dict):
        props, extra = node.get("properties"), node.get("additionalProperties")
        for k, v in value.items():
            sub = (props or {}).get(k) or (extra if isinstance(extra, dict) else None)
            if sub is not None:
                out += _walk(v, sub, (*path, k))
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, v in enumerate(value):
            out += _walk(v, node["items"], (*path, i))
    return out


def _label(path: Path) -> str:
    return ".".join("[]" if isinstance(p, int) else p for p in path).replace(".[]", "[]")


def _set(body: dict[str, Any], path: Path, value: Any) -> None:
    target: Any = body
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value


def _present(body: dict[str, Any],
             kinds: Callable[[Any, dict[str, Any]], bool]) -> list[tuple[Path, Any, dict[str, Any]]]:
    return [(p, v, n) for p, v, n in _walk(body["spec"], schema()["properties"]["spec"], ("spec",)) if kinds(v, n)]


def _number(v: Any, n: dict[str, Any]) -> bool:
    return n.get("type") in ("integer", "number") and ("minimum" in n or "maximum" in n)


def _out_of_range(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    found = _present(body, _number)
    if not found:
        return None
    path, _, node = draw(st.sampled_from(found))
    options = []
    if "minimum" in node:
        low = node["minimum"]
        options.append(low if node.get("exclusiveMinimum") else low - (1 if node["type"] == "integer" else 0.5))
    if "maximum" in node:
        high = node["maximum"]
        options.append(high if node.get("exclusiveMaximum") else high + (1 if node["type"] == "integer" else 0.5))
    _set(body, path, draw(st.sampled_from(options)))
    return f"range:{_label(path)}", True


def _on_bound(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    found = _present(body, _number)
    if not found:
        return None
    path, _, node = draw(st.sampled_from(found))
    bounds = [node[k] for k in ("minimum", "maximum") if k in node and not node.get(f"exclusive{k.title()}")]
    if not bounds:
        return None
    _set(body, path, draw(st.sampled_from(bounds)))
    return f"edge:{_label(path)}", False


def _too_long(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    found = _present(body, lambda v, n: (isinstance(v, str) and "maxLength" in n) or
                     (isinstance(v, list) and ("maxItems" in n or n.get("minItems"))) or
                     (isinstance(v, dict) and "maxProperties" in n))
    if not found:
        return None
    path, value, node = draw(st.sampled_from(found))
    if isinstance(value, str):
        new: Any = (value + "a" * (node["maxLength"] + 1))[: node["maxLength"] + 1]
    elif isinstance(value, dict):
        new = {**value, **{f"example.com/k{i}": "v" for i in range(node["maxProperties"] + 1)}}
    elif "maxItems" in node and (not node.get("minItems") or maybe(draw, 70)):
        new = [copy.deepcopy(value[i % len(value)]) if value else "x" for i in range(node["maxItems"] + 1)]
        for i, item in enumerate(new):  # distinct list-map keys: only the count is wrong
            for key in node.get("x-kubernetes-list-map-keys", ()) if isinstance(item, dict) else ():
                item[key] = f"k{i}"
    else:
        new = []
    _set(body, path, new)
    return f"length:{_label(path)}", True


def _bad_enum(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    found = _present(body, lambda v, n: "enum" in n)
    if not found:
        return None
    path, value, node = draw(st.sampled_from(found))
    bad = draw(st.sampled_from(("Bogus", str(value).lower(), str(value).upper(), f" {value}", "A100")))
    if bad in node["enum"]:
        return None
    _set(body, path, bad)
    return f"enum:{_label(path)}", True


BAD_STRINGS = ("", "UPPER", "-lead", "trail-", "has space", "under_score", "x\nmore", "ends\n", "http://m",
               "hf://", "hf://a b", "hf://a\tb", "2TB", "1.", "9x", "a.b", "1A", "A-B")
TRICKY_CHARS = ("\u00a0", "\x0b", "\u2028", "\u3000", "\u00e9", "\x85", "\ufeff")


def _bad_pattern(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    found = _present(body, lambda v, n: isinstance(v, str) and "pattern" in n)
    if not found:
        return None
    path, value, node = draw(st.sampled_from(found))
    regex = go_regex(node["pattern"])
    bad = [s for s in BAD_STRINGS if not regex.search(s) and len(s) >= node.get("minLength", 0)]
    _set(body, path, draw(st.sampled_from(bad)))
    return f"pattern:{_label(path)}", True


def _tricky_chars(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    found = _present(body, lambda v, n: isinstance(v, str) and "pattern" in n and len(v) > 1)
    if not found:
        return None
    path, value, _ = draw(st.sampled_from(found))
    at = draw(st.integers(1, len(value) - 1))
    _set(body, path, value[:at] + draw(st.sampled_from(TRICKY_CHARS)) + value[at:])
    return f"unicode:{_label(path)}", False


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def _unknown_field(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    found = _present(body, lambda v, n: isinstance(v, dict) and "properties" in n)
    path, value, node = draw(st.sampled_from(found))
    snakes = [_snake(k) for k in node["properties"] if _snake(k) != k]
    key = draw(st.sampled_from(("foo", "Replicas", "tensorParallel", "x-extra", *snakes)))
    if key in node["properties"]:
        return None
    _set(body, (*path, key), draw(st.sampled_from((1, "x", {}, True))))
    return f"unknown:{_label(path)}.{key if key in snakes else '*'}", True


def _wrong_value(kind: str) -> st.SearchStrategy[Any]:
    return st.sampled_from({
        "integer": ("8", True, [8], {"v": 8}, 8.5),
        "number": ("1.0", True, [1], {}),
        "boolean": ("true", 1, "yes", 0, []),
        "string": (5, True, ["x"], {}, 1.5),
        "object": ([], "x", 1, True),
        "array": ({}, "x", 1),
    }[kind])


def _wrong_type(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    found = _present(body, lambda v, n: "type" in n and v is not body["spec"])
    path, _, node = draw(st.sampled_from(found))
    _set(body, path, draw(_wrong_value(node["type"])))
    return f"type:{_label(path)}", True


def _null(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    found = [f for f in _present(body, lambda v, n: True) if f[0] != ("spec",)]
    path, _, _ = draw(st.sampled_from(found))
    _set(body, path, None)
    in_list = isinstance(path[-1], int)
    return f"null{'-item' if in_list else ''}:{_label(path)}", in_list


def _integral_float(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    found = _present(body, lambda v, n: n.get("type") == "integer" and isinstance(v, int) and not isinstance(v, bool))
    if not found:
        return None
    path, value, _ = draw(st.sampled_from(found))
    _set(body, path, float(value))
    return f"float:{_label(path)}", False


def _missing_required(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    found = [(p, v, n) for p, v, n in _present(body, lambda v, n: isinstance(v, dict) and n.get("required"))
             if any(k in v for k in n["required"])]
    if not found:
        return None
    path, value, node = draw(st.sampled_from(found))
    key = draw(st.sampled_from([k for k in node["required"] if k in value]))
    del value[key]
    return f"required:{_label((*path, key))}", True


def _duplicate_key(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    found = _present(body, lambda v, n: isinstance(v, list) and v and n.get("x-kubernetes-list-type") == "map")
    if not found:
        return None
    path, value, _ = draw(st.sampled_from(found))
    value.append(copy.deepcopy(draw(st.sampled_from(value))))
    return f"duplicate:{_label(path)}", True


# ---- CEL rules' negative cases and owned flags -----------------------------------------------

def _engine_of(body: dict[str, Any]) -> dict[str, Any]:
    return body["spec"].setdefault("engine", {})


def _role_dicts(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [p[r] for p in body["spec"]["pools"] for r in api.ROLE_NAMES if isinstance(p.get(r), dict)]


HUB_IDS_REFUSED = ("hf://moonshotai/Kimi--K3", "hf://moonshotai/Kimi..K3", "hf://moonshotai/Kimi-K3.git",
                   "hf://moon--shot/Kimi-K3")
FLAG_LIKE = ("-", "--", "-x", "--trust-remote-code", "--dest=/cache/x", "-n4", "--served-model-name=")
"""Names that vLLM's or the stager's parser would read as a flag."""
UNKNOWN_VLLM_ENV = ("VLLM_ROUTER_SERVICE_HOST", "VLLM_X_PORT_8000_TCP", "VLLM_LOGGING_LEVL", "VLLM_",
                    "VLLM_RPC_TIMEOUT", "VLLM_USE_RUST_FRONTEND_")
"""VLLM_* names vLLM 0.33.0 does not know: the variables a Service named vllm-router or vllm-x would
inject without enableServiceLinks: false, typos, and settings of other vLLM versions."""
PVC_PATHS_OUTSIDE = ("pvc://weights/..", "pvc://weights/../kimi-k3", "pvc://weights/kimi-k3/../../x", "pvc://w/../")


def _cel(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    spec, pools = body["spec"], body["spec"]["pools"]
    pool = draw(st.sampled_from(pools))
    rule = draw(st.sampled_from(("owned-flag", "unknown-vllm-env", "tensor-divides-96", "mode-aggregated",
                                 "prefill-with-decode",
                                 "interval-needs-tokens", "tokens-need-interval", "dspark-needs-draft",
                                 "pool-needs-role", "agg-or-pd", "mode-disaggregated", "hub-repo-id",
                                 "pvc-stays-inside", "autoscaling-min-max", "ratio-min-max",
                                 "slo-mode-needs-target", "served-name-flag", "revision-flag",
                                 "rdma-env-prefix", "xgmi-is-amd", "nvlink-is-nvidia")))
    if rule == "interval-needs-tokens":
        _engine_of(body)["prefixCaching"] = {"retention": {"policy": "Interval"}}
    elif rule == "tokens-need-interval":
        retention = {"intervalTokens": draw(st.integers(1, 1 << 24))}
        if maybe(draw, 60):
            retention["policy"] = draw(st.sampled_from(("Dense", "Selective")))
        _engine_of(body)["prefixCaching"] = {"retention": retention}
    elif rule == "dspark-needs-draft":
        _engine_of(body)["speculative"] = draw(st.sampled_from(({}, {"method": "DSpark"},
                                                                {"method": "DSpark", "numSpeculativeTokens": 3})))
    elif rule == "tensor-divides-96":
        role = draw(st.sampled_from(_role_dicts(body) or [pool.setdefault("aggregated", {})]))
        role.setdefault("parallelism", {})["tensor"] = draw(st.sampled_from(TP_NON_DIVISORS))
    elif rule == "hub-repo-id":
        spec["model"]["uri"] = draw(st.sampled_from(HUB_IDS_REFUSED))
    elif rule == "pvc-stays-inside":
        spec["model"]["uri"] = draw(st.sampled_from(PVC_PATHS_OUTSIDE))
    elif rule == "autoscaling-min-max":
        role = draw(st.sampled_from(_role_dicts(body) or [pool.setdefault("aggregated", {})]))
        high = draw(st.integers(1, 1023))
        role["autoscaling"] = {"minReplicas": draw(st.integers(high + 1, 1024)), "maxReplicas": high,
                               "mode": draw(st.sampled_from(("KEDA", "HPA")))}
    elif rule == "ratio-min-max":
        high = draw(st.sampled_from((0.1, 1.0, 2.0)))
        spec["autoscaling"] = {"prefillDecodeRatio": {"min": high * draw(st.sampled_from((1.5, 2, 10))), "max": high}}
    elif rule == "slo-mode-needs-target":
        role = draw(st.sampled_from(_role_dicts(body) or [pool.setdefault("aggregated", {})]))
        role["autoscaling"] = {"maxReplicas": 4, **({"mode": "SLO"} if maybe(draw, 50) else {})}
        spec.pop("slo", None)
        if "mode" not in role["autoscaling"]:
            spec.pop("autoscaling", None)
    elif rule in ("served-name-flag", "revision-flag"):
        key = "servedName" if rule == "served-name-flag" else "revision"
        spec["model"][key] = draw(st.sampled_from(FLAG_LIKE)) + draw(st.text("abc-=", max_size=8))
    elif rule == "rdma-env-prefix":
        env = list(pool.setdefault("rdma", {}).get("env") or [])
        name = draw(st.sampled_from(("VLLM_HOST_IP", "VLLM_NIXL_SIDE_CHANNEL_PORT", "LD_PRELOAD", "nccl_ib_hca",
                                     "CUDA_VISIBLE_DEVICES", "PATH")))
        env.insert(draw(st.integers(0, len(env))), {"name": name, "value": "x"})
        pool["rdma"]["env"] = list({e["name"]: e for e in env}.values())
    elif rule == "xgmi-is-amd":
        pool["interconnect"] = "xGMI"
        pool["gpu"] = {**pool.get("gpu", {}), "product": draw(st.sampled_from(("GB300", "B200", "H200", "H100")))}
    elif rule == "nvlink-is-nvidia":
        pool["interconnect"] = "NVLink"
        pool["gpu"] = {**pool.get("gpu", {}), "product": "MI355X"}
    elif rule == "unknown-vllm-env":
        name = draw(st.sampled_from(UNKNOWN_VLLM_ENV))
        env = [e for e in _engine_of(body).get("env") or [] if e.get("name") != name]
        env.insert(draw(st.integers(0, len(env))), {"name": name, "value": "1"})
        _engine_of(body)["env"] = env
    elif rule == "pool-needs-role":
        for r in api.ROLE_NAMES:
            pool.pop(r, None)
    elif rule == "agg-or-pd":
        pool.setdefault("aggregated", {})
        pool.setdefault(draw(st.sampled_from(("prefill", "decode"))), {})
    elif rule == "mode-aggregated":
        pool.pop("aggregated", None)
        pool.setdefault("decode", {})
        pool["mode"] = "Aggregated"
    elif rule == "mode-disaggregated":
        pool.setdefault("aggregated", {})
        pool["mode"] = "Disaggregated"
    elif rule == "prefill-with-decode":
        gone = draw(st.sampled_from(("prefill", "decode")))
        kept = "decode" if gone == "prefill" else "prefill"
        for p in pools:
            p.pop(gone, None)
        pool.pop("aggregated", None)
        pool.pop("mode", None)
        pool.setdefault(kept, {})
    else:
        flag = draw(st.sampled_from(sorted(OWNED_FLAGS)))
        arg = flag if maybe(draw, 50) else f"{flag}=1"
        args = list(_engine_of(body).get("extraArgs") or [])
        args.insert(draw(st.integers(0, len(args))), arg)
        _engine_of(body)["extraArgs"] = args
    return f"cel:{rule}", True


def _owned_spelling(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    args = list(_engine_of(body).get("extraArgs") or [])
    args.append(draw(st.sampled_from(OWNED_ALIASES)))
    _engine_of(body)["extraArgs"] = args
    return "owned-spelling", True


DEFECTS: tuple[Defect, ...] = (
    _cel, _cel, _cel, _owned_spelling, _out_of_range, _out_of_range, _on_bound, _too_long, _bad_enum,
    _bad_pattern, _tricky_chars, _unknown_field, _wrong_type, _wrong_type, _null, _integral_float,
    _missing_required, _duplicate_key,
)
