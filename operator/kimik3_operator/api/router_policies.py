"""Router policies: one row each, from which the API's enum, the router's flag and the engines'
token-id route derive.

A row is the policy's API name (spec.router.policy, prefillPolicy, decodePolicy: spec.py's
RouterPolicy is these names, in this order), the router's spelling of it (render/router.py), and
whether it routes by the prompt's tokens, which the engines then serve to the router
(`vllm serve --enable-scale-out`: planner/plan.py router_tokenizes). Adding a policy is one row:
the router contract test parses every row's spelling with the router's own parser
(tests/contract/test_router_contract.py) and tests/unit/test_router_policies.py renders each row.

The rows are vllm-router 0.1.17's policies that work with nothing beside the engines. Left out:
PowerOfTwo (it reads a /get_load vLLM does not serve, so every load reads 0, and it refuses to start
with one worker of a role) and KvAware (it needs the engines' KV events over ZMQ).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RouterPolicyRow:
    name: str
    """The API's name."""
    flag: str
    """The router's spelling (--policy, --prefill-policy, --decode-policy)."""
    tokenizes: bool
    """It asks the engines for the prompt's token ids (prefix-aware routing)."""
    doc: str
    """What it does, for the API's description."""


ROUTER_POLICIES: tuple[RouterPolicyRow, ...] = (
    RouterPolicyRow("CacheAware", "cache_aware", True,
                    "the engine that already holds the longest prefix of the prompt, unless the load is too "
                    "uneven; it asks every engine to tokenize the prompt first"),
    RouterPolicyRow("RoundRobin", "round_robin", False, "each engine in turn"),
    RouterPolicyRow("ConsistentHash", "consistent_hash", False,
                    "by the session: the X-Session-ID, X-User-ID, ... header; no tokenizer call; a request "
                    "without one lands anywhere"),
    RouterPolicyRow("StickyLeastLoaded", "sticky_least_loaded", False,
                    "a session stays on the engine it started on; new sessions go to the least loaded"),
    RouterPolicyRow("Random", "random", False, "any engine, at random"),
)

POLICY_NAMES = tuple(p.name for p in ROUTER_POLICIES)
BY_NAME = {p.name: p for p in ROUTER_POLICIES}


def described() -> str:
    """The policies as the API's description lists them."""
    return " | ".join(f"{p.name} ({p.doc})" for p in ROUTER_POLICIES)
