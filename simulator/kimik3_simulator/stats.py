"""`/sim/stats`: what this engine did with each request, for tests to check the P/D hand-off.

Paths: `local_prefill` (the engine computed the prompt itself), `remote_prefill` (it loaded the
prompt's KV from a prefill engine: only the backoff token, or nothing, was computed locally),
`recomputed_after_failed_load` (it was told to load the KV, the load failed, and under
kv_load_failure_policy recompute it computed the prompt itself; the record keeps the problem) and
`prefill_for_remote_decode` (it prefilled for a decoder and handed back kv_transfer_params). Each
record carries a fingerprint of the prompt's tokens, so records of a prefill engine and a decode
engine can be joined without the router's request ids. The per-request history is bounded.
`corrupt_outputs` counts the answers a decode made from KV blocks that were no longer the
request's (a second read, a read after the lease expired: nixl.py); their records carry
`corrupt_kv`, the reason, and their text is text.CORRUPT_WORD.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Any

LOCAL, REMOTE, PRODUCED = "local_prefill", "remote_prefill", "prefill_for_remote_decode"
RECOMPUTED = "recomputed_after_failed_load"
CORRUPT = "corrupt_outputs"


class SimStats:
    def __init__(self, history: int) -> None:
        self.history = history
        self.counts: Counter[str] = Counter()
        self.records: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def record(self, key: str, record: dict[str, Any]) -> None:
        self.counts["served"] += 1
        self.counts[record["path"]] += 1
        if record.get("finish_reason") in ("abort", "error"):
            self.counts[record["finish_reason"]] += 1
        if record.get("corrupt_kv"):
            self.counts[CORRUPT] += 1
        self.records[key] = record
        self.records.move_to_end(key)
        while len(self.records) > self.history:
            self.records.popitem(last=False)

    def reject(self, reason: str) -> None:
        self.counts[f"rejected_{reason}"] += 1

    def as_dict(self, engine: dict[str, Any]) -> dict[str, Any]:
        counts = {"served": 0, LOCAL: 0, REMOTE: 0, PRODUCED: 0, RECOMPUTED: 0, CORRUPT: 0, **self.counts}
        return {"engine": engine, "requests": counts, "by_request_id": dict(self.records)}
