"""The operator's chat template check agrees with the compiler vLLM 0.33.0 uses: transformers'
_compile_jinja_template in the wheel's venv (utils/chat_template_utils.py:528-602), on templates
that compile and templates that do not."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.unit.test_chat_template import BROKEN, VALID

from .test_vllm_contract import vllm_python

pytest.importorskip("jinja2", reason="jinja2 is an operator dependency now: rebuild the venv (scripts/venv.sh)")
from kimik3_operator.planner.chat_template import template_error

COMPILE = """
import json, sys
from transformers.utils.chat_template_utils import _compile_jinja_template
out = []
for text in json.load(sys.stdin):
    try:
        _compile_jinja_template(text)
        out.append(None)
    except Exception as exc:
        out.append(f"{type(exc).__name__}: {exc}")
print(json.dumps(out))
"""


def test_operator_and_vllm_refuse_the_same_templates() -> None:
    texts = [*VALID, *(t for t, _, _ in BROKEN)]
    run = subprocess.run([str(vllm_python()), "-c", COMPILE], input=json.dumps(texts), capture_output=True,
                         text=True, timeout=600, env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    ours = [template_error(t) for t in texts]
    assert [e is None for e in ours] == [e is None for e in theirs], list(zip(texts, ours, theirs, strict=True))
