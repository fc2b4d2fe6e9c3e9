"""Strings the kubelet rewrites: a container's command, args and env values.

The kubelet expands `$(NAME)` there with the variable NAME of the container's environment (every
variable the pod spec gives it, a Secret's keys included) and reads `$$` as `$`
(k8s.io/kubernetes third_party/forked/golang/expansion). A user's string rendered there as it is
would be a template: a model URI or an endpoint holding `$(AWS_SECRET_ACCESS_KEY)` would hand the
Secret's value to the stager, its progress record, status, events, or the endpoint's server.

`literal` is the one way a value the user wrote (or the cluster reported) enters those fields.
It doubles every `$`, which the kubelet reads back as the string itself. Doubling only `$(` would
not do: `$$(X)` would become `$$$(X)`, which reads as `$` and the expansion of X. The operator's
own references (`$(POD_IP)`, `$(LWS_LEADER_ADDRESS)`) are written as they are, never through it.
"""

from __future__ import annotations

from collections.abc import Iterable


def literal(value: str) -> str:
    """`value` as the kubelet must read it: no expansion."""
    return value.replace("$", "$$")


def literals(values: Iterable[str]) -> list[str]:
    return [literal(v) for v in values]
