"""Hypothesis strategies for KimiK3Deployment bodies as users write them (camelCase dicts).

`cases()` draws a plausible deployment (pools on the fake nodes' labels, every role shape,
parallelism, replicas, engine options, speculation, workload/SLO, extraArgs, env) and, about
half the time, gives it one targeted defect:

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
import string
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, get_args

from hypothesis import strategies as st

from kimik3_operator.api import v1alpha1 as v1
from kimik3_operator.api.crd import openapi_schema
from kimik3_operator.api.owned_flags import OWNED_FLAGS
from kimik3_operator.planner.catalog import CATALOG

from .fleet import ABSENT, nodes
from .openapi import go_regex

Draw = Callable[[st.SearchStrategy[Any]], Any]
Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Case:
    body: dict[str, Any]
    defect: str | None = None
    """What was done to the plausible body, e.g. "range:spec.pools[].aggregated.replicas"."""
    must_reject: bool = False


# ---- vocabularies ---------------------------------------------------------------------------

URIS = ("hf://moonshotai/Kimi-K3", "pvc://weights/kimi-k3", "s3://models/kimi-k3/v1", "oci://registry.example/k3:1",
        "hf://moonshotai/Kimi-K3?revision=main")
DRAFT_URIS = ("hf://moonshotai/Kimi-K3-DSpark", "pvc://weights/k3-dspark")
POOL_NAMES = ("gb300", "b200", "h200", "mi355x", "rack-a", "rack-b", "p", "9lives", "decode-pool", "a" * 40)
TP_DIVISORS = tuple(t for t in range(1, 97) if 96 % t == 0)
TP_NON_DIVISORS = tuple(t for t in range(1, 97) if 96 % t)
SAFE_ARGS = ("--max-num-seqs=64", "--max-num-batched-tokens=16384", "--enforce-eager", "--seed=7",
             "--disable-log-stats", "--async-scheduling", "--uvicorn-log-level=warning", "--max-log-len=100",
             "--long-prefill-token-threshold=2048", "--enable-log-requests")
SAFE_ARG_PAIRS = (("--max-num-seqs", "128"), ("--seed", "-1"), ("--uvicorn-log-level", "info"))
OWNED_ALIASES = ("--device-memory-utilization=0.95", "--disable-expert-parallel",
                 "--disable-auto-tool-choice", "--no-enable-auto-tool-choice", "--mamba-ssm-cache-dtype=bfloat16",
                 "--no-fail-on-environ-validation", "--no-enable-expert-parallel",
                 "--speculative-config.num_speculative_tokens=9", "--kv-transfer-config.kv_role=kv_both",
                 "--speculative_config.method=mtp", "--tensor_parallel_size=4", "--gpu_memory_utilization=0.5",
                 "--max_model_len=1024", "--tensor-parallel=4", "--max-model=5", "-n4", "-e", "-qfp8",
                 "--enable-hybrid-kv-cache-manager", "--no-disable-hybrid-kv-cache-manager")
"""Spellings vLLM 0.33.0's parser maps onto flags the operator renders (seen in its parser: aliases
of one dest, --no-/--disable- negations, `_` for `-`, unique prefixes, `--json-flag.key=value`)."""
ENV = {"NCCL_DEBUG": ("INFO", "WARN"), "VLLM_LOGGING_LEVEL": ("INFO", "DEBUG"), "HF_HUB_OFFLINE": ("1", "0"),
       "UCX_TLS": ("rc,cuda_copy",), "NCCL_IB_HCA": ("mlx5", ""), "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("1",)}
"""Variables users set, with values their readers accept (VLLM_* ones are checked by vLLM's own reader)."""
QUANTITIES = ("2Ti", "1800Gi", "3T", "500G", "1.5Ti", "2000000000000")


def _enum(literal: Any) -> tuple[str, ...]:
    return tuple(get_args(literal))


# ---- plausible bodies -----------------------------------------------------------------------

def _maybe(draw: Draw, p_percent: int) -> bool:
    """True with probability p_percent; False when shrunk (towards 0), so a failing example
    shrinks to a body with as few optional parts as still fail."""
    return draw(st.integers(0, 99)) >= 100 - p_percent


SELECTOR_WEIGHTS = (("nvidia.com/gpu.product", 6), ("amd.com/gpu.product-name", 6), ("nvidia.com/gpu.clique", 3),
                    ("node.kubernetes.io/instance-type", 2), ("nvidia.com/gpu.family", 1), ("kubernetes.io/arch", 1),
                    ("type", 1), ("kubernetes.io/hostname", 1))


def _selector(draw: Draw) -> dict[str, str]:
    """Labels of one fake node (so the selector matches at least it), or nothing, or no node."""
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return {}
    if kind == 1:
        return dict(draw(st.sampled_from(ABSENT)))
    labels = draw(st.sampled_from(nodes()))["metadata"]["labels"]
    keys = [k for k, weight in SELECTOR_WEIGHTS if k in labels for _ in range(weight)]
    chosen = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=2, unique=True))
    return {k: labels[k] for k in chosen}


