"""kopf's own requests name this process too.

kopf logs in as the Kubernetes client would (`kopf.login_via_client`, its default), but its
aiohttp session sends `kopf/VERSION` as User-Agent, the same for every replica. The audit log must
tell which replica wrote (one leader at a time), so the credentials carry our User-Agent: kopf
takes the session's headers from `ConnectionInfo.as_http_headers()` and adds its own only when
none is set.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import kopf

from ..k8s.identity import user_agent


@dataclasses.dataclass(frozen=True, kw_only=True)
class IdentifiedConnection(kopf.ConnectionInfo):
    user_agent: str = ""

    def as_http_headers(self) -> dict[str, str]:
        return {**super().as_http_headers(), "User-Agent": self.user_agent}


def identified(info: kopf.ConnectionInfo, agent: str) -> IdentifiedConnection:
    fields = {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}
    return IdentifiedConnection(**fields, user_agent=agent)


@kopf.on.login()
def login(**kwargs: Any) -> IdentifiedConnection | None:
    info = kopf.login_via_client(**kwargs)
    return None if info is None else identified(info, user_agent("kopf"))
