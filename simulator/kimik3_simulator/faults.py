"""Faults beyond SIGKILL: how a simulated engine fails when a test asks it to (docs/simulator-faults.md).

A fault is armed at start by K3SIM_FAULTS (the pod's env, which the e2e stand-in kubelet passes
through) or at run time by POST /sim/fault, which answers only when K3SIM_FAULT_ADMIN=1 and only to
loopback peers. The kinds:

  exit_at_start  exit with a non-zero code before listening (a crash loop, restart after restart)
  oom            grow the process's memory until something kills it; at K3SIM_OOM_CAP_BYTES exit 137
  hang           take requests and never answer them; /health stays 200 (the realistic worst case)
  stall          stream `after_tokens` tokens, then send nothing more and keep the connection open
  5xx            answer the next `count` requests with HTTP 500 in vLLM's error shape
  reset          send 200 and its headers, then reset the connection (RST)

hang, stall, 5xx and reset strike the engine's own routes (/v1/completions, /v1/chat/completions);
/health, /metrics, /tokenize and /sim/* answer as usual, as a vLLM frontend does while its engine
core is stuck. Each request takes at most one fault, in the order 5xx, reset, hang, stall; `count`
(None: every request until cleared) says how many requests a fault takes. Every fault that strikes
is counted (Faults.counts, in /sim/stats).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

log = logging.getLogger(__name__)

EXIT_AT_START, OOM, HANG, STALL = "exit_at_start", "oom", "hang", "stall"
HTTP_5XX, RESET, CLEAR = "5xx", "reset", "none"
KINDS = (EXIT_AT_START, OOM, HANG, STALL, HTTP_5XX, RESET)
PER_REQUEST = (HTTP_5XX, RESET, HANG, STALL)
"""The faults a request can take, in the order they are tried."""
OOM_EXIT_CODE = 137
OOM_STEP_BYTES = 16 << 20
OOM_STEP_SECONDS = 0.01
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
"""vLLM's EngineDeadError message: what its frontend answers (500) once the engine core is gone."""


class FaultError(ValueError):
    """A fault that cannot be armed (HTTP 400 on the admin route, exit 2 from K3SIM_FAULTS)."""


@dataclass(frozen=True)
class Fault:
    kind: str
    count: int | None = None
    """Requests this fault still takes; None: every request until cleared."""
    after_tokens: int = 0
    """stall: completion tokens sent before the stream stops."""
    exit_code: int = 1
    """exit_at_start: the process's exit code."""
    delay_seconds: float = 0.0
    """exit_at_start, oom: wall seconds after the start (or the arming) before it strikes."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


FIELDS = {"count": int, "after_tokens": int, "exit_code": int, "delay_seconds": float}
DEFAULT_COUNT = {HTTP_5XX: 1, RESET: 1}
SHORT_FIELD = {EXIT_AT_START: "exit_code", OOM: "delay_seconds", HANG: "count", STALL: "after_tokens",
               HTTP_5XX: "count", RESET: "count"}
"""What the N of the short form `kind:N` sets."""


def fault_from(obj: Any) -> Fault:
    """One fault from the admin route's JSON ({"fault": kind, ...}); kind "none" clears."""
    if not isinstance(obj, dict) or not isinstance(obj.get("fault"), str):
        raise FaultError('a fault is a JSON object with "fault": one of ' + ", ".join((*KINDS, CLEAR)))
    kind = obj["fault"]
    if kind not in (*KINDS, CLEAR):
        raise FaultError(f"unknown fault {kind[:40]!r}: one of {', '.join((*KINDS, CLEAR))}")
    values: dict[str, Any] = {"count": DEFAULT_COUNT.get(kind)}
    for key, value in obj.items():
        if key == "fault":
            continue
        if key not in FIELDS:
            raise FaultError(f"unknown field {key[:40]!r} (fields: fault, {', '.join(FIELDS)})")
        if value is None and key == "count":
            values[key] = None
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (FIELDS[key] is int and not float(value).is_integer()):
            raise FaultError(f"{key} must be a number, not {value!r}")
        values[key] = FIELDS[key](value)
    fault = Fault(kind, **values)
    if fault.count is not None and fault.count < 1:
        raise FaultError("count must be at least 1 (or null: every request)")
    if fault.after_tokens < 0 or fault.delay_seconds < 0 or fault.delay_seconds > 86400:
        raise FaultError("after_tokens and delay_seconds must not be negative (delay at most a day)")
    if not 1 <= fault.exit_code <= 255:
        raise FaultError("exit_code must be 1-255: exit_at_start is a crash")
    return fault


