"""The project's copy of vLLM 0.33.0's VLLM_* variable list (api/vllm_env.py, what admission holds
engine.env against) is the wheel's own: vllm/envs.py `environment_variables`, the list
--fail-on-environ-validation refuses every other VLLM_* variable by."""

from __future__ import annotations

import json
import subprocess

from kimik3_operator.api.vllm_env import KNOWN_VLLM_ENV

from .test_vllm_contract import vllm_python

LIST = ("import json, vllm.envs as e; "
        "print(json.dumps(sorted(n for n in e.environment_variables if n.startswith('VLLM_'))))")


def test_known_vllm_env_is_the_wheels_list() -> None:
    run = subprocess.run([str(vllm_python()), "-c", LIST], capture_output=True, text=True, timeout=600,
                         env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-3000:]
    wheel = set(json.loads(run.stdout.strip().splitlines()[-1]))
    assert sorted(KNOWN_VLLM_ENV - wheel) == [] and sorted(wheel - KNOWN_VLLM_ENV) == []
