"""Every command line the golden scenarios render, leader and worker, through vLLM 0.33.0's own
parser and validation, and every VLLM_* variable against vllm/envs.py.

vLLM lives in its own cached venv (scripts/vllm-venv.sh, built on first use); the check runs there
as a subprocess, since the operator's venv has no vLLM.
"""

from __future__ import annotations

import json
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from kimik3_operator.render.report import plan_report
from tests.golden.scenarios import SCENARIOS
from tests.golden.test_golden import plan_scenario

ROOT = Path(__file__).resolve().parents[2]


def _vllm_env(env: dict[str, str]) -> dict[str, str]:
    """The variables vLLM reads; the rest (HF_TOKEN, POD_IP) are the pod's business."""
    return {k: v for k, v in env.items() if k.startswith("VLLM_")}


def cases() -> list[dict[str, Any]]:
    out = []
    for scenario, body in sorted(SCENARIOS.items()):
        for pool in plan_report(plan_scenario(body))["pools"]:
            for role in pool["roles"]:
                name = f"{scenario}/{pool['name']}/{role['role']}"
                out.append({"name": f"{name}/leader", "argv": role["command"], "env": _vllm_env(role["env"])})
                if role["worker"]:
                    out.append({"name": f"{name}/worker", "argv": role["worker"]["command"],
                                "env": _vllm_env(role["worker"]["env"])})
    return out


@lru_cache(maxsize=1)
def vllm_python() -> Path:
    """The python of the cached vLLM 0.33.0 venv (built on first use)."""
    venv = subprocess.run([str(ROOT / "scripts" / "vllm-venv.sh")], capture_output=True, text=True, timeout=1800)
    assert venv.returncode == 0, f"could not build the vLLM 0.33.0 venv:\n{venv.stderr[-3000:]}"
    return Path(venv.stdout.strip().splitlines()[-1]) / "bin" / "python"


def run_check(batch: list[dict[str, Any]], timeout: float = 600) -> dict[str, dict[str, Any]]:
    """vllm_check.py's verdict per case name, all cases in one subprocess."""
    run = subprocess.run([str(vllm_python()), str(ROOT / "tests" / "contract" / "vllm_check.py")],
                         input=json.dumps(batch), capture_output=True, text=True, timeout=timeout)
    assert run.returncode in (0, 1), f"vllm_check.py failed to run:\n{run.stderr[-3000:]}"
    return {v["name"]: v for v in json.loads(run.stdout)}


@lru_cache(maxsize=1)
def verdicts() -> dict[str, dict[str, Any]]:
    return run_check(cases())


@pytest.mark.parametrize("case", [c["name"] for c in cases()])
def test_vllm_accepts_rendered_command(case: str) -> None:
    verdict = verdicts()[case]
    assert verdict["ok"], "\n".join(verdict["errors"])


def test_contract_covers_every_role_and_worker() -> None:
    names = [c["name"] for c in cases()]
    assert any(n.endswith("/worker") for n in names)
    assert len(names) == len(set(names)) >= 2 * len(SCENARIOS)
