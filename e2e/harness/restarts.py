"""What a kubelet does when a container exits, for the pods the pod runner plays: restart it with the
kubelet's back-off and report it as a kubelet does, so the operator, LWS and the routers meet a crash
the way they would on a node.

The kubelet (pkg/kubelet/kuberuntime, flowcontrol.Backoff) restarts a container that exits under
restartPolicy Always (every serving and router pod here) at once the first time, then waits 10 s,
20 s, 40 s ... up to 300 s before each next start, and forgets the back-off once the container has
not crashed for twice that maximum. Meanwhile the container's status says `waiting` with reason
CrashLoopBackOff, `lastState.terminated` holds the last exit (exit code, reason, start and finish),
and `restartCount` counts the starts after the first. The exit reason is the runtime's: OOMKilled
when the kernel's OOM killer ended it (its memory cgroup counted an oom_kill), Completed for exit 0,
else Error; a signal is exit code 128 + its number (SIGKILL: 137).

LWS renders every group with RecreateGroupOnPodRestart here (render/workloads.py): once a pod's
restartCount rises, LWS deletes and recreates the whole group, so a crashed engine comes back as a
new pod, as on a cluster.

Played processes run in a memory cgroup of their own (cgroup v1, where this machine mounts it),
limited to the pod's memory limit but at most PLAYED_MEMORY_MAX: a simulator needs about 150 MB, and
an engine that grows past the cap is OOM-killed by the kernel, which is how OOMKilled is told apart.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INITIAL_BACKOFF_SECONDS = float(os.environ.get("KIMIK3_RESTART_BACKOFF_SECONDS", "10"))
MAX_BACKOFF_SECONDS = 300.0
PLAYED_MEMORY_MAX = 2 * 1024**3
"""The most memory one played process may hold: the machine has 24 GB and runs dozens of them."""
MEMORY_CGROUPS = Path("/sys/fs/cgroup/memory")
CGROUP_PARENT = "kimik3-played"


def iso(wall: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall if wall is not None else time.time()))


def exit_code(returncode: int) -> int:
    """The container's exit code as the runtime reports it: 128 + the signal for a killed process."""
    return returncode if returncode >= 0 else 128 + -returncode


def exit_reason(code: int, oom_killed: bool) -> str:
    if oom_killed:
        return "OOMKilled"
    return "Completed" if code == 0 else "Error"


@dataclass
class Restarts:
    """One container's life across restarts, as its kubelet keeps it."""

    name: str
    """The container's name."""
    count: int = 0
    """restartCount."""
    started_at: str = field(default_factory=iso)
    """When its current (or last) run started."""
    last_terminated: dict[str, Any] | None = None
    """lastState.terminated: the last exit."""
    backoff: float = 0.0
    """What the next crash waits before its restart (0: the first crash restarts at once)."""
    last_crash: float | None = None
    """time.monotonic() of the last crash."""
    restart_at: float | None = None
    """time.monotonic() when the exited container starts again; None while it runs."""
    delay: float = 0.0
    """The back-off of the current wait."""

    def crashed(self, returncode: int, oom_killed: bool, now: float, wall: float) -> float:
        """Record an exit; the seconds until its restart."""
        if self.last_crash is not None and now - self.last_crash > 2 * MAX_BACKOFF_SECONDS:
            self.backoff = 0.0  # quiet long enough: the back-off is forgotten
        code = exit_code(returncode)
        self.last_terminated = {"exitCode": code, "reason": exit_reason(code, oom_killed),
                                "startedAt": self.started_at, "finishedAt": iso(wall)}
        if returncode < 0:
            self.last_terminated["signal"] = -returncode
        self.delay = self.backoff
        self.backoff = min(MAX_BACKOFF_SECONDS, max(INITIAL_BACKOFF_SECONDS, 2 * self.backoff))
        self.last_crash, self.restart_at = now, now + self.delay
        return self.delay

    def restarted(self, wall: float) -> None:
        self.count += 1
        self.started_at, self.restart_at = iso(wall), None

    def status(self, base: dict[str, Any] | None, ready: bool, pod: str, namespace: str, uid: str) -> dict[str, Any]:
        """The container's status: running, or waiting in CrashLoopBackOff, with its last exit."""
        if self.restart_at is None:
            state: dict[str, Any] = {"running": {"startedAt": self.started_at}}
        elif self.delay == 0 and self.last_terminated is not None:
            state = {"terminated": self.last_terminated}  # restarted at once: no back-off to wait
        else:
            wait = max(0, round(self.restart_at - time.monotonic()))
            state = {"waiting": {"reason": "CrashLoopBackOff", "message": (
                f"back-off {wait}s restarting failed container={self.name} pod={pod}_{namespace}({uid})")}}
        out = {**(base or {"name": self.name, "image": "", "imageID": ""}), "name": self.name,
               "ready": ready and self.restart_at is None, "started": self.restart_at is None,
               "restartCount": self.count, "state": state}
        out.pop("lastState", None)
        if self.last_terminated is not None:
            out["lastState"] = {"terminated": self.last_terminated}
        return out


@dataclass
class MemoryCgroup:
    """A played process's memory cgroup (cgroup v1), or nothing where none can be made."""

    path: Path | None
    kills_before: int = 0

    @classmethod
    def make(cls, uid: str, limit_bytes: int | None) -> MemoryCgroup:
        root = MEMORY_CGROUPS / CGROUP_PARENT
        try:
            path = root / uid
            path.mkdir(parents=True, exist_ok=True)
            limit = min(limit_bytes or PLAYED_MEMORY_MAX, PLAYED_MEMORY_MAX)
            (path / "memory.limit_in_bytes").write_text(str(limit))
        except OSError:
            return cls(None)
        group = cls(path)
        group.kills_before = group.oom_kills()
        return group

    def add(self, pid: int) -> None:
        if self.path is not None:
            try:
                (self.path / "cgroup.procs").write_text(str(pid))
            except OSError:
                self.path = None  # the process is gone already, or the cgroup: no OOM told apart

    def oom_kills(self) -> int:
        """The kernel's count of OOM kills in this cgroup (memory.oom_control, kernels >= 4.13)."""
        if self.path is None:
            return 0
        try:
            for line in (self.path / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def oom_killed(self) -> bool:
        """Whether the kernel OOM-killed a process here since the last call."""
        kills = self.oom_kills()
        killed, self.kills_before = kills > self.kills_before, kills
        return killed

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()
            except OSError:
                pass  # a process still in it: the next runner's start clears the parent
