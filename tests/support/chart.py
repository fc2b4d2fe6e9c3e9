"""The chart as the tests read it: its folder, `helm template` with the helm that build.sh makes
(or one on PATH), and RBAC rules as (group, resource, verb) triples."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kimik3-operator"

Triple = tuple[str, str, str]


def triples(rules: list[dict[str, Any]]) -> set[Triple]:
    return {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def helm_binary() -> str | None:
    cache = Path(os.environ.get("KIMIK3_CACHE", Path.home() / ".cache" / "kimik3-e2e")) / "bin"
    built = sorted(p for p in cache.glob("helm-v*/helm") if p.is_file())
    return shutil.which("helm") or (str(built[-1]) if built else None)


def rendered(*values: str) -> list[dict[str, Any]]:
    helm = helm_binary()
    if helm is None:
        pytest.skip("helm is not built (e2e/cluster/build.sh helm)")
    out = subprocess.run([helm, "template", "t", str(CHART), "-n", "kimik3-system", *values],
                         capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]
