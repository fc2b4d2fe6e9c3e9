"""The CI time guard: every step .ci/run and scripts/test.sh timed against its budget (.ci/budget.tsv).

Usage: python3 .ci/budget.py STEPS_FILE   (lines `step<TAB>seconds`, appended as the steps end)

Prints each step's time beside its budget and fails, naming the step, when one took more than
OVER times its budget. The budgets are a cold run's (an empty cache: bench/README.md, "CI time"), so
a warm run passes with room; a step that grows past a cold budget by a fifth in a warm run is a step
that will break the cold one.
"""

from __future__ import annotations

import sys
from pathlib import Path

OVER = 1.2
BUDGETS = Path(__file__).with_name("budget.tsv")


def read(path: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            step, seconds, *_ = line.split("\t")
            out[step] = float(seconds)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    budgets, took = read(BUDGETS), read(Path(argv[1]))
    unknown = sorted(set(took) - set(budgets))
    print(f"{'step':<10} {'took s':>8} {'budget s':>9} {'ratio':>6}")
    over = []
    for step, budget in budgets.items():
        if step not in took:
            print(f"{step:<10} {'-':>8} {budget:>9.0f}")
            continue
        ratio = took[step] / budget
        print(f"{step:<10} {took[step]:>8.0f} {budget:>9.0f} {ratio:>6.2f}")
        if ratio > OVER:
            over.append(f"{step} took {took[step]:.0f} s, over its budget of {budget:.0f} s by more than "
                        f"{OVER - 1:.0%}")
    for step in unknown:
        over.append(f"step {step} has no budget in {BUDGETS}")
    for line in over:
        print(f"FAILED: CI time: {line}", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
