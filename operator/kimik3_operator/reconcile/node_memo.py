"""Planning facts of the nodes, worked out again only when the nodes changed.

Every pass plans over every node its pools select; on a 1,000-node fleet re-reading the same
labels and quantities was most of a pass's own time (bench/control_plane.py: ~48 of 55 ms). A
node's facts depend on the node alone, and the informer replaces a node's object whenever it
changes, so (uid, resourceVersion) keys them; a pool's facts depend on its selector and the nodes,
so (selector, the node informer's revision) keys those, shared by every deployment's passes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..planner.facts import NodeFacts, PoolFacts, node_facts, pool_facts

MAX_POOLS = 256
"""Pool entries kept before the memo starts over (distinct selectors x recent revisions)."""


def _version_key(node: Mapping[str, Any]) -> tuple[str, str]:
    meta = node.get("metadata") or {}
    return meta.get("uid") or "", meta.get("resourceVersion") or ""


class FactsMemo:
    """`node_facts` per (uid, resourceVersion) and `pool_facts` per (selector, nodes revision)."""

    def __init__(self) -> None:
        self._nodes: dict[tuple[str, str], NodeFacts] = {}
        self._pools: dict[tuple[tuple[tuple[str, str], ...], int], PoolFacts] = {}

    def __call__(self, node: Mapping[str, Any]) -> NodeFacts:
        key = _version_key(node)
        if not all(key):
            return node_facts(node)  # not from the API server (a file, a test): nothing to key on
        found = self._nodes.get(key)
        if found is None:
            found = self._nodes[key] = node_facts(node)
        return found

    def pool(self, selector: Mapping[str, str], nodes: Sequence[Mapping[str, Any]], revision: int | None) -> PoolFacts:
        if revision is None:
            return pool_facts(selector, nodes, self)
        key = (tuple(sorted(selector.items())), revision)
        found = self._pools.get(key)
        if found is None:
            if len(self._pools) >= MAX_POOLS:
                self._pools.clear()
            found = self._pools[key] = pool_facts(selector, nodes, self)
            self._forget_gone(nodes)
        return found

    def _forget_gone(self, nodes: Sequence[Mapping[str, Any]]) -> None:
        """Drop the facts of nodes gone or changed, once twice as many are kept as exist."""
        if len(self._nodes) <= 2 * len(nodes) + 16:
            return
        live = {_version_key(n) for n in nodes}
        self._nodes = {k: v for k, v in self._nodes.items() if k in live}
