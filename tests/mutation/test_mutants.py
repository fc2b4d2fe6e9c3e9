"""Mutation check: breaking any planning rule makes the test named for it fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .mutants import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "kimik3_operator"


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.rule for m in MUTANTS])
def test_breaking_the_rule_fails_its_test(mutant: Mutant, tmp_path: Path) -> None:
    copy = tmp_path / "operator" / "kimik3_operator"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / mutant.path
    source = target.read_text()
    assert source.count(mutant.original) == 1, f"{mutant.path}: the snippet to mutate is gone or ambiguous"
    target.write_text(source.replace(mutant.original, mutant.mutated))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "operator"), str(ROOT)]),
           "PYTHONDONTWRITEBYTECODE": "1"}
    imported = subprocess.run([sys.executable, "-c", "import kimik3_operator; print(kimik3_operator.__file__)"],
                              env=env, capture_output=True, text=True, check=True).stdout
    assert imported.startswith(str(tmp_path)), f"the mutated copy is not the one imported: {imported}"
    result = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", mutant.test],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, (
        f"rule '{mutant.rule}' broken, yet {mutant.test} did not fail:\n{result.stdout[-2000:]}")