def parse_faults(raw: str) -> list[Fault]:
    """K3SIM_FAULTS: comma-separated `kind[:N]`, or the JSON object or list the admin route takes."""
    raw = raw.strip()
    if not raw:
        return []
    if raw[0] in "[{":
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise FaultError(f"not JSON: {exc}") from None
        faults = [fault_from(v) for v in (value if isinstance(value, list) else [value])]
    else:
        faults = []
        for item in filter(None, (i.strip() for i in raw.split(","))):
            kind, colon, number = item.partition(":")
            obj: dict[str, Any] = {"fault": kind}
            if colon:
                try:
                    obj[SHORT_FIELD.get(kind, "count")] = float(number) if "." in number else int(number)
                except ValueError:
                    raise FaultError(f"{item!r}: {number!r} is not a number") from None
            faults.append(fault_from(obj))
    if any(f.kind == CLEAR for f in faults):
        raise FaultError('"none" only clears faults at run time (POST /sim/fault)')
    return faults


class Faults:
    """The faults armed in one engine process and what they did."""

    def __init__(self, faults: list[Fault], oom_cap_bytes: int,
                 exit: Callable[[int], Any] = os._exit) -> None:
        self.oom_cap = oom_cap_bytes
        self.exit = exit
        self.armed: dict[str, Fault] = {}
        self.counts: Counter[str] = Counter()
        self.released = asyncio.Event()
        """Set when the engine stops: held requests may end."""
        self.hoard: list[bytearray] = []
        self.grower: asyncio.Task[None] | None = None
        for fault in faults:
            if fault.kind != EXIT_AT_START:
                self.armed[fault.kind] = fault

    def start(self) -> None:
        """Once the engine is up: an `oom` from K3SIM_FAULTS starts growing."""
        if OOM in self.armed:
            self._grow(self.armed[OOM])

    def arm(self, fault: Fault) -> None:
        if fault.kind == EXIT_AT_START:
            raise FaultError("exit_at_start is a start-up fault: set it in K3SIM_FAULTS")
        if fault.kind == CLEAR:
            self.clear()
            return
        self.armed[fault.kind] = fault
        if fault.kind == OOM:
            self._grow(fault)
        log.warning("fault armed: %s", fault.as_dict())

    def clear(self) -> None:
        self.armed.clear()
        if self.grower is not None:
            self.grower.cancel()
            self.grower = None
        self.hoard.clear()
        log.warning("faults cleared")

    def take(self) -> Fault | None:
        """The fault the next engine request gets, if any (one use of its count)."""
        for kind in PER_REQUEST:
            fault = self.armed.get(kind)
            if fault is None:
                continue
            if fault.count is not None:
                if fault.count <= 1:
                    del self.armed[kind]
                else:
                    self.armed[kind] = replace(fault, count=fault.count - 1)
            return fault
        return None

    def _grow(self, fault: Fault) -> None:
        if self.grower is None or self.grower.done():
            self.grower = asyncio.create_task(self._oom(fault.delay_seconds), name="fault-oom")

    async def _oom(self, delay: float) -> None:
        await asyncio.sleep(delay)
        log.warning("fault oom: growing memory to %d bytes", self.oom_cap)
        self.counts["oom"] += 1
        while self.counts["oom_grown_bytes"] < self.oom_cap:
            step = min(OOM_STEP_BYTES, self.oom_cap - self.counts["oom_grown_bytes"])
            self.hoard.append(bytearray(b"\xa5") * step)  # written, so the pages are resident
            self.counts["oom_grown_bytes"] += step
            await asyncio.sleep(OOM_STEP_SECONDS)
        log.error("fault oom: %d bytes and still alive; exiting %d as the OOM killer's SIGKILL would",
                  self.counts["oom_grown_bytes"], OOM_EXIT_CODE)
        for handler in logging.getLogger().handlers:
            handler.flush()
        self.exit(OOM_EXIT_CODE)

    def as_dict(self, admin: bool) -> dict[str, Any]:
        return {"admin_route": admin, "armed": [f.as_dict() for f in self.armed.values()],
                "counts": {k: self.counts[k] for k in ("5xx", "reset", "hang", "stall", "oom", "oom_grown_bytes")}}
