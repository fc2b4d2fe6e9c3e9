"""What every pod of a deployment carries beside the operator's own (spec.pods), in the wire form
the renderer merges into each pod template (render/pod_extras.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..api import KimiK3DeploymentSpec


@dataclass(frozen=True)
class PodsPlan:
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    image_pull_secrets: tuple[str, ...]
    """Secret names, in the spec's order."""


def pods_plan(spec: KimiK3DeploymentSpec) -> PodsPlan | None:
    """None when spec.pods asks for nothing: every pod template stays byte for byte as before."""
    pods = spec.pods
    if not (pods.labels or pods.annotations or pods.image_pull_secrets):
        return None
    return PodsPlan(labels=dict(pods.labels), annotations=dict(pods.annotations),
                    image_pull_secrets=tuple(s.name for s in pods.image_pull_secrets))
