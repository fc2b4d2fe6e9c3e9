"""Draw bench/results/control_plane.png from every bench/results/control_plane-*.json.

    python bench/plot_control_plane.py bench/results      (run by bench/control_plane.sh in bench/plot-venv.sh)

Left: apply-to-children seconds against N, the operator of each results file beside its kubectl
floor. Right: the operator's requests per minute while idle against N. One line per results file
(label), so a before/after pair reads at a glance.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main() -> None:
    folder = Path(sys.argv[1])
    results = [json.loads(p.read_text()) for p in sorted(folder.glob("control_plane-*.json"))]
    if not results:
        sys.exit(f"no control_plane-*.json in {folder}")
    fig, (cost, idle) = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = plt.get_cmap("tab20").colors
    for index, result in enumerate(results):
        runs = sorted(result["runs"], key=lambda r: r["n"])
        n = [r["n"] for r in runs]
        label = result["label"]
        colour = colours[(2 * index) % len(colours)]  # an operator and its own floor share a colour
        cost.plot(n, [r["operator_seconds"] for r in runs], marker="o", color=colour, label=f"operator ({label})")
        if all("floor_seconds" in r for r in runs):
            cost.plot(n, [r["floor_seconds"] for r in runs], marker="x", linestyle="--", color=colour,
                      label=f"kubectl floor ({label})")
        idle.plot(n, [r["idle_reads_per_minute"] for r in runs], marker="o", color=colour, label=f"reads ({label})")
    cost.set(title="kubectl apply of N deployments -> all children exist", xlabel="deployments (N)",
             ylabel="seconds")
    idle.set(title="operator's API requests per minute while idle", xlabel="deployments (N)",
             ylabel="reads per minute")
    for ax in (cost, idle):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = folder / "control_plane.png"
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
