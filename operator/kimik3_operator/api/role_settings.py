"""Per-role engine settings: one row each, from which everything about the setting derives.

A row is the setting's API field (`pools[].<role>.engine.<name>`, its type, bounds and description),
the vLLM spellings it owns (so `engine.extraArgs` may not set them), its status field, how it
renders onto a `vllm serve` command line and how `kimik3 plan` prints it. From the rows come
RoleEngine's fields (spec.py), RoleStatus's (status.py), OWNED_FLAGS (owned_flags.py), the shape
flags (render/engine_shape.py), the plan fields (render/plan_fields.py) and the plan table's engine
line (render/report.py). What the planner derives when the spec leaves a setting out is the
planner's rule (planner/shaping.py), which fills the EngineShape attribute named `status`.

Adding a setting is one row here, plus its planner rule when vLLM's own default is not what the
planner wants. tests/unit/test_role_settings.py fails on a half-added row: a row whose spelling
vLLM does not parse (the contract test), whose override does not reach the command line, the status
or the report, or whose EngineShape attribute is missing.

Why rows and not hand-written fields: a field added to the API alone used to pass every check and
do nothing (issue 39); the models are built from these rows with pydantic's create_model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from ..kimi_k3 import MAX_MODEL_LEN
from .base import Rule, SpecModel


class Eplb(SpecModel):
    """Expert-parallel load balancing (--enable-eplb, --eplb-config): vLLM moves hot experts between
    ranks and keeps redundant copies of them."""

    enabled: bool = True
    """Turn EPLB on (needs expert parallelism) or off."""
    redundant_experts: Annotated[int, Field(ge=0, le=4096)] | None = None
    """Redundant experts per MoE layer across the expert group (num_redundant_experts); one per
    expert-parallel rank when omitted and they fit in memory. 896 plus it must divide by the
    expert-parallel size."""

    rules = (
        Rule(
            cel="self.enabled || !has(self.redundantExperts)",
            message="eplb.redundantExperts needs eplb.enabled (vLLM keeps redundant experts only with EPLB)",
            check=lambda e: e.enabled or e.redundant_experts is None,
            field_path=".redundantExperts",
        ),
    )


def _value_args(flag: str) -> Callable[[Any], list[str]]:
    def args(value: Any) -> list[str]:
        return [flag, str(value)]
    return args


def _eplb_args(redundant: Any) -> list[str]:
    """--eplb-config is a JSON EPLBConfig (vLLM 0.33.0 config/parallel.py:60-100)."""
    return ["--enable-eplb", "--eplb-config", json.dumps({"num_redundant_experts": redundant}, separators=(",", ":"))]


@dataclass(frozen=True)
class RoleSetting:
    """One per-role engine setting (see the module docstring)."""

    name: str
    """The spec field (snake_case; camelCase on the wire) under pools[].<role>.engine."""
    spec_type: Any
    """The spec field's type, bounds included; the field is optional (None: the planner's value)."""
    spec_doc: str
    flags: tuple[str, ...]
    """Every spelling vLLM 0.33.0's parser maps onto this setting (aliases, negations, sub-flags):
    all are owned. The first is the one rendered, unless `render` says otherwise."""
    status_doc: str
    report: str
    """The plan table's text for a value, `{}` standing for it."""
    example: tuple[Any, int]
    """A value as the spec writes it and the value the role then uses, on a DEP16 GB300 decode
    (tests/unit/test_role_settings.py follows it from the spec to every place it shows)."""
    status: str = ""
    """The RoleStatus field and EngineShape attribute (the value used); `name` when empty."""
    report_absent: str | None = None
    """The plan table's text when the role renders no value (vLLM's default); nothing when None."""
    render: Callable[[Any], list[str]] | None = None
    """The arguments a value renders as; `flags[0] value` when None."""

    @property
    def status_field(self) -> str:
        return self.status or self.name

    def args(self, value: Any) -> list[str]:
        """The command-line arguments of a value; none for None (vLLM's default)."""
        if value is None:
            return []
        return (self.render or _value_args(self.flags[0]))(value)

    def report_text(self, value: Any) -> str | None:
        return self.report_absent if value is None else self.report.format(value)


ROLE_SETTINGS: tuple[RoleSetting, ...] = (
    RoleSetting(
        "max_num_seqs", Annotated[int, Field(ge=1, le=65536)],
        "Sequences one data-parallel rank runs at once (--max-num-seqs).",
        ("--max-num-seqs",), "--max-num-seqs per data-parallel rank.", "max-num-seqs {}", (40, 40)),
    RoleSetting(
        "max_num_batched_tokens", Annotated[int, Field(ge=1, le=1 << 21)],
        "Tokens one data-parallel rank schedules per step (--max-num-batched-tokens).",
        ("--max-num-batched-tokens",), "--max-num-batched-tokens per data-parallel rank.",
        "max-num-batched-tokens {}", (4096, 4096)),
    RoleSetting(
        "max_cudagraph_capture_size", Annotated[int, Field(ge=1, le=1 << 16)],
        "Largest batch, in tokens, with a captured CUDA graph (--max-cudagraph-capture-size).",
        ("--max-cudagraph-capture-size",), "--max-cudagraph-capture-size; vLLM's default when absent.",
        "cudagraph capture <= {}", (96, 96)),
    RoleSetting(
        "long_prefill_token_threshold", Annotated[int, Field(ge=0, le=MAX_MODEL_LEN)],
        "Tokens a long prompt may schedule per step while others wait (--long-prefill-token-threshold; "
        "0 turns the cap off).",
        ("--long-prefill-token-threshold",),
        "--long-prefill-token-threshold; vLLM's default (no cap) when absent.", "long-prefill threshold {}",
        (2048, 2048)),
    RoleSetting(
        "eplb", Eplb,
        "Expert load balancing; the planner's choice (on for data-parallel expert roles on NVIDIA where the "
        "redundant experts fit in memory) when omitted.",
        ("--enable-eplb", "--no-enable-eplb", "--disable-eplb", "--eplb-config"),
        "Redundant experts per MoE layer with EPLB on (--enable-eplb); absent when EPLB is off.",
        "EPLB +{} experts", ({"enabled": True, "redundantExperts": 32}, 32), status="eplb_redundant_experts",
        report_absent="EPLB off", render=_eplb_args),
)
"""In command-line order."""


def spec_fields() -> dict[str, Any]:
    """RoleEngine's fields, for pydantic's create_model."""
    return {s.name: (s.spec_type | None, Field(default=None, description=s.spec_doc)) for s in ROLE_SETTINGS}


def status_fields() -> dict[str, Any]:
    """RoleStatus's fields for the values used, for pydantic's create_model."""
    return {s.status_field: (int | None, Field(default=None, description=s.status_doc)) for s in ROLE_SETTINGS}


def owned_spellings() -> dict[str, str]:
    """Each owned spelling -> the spec field that controls it (for OWNED_FLAGS)."""
    return {flag: f"pools[].<role>.engine.{_camel(s.name)}" for s in ROLE_SETTINGS for flag in s.flags}


def given(engine: Any, name: str) -> Any:
    """The value a role's engine block (a RoleEngine or None) sets for a setting, or None."""
    return None if engine is None else getattr(engine, name)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)
