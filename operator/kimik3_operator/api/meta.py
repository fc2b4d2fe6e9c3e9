"""Kubernetes metadata shapes the API shares: conditions (metav1.Condition)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import StatusModel


class Condition(StatusModel):
    """A metav1.Condition: lastTransitionTime moves only when status flips."""

    type: Annotated[str, Field(max_length=64)]
    status: Literal["True", "False", "Unknown"]
    reason: Annotated[str, Field(max_length=64)]
    """Stable, CamelCase reason (e.g. PodsNotReady, InvalidSpec)."""
    message: Annotated[str, Field(max_length=4096)] = ""
    last_transition_time: Annotated[str, Field(max_length=64)]
    """RFC 3339 time of the last status flip."""
    observed_generation: int | None = None


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
