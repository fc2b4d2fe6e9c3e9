"""The simulator is a distribution of its own (simulator/pyproject.toml), kept out of the operator's
wheel and image, yet it computes its timing with the operator's planner: it must name exactly the
operator version it ships beside, and the operator's package must not carry it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import kimik3_operator

ROOT = Path(__file__).resolve().parents[2]


def test_the_simulator_pins_the_operator_version_it_ships_with() -> None:
    project = tomllib.loads((ROOT / "simulator" / "pyproject.toml").read_text())["project"]
    assert f"kimik3-operator=={kimik3_operator.__version__}" in project["dependencies"]
    assert project["version"] == kimik3_operator.__version__


def test_the_operator_package_does_not_carry_the_simulator() -> None:
    package = Path(kimik3_operator.__file__).parent
    assert not (package / "simulator").exists()
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find["where"] == ["operator"]
