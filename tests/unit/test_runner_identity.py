"""The operator starts under a uid with no passwd entry (issue 22).

The image runs as uid 65532 and has no user database entry for it, like any uid a platform's
policy (OpenShift's restricted SCC, a PodSecurity admission default) assigns. kopf, left to find
its own identity, calls `getpass.getuser()`, which then raises KeyError: every operator pod
crash-looped under a real container runtime. Here the user database has no entry for the process
and the login variables are unset, as in the pod, and kopf's real start-up runs through the
runner.
"""

from __future__ import annotations

import asyncio
import getpass
import pwd
from typing import Any

import kopf
import pytest

from kimik3_operator.k8s.identity import IDENTITY
from kimik3_operator.reconcile import runner
from kimik3_operator.reconcile.settings import OperatorConfig


@pytest.fixture
def no_passwd_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    def getpwuid(uid: int) -> Any:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME", "POD_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(KeyError):
        getpass.getuser()  # the condition the image is in


def test_kopf_starts_without_a_user_name(no_passwd_entry: None, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    spawn = kopf.spawn_tasks

    async def spawn_and_see(**kwargs: Any) -> Any:
        seen.update(kwargs)
        return await spawn(**kwargs)

    monkeypatch.setattr(kopf, "spawn_tasks", spawn_and_see)
    replica = runner._Replica(OperatorConfig(namespaces=("x",)), None, standalone=True)

    async def start_and_stop() -> None:
        replica.stop.set()  # kopf's start-up runs whole, then stops at once
        await asyncio.wait_for(replica._kopf(), 30)

    asyncio.run(start_and_stop())
    assert seen["identity"] == IDENTITY
