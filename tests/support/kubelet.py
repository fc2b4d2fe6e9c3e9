"""The kubelet's `$(VAR)` expansion of a container's command, args and env values, for whatever plays
the kubelet in tests (e2e/harness/pod_runner.py, e2e/harness/stager.py, the simulator tests).

As k8s.io/kubernetes third_party/forked/golang/expansion/expand.go does it, left to right: `$$` is
`$`; `$(NAME)` (NAME: anything up to the next `)`) is NAME's value when the environment has it,
else stays as written; any other `$` stays. An env value is expanded with the variables defined
before it; command and args with the container's whole environment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_REFERENCE = re.compile(r"\$(?:\$|\(([^)]*)\))")


def expand(value: str, env: Mapping[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return "$"
        return env.get(m.group(1), m.group(0))

    return _REFERENCE.sub(one, value)


def container_env(container: Mapping[str, Any], *, secrets: Mapping[str, Mapping[str, str]] | None = None,
                  fields: Mapping[str, str] | None = None, injected: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the kubelet gives `container`: `injected` first (what a webhook put there,
    e.g. LeaderWorkerSet's LWS_* variables), then its envFrom Secrets, then its env in order, each
    value expanded with what came before. `secrets` by name, `fields` by fieldPath; an optional
    Secret key that is not there sets no variable."""
    secrets, fields = secrets or {}, fields or {}
    env = dict(injected or {})
    for source in container.get("envFrom") or []:
        env.update(secrets.get(source["secretRef"]["name"], {}))
    for var in container.get("env") or []:
        ref = var.get("valueFrom") or {}
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        elif "secretKeyRef" in ref:
            secret = secrets.get(ref["secretKeyRef"]["name"], {})
            if ref["secretKeyRef"]["key"] in secret or not ref["secretKeyRef"].get("optional"):
                env[var["name"]] = secret.get(ref["secretKeyRef"]["key"], "")
        elif "fieldRef" in ref:
            env[var["name"]] = fields.get(ref["fieldRef"]["fieldPath"], "")
    return env


def argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """The container's command and args as the kubelet hands them to the runtime."""
    return [expand(a, env) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
