"""Router policies: one row each, from which the API's enum, the router's flag and the engines'
token-id route derive.

A row is the policy's API name (spec.router.policy, prefillPolicy, decodePolicy: spec.py's
RouterPolicy is these names, in this order), the router's spelling of it (render/router.py), and
whether it routes by the prompt's tokens, which the engines then serve to the router
(`vllm serve --enable-scale-out`: planner/plan.py router_tokenizes). Adding a policy is one row:
the router contract test parses every row's spelling with the router's own parser
(tests/contract/test_router_contract.py) and tests/unit/test_router_policies.py renders each row.

The rows are vllm-router 0.1.17's policies that work with nothing beside the engines, and
kimik3-router's PrecisePrefix, which follows the engines' KV events: the engines it picks among then
publish them (`--kv-events-config`, render/engine.py), and it picks prefill and aggregated engines
only (decode legs go by load: a decode's cache holds what its prefill handed over, which the
prefill leg's choice already decided). Left out: vllm-router's PowerOfTwo (it reads a /get_load vLLM
does not serve, so every load reads 0, and it refuses to start with one worker of a role) and KvAware
(it hashes blocks with its own scheme, not the engines' sha256_cbor keys).
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
    kv_events: bool = False
    """It reads the KV events of the engines it picks among, which then publish them."""
    implementations: tuple[str, ...] = ("KimiK3Router", "VllmRouter")
    """The router implementations (spec.router.implementation) that have it."""
    decode: bool = True
    """It may pick a prefill/decode pair's decode engine (spec.router.decodePolicy)."""


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
    RouterPolicyRow("PrecisePrefix", "precise_prefix", False,
                    "the engine and data-parallel rank whose cache holds the longest true K3 hit of the prompt "
                    "(MLA blocks and a KDA state at the same boundary), from the engines' KV events; prefill and "
                    "aggregated engines only, kimik3-router only; CacheAware where the prompt's token ids or "
                    "an engine's events are missing", kv_events=True, implementations=("KimiK3Router",),
                    decode=False),
)

POLICY_NAMES = tuple(p.name for p in ROUTER_POLICIES)
BY_NAME = {p.name: p for p in ROUTER_POLICIES}
NOT_FOR_DECODE = tuple(p.name for p in ROUTER_POLICIES if not p.decode)
KV_EVENTS = tuple(p.name for p in ROUTER_POLICIES if p.kv_events)


def lacking(implementation: str) -> tuple[str, ...]:
    """The policies a router implementation does not have (spec.router's rules refuse them)."""
    return tuple(p.name for p in ROUTER_POLICIES if implementation not in p.implementations)


def described() -> str:
    """The policies as the API's description lists them."""
    return " | ".join(f"{p.name} ({p.doc})" for p in ROUTER_POLICIES)
