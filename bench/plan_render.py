"""What one reconcile pass costs in CPU and memory outside the API calls: node facts, planning,
rendering and the status computation, as the fleet grows.

    python bench/plan_render.py [--repeat 20]

Prints, per fleet size (GB300 NVL72 racks + B200 HGX nodes) and per example deployment, the
median wall time of each step, peak Python memory (tracemalloc) of one whole pass, and the ratio
to the smallest fleet, so a change that makes passes scale worse than the node count shows up.
Pure code only (no cluster): the API server's list calls are not included.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from kimik3_operator.api import KimiK3Deployment  # noqa: E402
from kimik3_operator.planner import plan_deployment, pool_facts, with_staged  # noqa: E402
from kimik3_operator.reconcile.status import compute_status  # noqa: E402
from kimik3_operator.render import Owner, render_children  # noqa: E402
from tests.support.cases import load_examples  # noqa: E402
from tests.support.nodes import b200_nodes, gb300_rack  # noqa: E402

FLEETS = {"2 racks + 4 HGX": (2, 4), "8 racks + 32 HGX": (8, 32), "32 racks + 128 HGX": (32, 128)}
EXAMPLES = ("gb300-aggregated-tp8.yaml", "pd-gb300-decode-b200-prefill.yaml", "gb300-slo-sized.yaml")


def fleet(racks: int, hgx: int) -> list[dict[str, Any]]:
    nodes = [n for r in range(racks) for n in gb300_rack(rack=f"r{r}")]
    return nodes + b200_nodes(hgx)


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def one_pass(body: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
    cr = KimiK3Deployment.model_validate(body)
    facts = {p.name: pool_facts(p.node_selector, nodes) for p in cr.spec.pools}
    plan = plan_deployment(cr.spec, facts)
    plan = with_staged(plan, {s.name: "0" * 40 for s in plan.weights.sources})
    owner = Owner(name=cr.metadata.name, namespace=cr.metadata.namespace, uid="u")
    render_children(owner, plan)
    compute_status(owner=owner, generation=1, previous=None, plan=plan, error=None, workloads={}, now="t")


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--repeat", type=int, default=20)
    repeat = args.parse_args().repeat
    examples = dict(load_examples())
    print(f"{'fleet':<20} {'nodes':>6} {'example':<36} {'facts ms':>9} {'plan ms':>8} {'render ms':>9} "
          f"{'pass ms':>8} {'x first':>8} {'peak KiB':>9}")
    first: dict[str, float] = {}
    for label, (racks, hgx) in FLEETS.items():
        nodes = fleet(racks, hgx)
        for name in EXAMPLES:
            body = examples[name]
            cr = KimiK3Deployment.model_validate(body)
            facts = {p.name: pool_facts(p.node_selector, nodes) for p in cr.spec.pools}
            plan = plan_deployment(cr.spec, facts)
            owner = Owner(name=cr.metadata.name, namespace=cr.metadata.namespace, uid="u")
            pools = cr.spec.pools
            facts_ms = median_ms(partial(lambda ps, ns: {p.name: pool_facts(p.node_selector, ns) for p in ps},
                                         pools, nodes), repeat)
            plan_ms = median_ms(partial(plan_deployment, cr.spec, facts), repeat)
            render_ms = median_ms(partial(render_children, owner, plan), repeat)
            pass_ms = median_ms(partial(one_pass, body, nodes), repeat)
            tracemalloc.start()
            one_pass(body, nodes)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            ratio = pass_ms / first.setdefault(name, pass_ms)
            print(f"{label:<20} {len(nodes):>6} {name:<36} {facts_ms:>9.2f} {plan_ms:>8.2f} {render_ms:>9.2f} "
                  f"{pass_ms:>8.2f} {ratio:>8.2f} {peak / 1024:>9.0f}")


if __name__ == "__main__":
    main()
