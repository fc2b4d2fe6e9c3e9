"""e2e/images/build.sh builds the images under the references the chart and the planner use."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kimik3_operator.planner import images

ROOT = Path(__file__).resolve().parents[2]


def test_the_e2e_image_build_tags_what_the_planner_and_the_chart_expect() -> None:
    out = subprocess.run([str(ROOT / "e2e" / "images" / "build.sh"), "tags"], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert out == [images.OPERATOR_IMAGE, images.ROUTER_IMAGE, images.VLLM_ROUTER_IMAGE]