def _parallelism(draw: Draw) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if _maybe(draw, 90):
        out["tensor"] = draw(st.sampled_from((8, 8, 8, 8, 8, 8, 16, 16, 4, 32, 1, 2, 6, 12, 24, 48, 96)))
    if _maybe(draw, 20):
        out["pipeline"] = draw(st.sampled_from((1, 2, 2, 4)))
    if _maybe(draw, 40):
        out["data"] = draw(st.sampled_from((1, 2, 4, 8, 16)))
    if _maybe(draw, 40):
        out["expert"] = draw(st.booleans())
    return out


def _role(draw: Draw) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if _maybe(draw, 65):
        out["replicas"] = draw(st.sampled_from((1, 1, 2, 2, 3, 4, 0)))
    if _maybe(draw, 45):
        out["parallelism"] = _parallelism(draw)
    return out


def _toleration(draw: Draw) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if _maybe(draw, 80):
        out["key"] = draw(st.sampled_from(("nvidia.com/gpu", "dedicated", "")))
    if _maybe(draw, 70):
        out["operator"] = draw(st.sampled_from(("Exists", "Equal")))
    if out.get("operator") == "Equal" or _maybe(draw, 20):
        out["value"] = draw(st.sampled_from(("true", "inference", "")))
    if _maybe(draw, 60):
        out["effect"] = draw(st.sampled_from(("NoSchedule", "PreferNoSchedule", "NoExecute")))
    if out.get("effect") == "NoExecute" and _maybe(draw, 50):
        out["tolerationSeconds"] = draw(st.integers(0, 86400))
    return out


def _pool(draw: Draw, name: str, roles: tuple[str, ...]) -> dict[str, Any]:
    pool: dict[str, Any] = {"name": name}
    selector = _selector(draw)
    if selector or _maybe(draw, 20):
        pool["nodeSelector"] = selector
    if _maybe(draw, 30):
        gpu: dict[str, Any] = {}
        if _maybe(draw, 80):
            gpu["product"] = draw(st.sampled_from(("Auto", *CATALOG)))
        if _maybe(draw, 40):
            gpu["perNode"] = draw(st.sampled_from((4, 8, 8, 2, 16)))
        pool["gpu"] = gpu
    if _maybe(draw, 20):
        pool["interconnect"] = draw(st.sampled_from(_enum(v1.Interconnect)))
    if _maybe(draw, 8):
        backends: dict[str, Any] = {}
        if _maybe(draw, 60):
            backends["all2all"] = draw(st.sampled_from(_enum(v1.All2AllBackend)))
        if _maybe(draw, 60):
            backends["moe"] = draw(st.sampled_from(_enum(v1.MoeBackend)))
        pool["backends"] = backends
    if _maybe(draw, 15):
        pool["tolerations"] = [_toleration(draw) for _ in range(draw(st.integers(1, 2)))]
    if _maybe(draw, 10):
        pool["image"] = draw(st.sampled_from(("registry.example/vllm:0.33.0", "rocm/vllm:0.33.0")))
    for role in roles:
        pool[role] = _role(draw)
    if _maybe(draw, 20):
        pool["mode"] = "Aggregated" if "aggregated" in roles else "Disaggregated"
    return pool


SHAPES = ("aggregated", "pd-same-pool", "pd-split", "mixed", "free")


def _pools(draw: Draw) -> list[dict[str, Any]]:
    count = draw(st.sampled_from((1, 1, 1, 1, 2, 2, 3)))
    names = draw(st.lists(st.sampled_from(POOL_NAMES), min_size=count, max_size=count, unique=True))
    shape = draw(st.sampled_from(SHAPES))
    roles: list[tuple[str, ...]]
    if shape == "aggregated":
        roles = [("aggregated",)] * count
    elif shape == "pd-same-pool" or (shape == "pd-split" and count == 1):
        roles = [("prefill", "decode")] + [("aggregated",)] * (count - 1)
    elif shape == "pd-split":
        roles = [("prefill",), ("decode",)] + [draw(st.sampled_from((("prefill",), ("decode",), ("aggregated",))))
                                                for _ in range(count - 2)]
    elif shape == "mixed":
        roles = [draw(st.sampled_from((("aggregated",), ("prefill", "decode")))) for _ in range(count)]
    else:
        choices = (("aggregated",), ("prefill",), ("decode",), ("prefill", "decode"))
        roles = [draw(st.sampled_from(choices)) for _ in range(count)]
    return [_pool(draw, n, r) for n, r in zip(names, roles)]


