"""Regenerate the values table of charts/kimik3-operator/README.md from the comments in
values.yaml (`# key -- description`); tests/unit/test_api.py checks every key is documented."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "kimik3-operator"
MARK = "## Values\n"


def main() -> None:
    text = (CHART / "values.yaml").read_text()
    data = yaml.safe_load(text)
    lines = ["| key | default | description |", "|---|---|---|"]
    for key, description in re.findall(r"^\s*# ([a-zA-Z0-9_.]+) -- (.*)$", text, re.M):
        value = data
        for part in key.split("."):
            value = value[part]
        shown = "(object)" if isinstance(value, dict) and value and key != "resources" else \
            "`" + yaml.safe_dump(value, default_flow_style=True).replace("...", "").strip() + "`"
        lines.append(f"| `{key}` | {shown.replace('|', '/')} | {description} |")
    readme = CHART / "README.md"
    head = readme.read_text().split(MARK)[0]
    readme.write_text(head + MARK + "\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
