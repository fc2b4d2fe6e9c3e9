"""Report staging progress into the ConfigMap the operator made for this Job, so status can show it mid-run.

The operator cannot read a Job's progress any other way without pod logs (a kubelet connection per
read). The pod's ServiceAccount may only patch that one ConfigMap (the operator renders that Role:
no get, no create, nothing of its Job), and this module needs no Kubernetes client: one JSON merge
patch of `data.<PROGRESS_KEY>` over HTTPS with the mounted token. Reporting is best effort: a
failed patch is logged once and never fails the download.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from ..contract.stager import PROGRESS_FIELD_MANAGER, PROGRESS_KEY

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class ConfigMapReporter:
    """A progress sink: patches the newest record into ConfigMap `name` at most every `interval`
    seconds (always for Complete and Failed, so the last word is never throttled away)."""

    def __init__(self, name: str, *, env: Mapping[str, str] | None = None, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, session: requests.Session | None = None,
                 redact: Callable[[str], str] = lambda s: s) -> None:
        env = os.environ if env is None else env
        self._redact = redact
        sa_dir = Path(env.get("KIMIK3_SERVICEACCOUNT_DIR", SERVICE_ACCOUNT_DIR))
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
        self.enabled = bool(host) and (sa_dir / "token").is_file()
        self.name = name
        self.interval = interval
        self._clock = clock
        self._last = float("-inf")
        self._warned = False
        self._lock = threading.Lock()
        if not self.enabled:
            log.info("not in a cluster (no KUBERNETES_SERVICE_HOST or token): progress stays in the log")
            return
        namespace = env.get("POD_NAMESPACE") or (sa_dir / "namespace").read_text().strip()
        netloc = f"[{host}]" if host and ":" in host else host
        self.url = f"https://{netloc}:{port}/api/v1/namespaces/{quote(namespace)}/configmaps/{quote(name)}"
        self._sa_dir = sa_dir
        self._session = session or requests.Session()
        self._session.trust_env = False  # never through a proxy: the API server is in-cluster
        ca = sa_dir / "ca.crt"
        self._verify: str | bool = str(ca) if ca.is_file() else True

    def __call__(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        final = record.get("phase") in ("Complete", "Failed")
        with self._lock:
            now = self._clock()
            if not final and now - self._last < self.interval:
                return
            self._last = now
            self._patch(record)

    def _patch(self, record: dict[str, Any]) -> None:
        body = {"data": {PROGRESS_KEY: json.dumps(record, sort_keys=True, separators=(",", ":"))}}
        try:
            # Re-read the token each time: projected tokens rotate during a long download.
            token = (self._sa_dir / "token").read_text().strip()
            r = self._session.patch(self.url, params={"fieldManager": PROGRESS_FIELD_MANAGER}, data=json.dumps(body),
                                    headers={"Authorization": f"Bearer {token}",
                                             "Content-Type": "application/merge-patch+json"},
                                    verify=self._verify, timeout=10)
            if r.status_code >= 300:
                raise OSError(f"HTTP {r.status_code}: {self._redact(r.text)[:200]}")  # mask, then cut
        except (OSError, requests.RequestException) as exc:
            if not self._warned:
                log.warning("cannot report progress to ConfigMap %s (continuing): %s", self.name, exc)
                self._warned = True