def _engine(draw: Draw) -> dict[str, Any]:
    e: dict[str, Any] = {}
    if _maybe(draw, 10):
        e["image"] = "registry.example/vllm:0.33.0-custom"
    if _maybe(draw, 40):
        e["maxModelLen"] = draw(st.one_of(st.sampled_from((4096, 8192, 32768, 131072, 262144, 1 << 20)),
                                          st.integers(1, 1 << 20)))
    if _maybe(draw, 30):
        e["kvCacheDtype"] = draw(st.sampled_from(_enum(v1.Engine.model_fields["kv_cache_dtype"].annotation)))
    if _maybe(draw, 25):
        e["kdaStateDtype"] = draw(st.sampled_from(_enum(v1.Engine.model_fields["kda_state_dtype"].annotation)))
    for key in ("rustFrontend", "toolCalling", "reasoning"):
        if _maybe(draw, 15):
            e[key] = draw(st.booleans())
    if _maybe(draw, 35):
        pc: dict[str, Any] = {}
        if _maybe(draw, 40):
            pc["enabled"] = draw(st.booleans())
        if _maybe(draw, 70):
            policy = draw(st.sampled_from(("Interval", "Selective", "Dense")))
            pc["retention"] = {"policy": policy}
            if policy == "Interval":
                pc["retention"]["intervalTokens"] = draw(st.one_of(
                    st.sampled_from((4096, 8192, 32768, 1000)), st.integers(1, 1 << 24)))
        e["prefixCaching"] = pc
    if _maybe(draw, 35):
        method = draw(st.sampled_from(("DSpark", "MTP")))
        sp: dict[str, Any] = {"method": method}
        if _maybe(draw, 60):
            sp["numSpeculativeTokens"] = draw(st.integers(1, 16))
        if method == "DSpark":
            sp["draftModelUri"] = draw(st.sampled_from(DRAFT_URIS))
        e["speculative"] = sp
    if _maybe(draw, 15):
        e["multimodal"] = {"maxImagesPerPrompt": draw(st.integers(0, 256))} if _maybe(draw, 80) else {}
    if _maybe(draw, 20):
        e["shutdownTimeoutSeconds"] = draw(st.sampled_from((0, 30, 300, 3600)))
    if _maybe(draw, 30):
        args: list[str] = []
        for _ in range(draw(st.integers(1, 3))):
            if _maybe(draw, 70):
                args.append(draw(st.sampled_from(SAFE_ARGS)))
            else:
                args.extend(draw(st.sampled_from(SAFE_ARG_PAIRS)))
        e["extraArgs"] = args
    if _maybe(draw, 20):
        names = draw(st.lists(st.sampled_from(sorted(ENV)), min_size=1, max_size=3, unique=True))
        e["env"] = [{"name": n, **({"value": draw(st.sampled_from(ENV[n]))} if _maybe(draw, 80) else {})}
                    for n in names]
    return e


def _model(draw: Draw) -> dict[str, Any]:
    m: dict[str, Any] = {"uri": draw(st.sampled_from(URIS))}
    if _maybe(draw, 15):
        m["revision"] = draw(st.sampled_from(("main", "v1.0", "0123456789abcdef")))
    if _maybe(draw, 20):
        m["servedName"] = draw(st.sampled_from(("kimi-k3", "k3", "moonshotai/Kimi-K3")))
    if _maybe(draw, 50):
        ref = {"name": f"hf-token-{draw(st.text(string.hexdigits.lower()[:16], min_size=6, max_size=6))}"}
        if _maybe(draw, 50):
            ref["key"] = draw(st.sampled_from(("token", "HF_TOKEN", "hf.token")))
        m["authSecretRef"] = ref
    if _maybe(draw, 15):
        cache: dict[str, Any] = {}
        if _maybe(draw, 50):
            cache["storageClassName"] = draw(st.sampled_from(("standard", "fast-rwx")))
        if _maybe(draw, 60):
            cache["size"] = draw(st.sampled_from(QUANTITIES))
        m["cache"] = cache
    return m


