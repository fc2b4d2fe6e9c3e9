"""The CI time guard (.ci/budget.py): a step more than a fifth over its budget fails the job, by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUARD = ROOT / ".ci" / "budget.py"


def _budget(step: str) -> int:
    return next(int(line.split("\t")[1]) for line in (ROOT / ".ci" / "budget.tsv").read_text().splitlines()
                if line.startswith(f"{step}\t"))


def _run(tmp_path: Path, steps: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "steps.tsv").write_text(steps)
    return subprocess.run([sys.executable, str(GUARD), str(tmp_path / "steps.tsv")], capture_output=True, text=True)


def test_steps_within_a_fifth_of_their_budget_pass(tmp_path: Path) -> None:
    demo, e2e = _budget("demo"), _budget("e2e")
    out = _run(tmp_path, f"demo\t{demo * 6 // 5}\ne2e\t{e2e * 6 // 5}\ntotal\t{_budget('total')}\n")
    assert out.returncode == 0, out.stderr
    assert "demo" in out.stdout and "1.20" in out.stdout


def test_a_step_over_its_budget_fails_naming_it(tmp_path: Path) -> None:
    e2e = _budget("e2e")
    out = _run(tmp_path, f"demo\t100\ne2e\t{e2e * 6 // 5 + 1}\n")
    assert out.returncode == 1
    assert f"FAILED: CI time: e2e took {e2e * 6 // 5 + 1} s, over its budget of {e2e} s" in out.stderr
    assert "demo" not in out.stderr


def test_a_step_without_a_budget_fails(tmp_path: Path) -> None:
    out = _run(tmp_path, "router-build\t10\n")
    assert out.returncode == 1 and "step router-build has no budget" in out.stderr


def test_every_step_the_scripts_time_has_a_budget() -> None:
    timed = set()
    for script in (ROOT / ".ci" / "run", ROOT / "scripts" / "test.sh"):
        text = script.read_text()
        timed |= {line.split("step_took ", 1)[1].split()[0] for line in text.splitlines()
                  if "step_took " in line and "()" not in line and '"$step"' not in line}
        timed |= {line.split()[1] for line in text.splitlines()
                  if line.startswith("bench_step ")}  # bench_step NAME SECONDS CMD...
        timed |= {"make-test"} if '"make-test\\t%s\\n"' in text else set()
    budgets = {line.split("\t")[0] for line in (ROOT / ".ci" / "budget.tsv").read_text().splitlines()
               if line and not line.startswith("#")}
    assert timed == budgets
