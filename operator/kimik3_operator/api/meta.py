"""Kubernetes metadata shapes the API shares: conditions (metav1.Condition)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import StatusModel

Timestamp = Annotated[str, Field(max_length=64, json_schema_extra={"format": "date-time"})]
"""An RFC 3339 time in UTC, as the operator writes it (2026-01-31T12:00:00Z)."""


class Condition(StatusModel):
    """A metav1.Condition: lastTransitionTime moves only when status flips."""

    type: Annotated[str, Field(max_length=64)]
    """Ready (everything asked for serves), Progressing (staging, starting or rolling) or Degraded
    (it cannot reach the spec without someone acting)."""
    status: Literal["True", "False", "Unknown"]
    """True | False | Unknown."""
    reason: Annotated[str, Field(max_length=64)]
    """Stable, CamelCase reason (e.g. PodsNotReady, InvalidSpec)."""
    message: Annotated[str, Field(max_length=4096)] = ""
    """What the operator saw, for people: counts, the role or pool concerned, what to change."""
    last_transition_time: Timestamp
    """RFC 3339 time of the last status flip."""
    observed_generation: int | None = None
    """The spec generation the condition was computed for."""


class ObjectMeta(StatusModel):
    """The metadata fields the operator reads; everything else (managedFields, kopf's
    annotations, ...) is ignored so a live body always parses."""

    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    deletion_timestamp: str | None = None
