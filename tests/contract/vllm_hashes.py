#!/usr/bin/env python3
"""vLLM 0.33.0's own prefix-cache block hashes for token lists, offline (run with the python of the
venv scripts/vllm-venv.sh makes; never imported by the project's venv, which has no vllm).

Input (stdin): a JSON list of {"name": str, "block_size": int, "token_ids": [int], "seed": str | null}
(seed: the engine's PYTHONHASHSEED, null when unset). Output (stdout): a JSON object name -> list of
the full blocks' hashes as hex, computed by vLLM's engine-side hasher for a request
(v1/core/kv_cache_utils.get_request_block_hasher with the sha256_cbor function
--prefix-caching-hash-algo sha256_cbor selects, after init_none_hash as the engine core calls it),
and the uint64 each becomes in a KV event (maybe_convert_block_hash)."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace


def main() -> int:
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as kcu

    fn = get_hash_fn_by_name("sha256_cbor")
    out = {}
    for case in json.load(sys.stdin):
        if case.get("seed") is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = case["seed"]
        kcu.init_none_hash(fn)
        ids = case["token_ids"]
        request = SimpleNamespace(block_hashes=[], num_tokens=len(ids), all_token_ids=ids, mm_features=[],
                                  lora_request=None, cache_salt=None, prompt_embeds=None)
        hashes = kcu.get_request_block_hasher(case["block_size"], fn)(request)
        out[case["name"]] = {"hex": [bytes(h).hex() for h in hashes],
                             "event_ids": [kcu.maybe_convert_block_hash(h) for h in hashes]}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
