"""The kubelet's `$(VAR)` expansion of a container's command, args and env values, for whatever plays
the kubelet in tests (e2e/tests/pod_runner.py, e2e/tests/stager.py, the simulator tests).

As k8s.io/kubernetes third_party/forked/golang/expansion/expand.go does it, left to right: `$$` is
`$`; `$(NAME)` (NAME: anything up to the next `)`) is NAME's value when the environment has it,
else stays as written; any other `$` stays. An env value is expanded with the variables defined
before it; command and args with the container's whole environment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_REFERENCE = re.compile(r"\$(?:\$|\(([^)]*)\))")


def expand(value: str, env: Mapping[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return "$"
        return env.get(m.group(1), m.group(0))

    return _REFERENCE.sub(one, value)