@st.composite
def plausible_bodies(draw: Draw) -> dict[str, Any]:
    """A deployment a user could plausibly write (it may still be refused, by a rule or the planner)."""
    name = draw(st.one_of(st.sampled_from(("k3", "k3-pd", "kimi")),
                          st.from_regex(r"[a-z]([-a-z0-9]{0,70}[a-z0-9])?", fullmatch=True)))
    spec: dict[str, Any] = {"model": _model(draw), "pools": _pools(draw)}
    if _maybe(draw, 55):
        spec["engine"] = _engine(draw)
    if _maybe(draw, 10):
        spec["router"] = {"replicas": draw(st.integers(0, 64))}
    if _maybe(draw, 30):
        w: dict[str, Any] = {}
        if _maybe(draw, 60):
            w["inputTokens"] = draw(st.sampled_from((1024, 8192, 32768, 131072, 1)))
        if _maybe(draw, 60):
            w["outputTokens"] = draw(st.sampled_from((128, 1024, 4096, 1)))
        if _maybe(draw, 70):
            w["requestsPerSecond"] = draw(st.one_of(st.sampled_from((0.1, 1.0, 5.0, 50.0, 1000.0)),
                                                    st.floats(0.001, 100000)))
        if _maybe(draw, 20):
            w["acceptanceLength"] = draw(st.floats(1, 17))
        spec["workload"] = w
    if _maybe(draw, 20):
        slo: dict[str, Any] = {}
        if _maybe(draw, 60):
            slo["ttftMilliseconds"] = draw(st.sampled_from((1, 200, 2000, 10000, 3600000)))
        if _maybe(draw, 60):
            slo["itlMilliseconds"] = draw(st.sampled_from((1, 10, 20, 50, 60000)))
        spec["slo"] = slo
    if _maybe(draw, 15):
        spec["experimental"] = {"acceptKnownIssues": draw(st.lists(st.sampled_from(("vllm#52627", "vllm#1")),
                                                                  max_size=2, unique=True))}
    if _maybe(draw, 5):
        spec["autoscaling"] = {}
    return {"apiVersion": f"{v1.GROUP}/{v1.VERSION}", "kind": v1.KIND, "metadata": {"name": name}, "spec": spec}


# ---- schema-derived defects -----------------------------------------------------------------

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


def _parent(body: dict[str, Any], path: Path) -> Any:
    target: Any = body
    for p in path[:-1]:
        target = target[p]
    return target


def _present(body: dict[str, Any], kinds: Callable[[Any, dict[str, Any]], bool]) -> list[tuple[Path, Any, dict[str, Any]]]:
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
    elif "maxItems" in node and (not node.get("minItems") or _maybe(draw, 70)):
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
    return [p[r] for p in body["spec"]["pools"] for r in v1.ROLE_NAMES if isinstance(p.get(r), dict)]


def _cel(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    spec, pools = body["spec"], body["spec"]["pools"]
    pool = draw(st.sampled_from(pools))
    rule = draw(st.sampled_from(("owned-flag", "tensor-divides-96", "mode-aggregated", "prefill-with-decode",
                                 "interval-needs-tokens", "tokens-need-interval", "dspark-needs-draft",
                                 "pool-needs-role", "agg-or-pd", "mode-disaggregated")))
    if rule == "interval-needs-tokens":
        _engine_of(body)["prefixCaching"] = {"retention": {"policy": "Interval"}}
    elif rule == "tokens-need-interval":
        retention = {"intervalTokens": draw(st.integers(1, 1 << 24))}
        if _maybe(draw, 60):
            retention["policy"] = draw(st.sampled_from(("Dense", "Selective")))
        _engine_of(body)["prefixCaching"] = {"retention": retention}
    elif rule == "dspark-needs-draft":
        _engine_of(body)["speculative"] = draw(st.sampled_from(({}, {"method": "DSpark"},
                                                                {"method": "DSpark", "numSpeculativeTokens": 3})))
    elif rule == "tensor-divides-96":
        role = draw(st.sampled_from(_role_dicts(body) or [pool.setdefault("aggregated", {})]))
        role.setdefault("parallelism", {})["tensor"] = draw(st.sampled_from(TP_NON_DIVISORS))
    elif rule == "pool-needs-role":
        for r in v1.ROLE_NAMES:
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
        arg = flag if _maybe(draw, 50) else f"{flag}=1"
        args = list(_engine_of(body).get("extraArgs") or [])
        args.insert(draw(st.integers(0, len(args))), arg)
        _engine_of(body)["extraArgs"] = args
    return f"cel:{rule}", True


def _owned_spelling(draw: Draw, body: dict[str, Any]) -> tuple[str, bool] | None:
    args = list(_engine_of(body).get("extraArgs") or [])
    args.append(draw(st.sampled_from(OWNED_ALIASES)))
    _engine_of(body)["extraArgs"] = args
    return "owned-spelling", True


DEFECTS: tuple[Callable[[Draw, dict[str, Any]], tuple[str, bool] | None], ...] = (
    _cel, _cel, _cel, _owned_spelling, _out_of_range, _out_of_range, _on_bound, _too_long, _bad_enum,
    _bad_pattern, _tricky_chars, _unknown_field, _wrong_type, _wrong_type, _null, _integral_float,
    _missing_required, _duplicate_key,
)


@st.composite
def cases(draw: Draw, defect_percent: int = 50) -> Case:
    body = draw(plausible_bodies())
    if not _maybe(draw, defect_percent):
        return Case(body)
    mutated = copy.deepcopy(body)
    applied = draw(st.sampled_from(DEFECTS))(draw, mutated)
    if applied is None:
        return Case(body)
    return Case(mutated, *applied)
