"""The install guide's shell blocks are run as written (scripts/guide.sh: the demo installs with
them, .ci/run uninstalls with them); what that run cannot catch before it starts is checked here."""

from __future__ import annotations

import re
from pathlib import Path

from kimik3_operator import __version__

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "install.md").read_text()


def blocks() -> dict[str, str]:
    return dict(re.findall(r"^```sh (\w+)\n(.*?)^```$", GUIDE, flags=re.M | re.S))


def test_every_shell_block_of_the_guide_is_run_by_the_demo_or_ci() -> None:
    names = set(blocks())
    assert {"cli", "install", "logs", "uninstall"} <= names
    assert GUIDE.count("```sh") == len(names), "a shell block without a name is never run"
    run = " ".join((ROOT / n).read_text().replace("\\\n", " ") for n in ("scripts/demo.sh", ".ci/run"))
    for name in names:
        assert re.search(rf"guide\.sh\b[^\n]*\b{name}\b", run), f"block {name} is run by neither the demo nor CI"


def test_the_guide_installs_this_version() -> None:
    """The wheel's file name and the chart's --version in the blocks: a version bump must update the
    guide (the demo would fail on a missing wheel otherwise, later and less clearly)."""
    versions = {v for text in blocks().values() for v in re.findall(r"\b\d+\.\d+\.\d+\b", text)}
    assert versions == {__version__}, versions
