"""Kubernetes' wire format for times (RFC 3339 in UTC, `2026-12-03T01:10:04Z`), read and written in
one place: the API server's metadata (deletionTimestamp, managedFields' times) and the status times
the operator writes itself (an autoscaled role's lastScaleTime, breachSince, calmSince)."""

from __future__ import annotations

from datetime import UTC, datetime


def parse(value: object) -> datetime | None:
    """A time as the API server or the client library hands it over (a `...Z` string or a datetime);
    None when it is absent or not a time (a malformed value must not fail a pass)."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def seconds(value: object) -> float | None:
    """`parse`, as seconds since the epoch."""
    return moment.timestamp() if (moment := parse(value)) is not None else None


def stamp(seconds_since_epoch: float) -> str:
    """Seconds since the epoch as the API server writes times (whole seconds, `Z`)."""
    return datetime.fromtimestamp(seconds_since_epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
