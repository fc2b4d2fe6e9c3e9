"""The fake GPU nodes the fuzzed specs are planned against, and the node selectors they may use.

The same nodes as the e2e cluster (e2e/cluster/nodes/*.yaml, read from the committed files) plus
the unit tests' MI355X boards and clique-labelled racks (tests/support/nodes.py), so pure plans
cover every vendor and the live test plans from a subset of the same labels.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from kimik3_operator.planner import PoolFacts, pool_facts
from tests.support.nodes import all_pools

ROOT = Path(__file__).resolve().parents[2]
E2E_NODES = ROOT / "e2e" / "cluster" / "nodes"

ABSENT = ({"nvidia.com/gpu.product": "NVIDIA-H100"}, {"nvidia.com/gpu.product": "NVIDIA-GB200"},
          {"pool": "does-not-exist"})
"""Selectors no node matches: planning must either use gpu.product or say NoMatchingNodes."""


@lru_cache(maxsize=1)
def e2e_nodes() -> tuple[dict[str, Any], ...]:
    docs = [d for f in sorted(E2E_NODES.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    return tuple(d for d in docs if d and d.get("kind") == "Node")


@lru_cache(maxsize=1)
def nodes() -> tuple[dict[str, Any], ...]:
    return e2e_nodes() + tuple(all_pools())


def facts_for(spec: Any,
              node_list: list[dict[str, Any]] | tuple[dict[str, Any], ...] | None = None) -> dict[str, PoolFacts]:
    """Pool facts as the operator computes them (reconciler.py), from the fake nodes by default."""
    listed = list(nodes() if node_list is None else node_list)
    return {pool.name: pool_facts(pool.node_selector, listed) for pool in spec.pools}
