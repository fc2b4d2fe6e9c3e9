"""The stand-in kubelet's restarts (e2e/harness/restarts.py): the kubelet's back-off, the exit it
reports, and the container status a crash loop shows."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from e2e.harness.restarts import (
    INITIAL_BACKOFF_SECONDS,
    MAX_BACKOFF_SECONDS,
    MemoryCgroup,
    Restarts,
    exit_code,
)


def test_the_first_crash_restarts_at_once_then_the_back_off_doubles_to_its_cap() -> None:
    r, now, delays = Restarts("engine"), 1000.0, []
    for _ in range(8):
        delays.append(r.crashed(1, False, now, 0.0))
        now += delays[-1] + 1  # restarted, and crashed again a second later
        r.restarted(0.0)
    assert delays == [0.0, INITIAL_BACKOFF_SECONDS, 20.0, 40.0, 80.0, 160.0, MAX_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS]
    assert r.count == 8


def test_a_container_quiet_for_twice_the_cap_starts_its_back_off_again() -> None:
    r = Restarts("engine")
    r.crashed(1, False, 0.0, 0.0)
    r.crashed(1, False, 1.0, 0.0)
    assert r.crashed(1, False, 2 + 2 * MAX_BACKOFF_SECONDS + 1, 0.0) == 0.0


@pytest.mark.parametrize(("returncode", "oom", "code", "reason"), [
    (-signal.SIGKILL, False, 137, "Error"), (-signal.SIGKILL, True, 137, "OOMKilled"), (0, False, 0, "Completed"),
    (1, False, 1, "Error"), (-signal.SIGTERM, False, 143, "Error"),
])
def test_the_exit_reads_as_the_runtime_reports_it(returncode: int, oom: bool, code: int, reason: str) -> None:
    r = Restarts("engine")
    r.crashed(returncode, oom, 0.0, 0.0)
    assert r.last_terminated is not None
    assert (r.last_terminated["exitCode"], r.last_terminated["reason"]) == (code, reason)
    assert exit_code(returncode) == code


def test_the_status_of_a_crash_loop() -> None:
    r = Restarts("vllm")
    base = {"name": "vllm", "image": "img", "imageID": "id", "containerID": "c", "ready": True}
    running = r.status(base, True, "p", "ns", "u")
    assert running["state"] == {"running": {"startedAt": r.started_at}} and running["ready"]
    assert running["restartCount"] == 0 and "lastState" not in running
    r.crashed(-signal.SIGKILL, False, time.monotonic(), time.time())
    exited = r.status(base, True, "p", "ns", "u")
    assert not exited["ready"] and exited["state"]["terminated"]["exitCode"] == 137  # restarted at once
    r.restarted(time.time())
    r.crashed(1, False, time.monotonic(), time.time())
    waiting = r.status(base, True, "p", "ns", "u")
    assert waiting["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert "back-off 10s restarting failed container=vllm pod=p_ns(u)" == waiting["state"]["waiting"]["message"]
    assert waiting["lastState"] == {"terminated": r.last_terminated} and waiting["restartCount"] == 1
    assert not waiting["ready"] and not waiting["started"] and waiting["image"] == "img"


def test_a_process_past_its_memory_cgroup_is_oom_killed_and_told_apart() -> None:
    """The kernel's OOM killer in the played process's memory cgroup, where this machine has one."""
    group = MemoryCgroup.make(f"test-{time.time_ns()}", 64 * 1024**2)
    if group.path is None:
        pytest.fail("no memory cgroup could be made (cgroup v1 memory controller at /sys/fs/cgroup/memory, as root)")
    try:
        grow = "b = []\nwhile True:\n    b.append(bytearray(16 * 1024 * 1024))\n"
        proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(0.3)\n{grow}"])
        group.add(proc.pid)
        proc.wait(60)
        assert proc.returncode == -signal.SIGKILL
        assert group.oom_killed() and not group.oom_killed()  # counted once
    finally:
        group.remove()
