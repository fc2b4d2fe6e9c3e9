"""The simulator's prefix-cache keys are vLLM 0.33.0's: for prompts of several lengths and block
sizes, with PYTHONHASHSEED unset and set, simulator/kimik3_simulator/prefix_cache.block_hashes equals
what vLLM's own request hasher computes from the same token ids (tests/contract/vllm_hashes.py in
the cached vLLM venv, one subprocess). A router that recomputes keys from token ids (issue 42's
precise routing) can trust them."""

from __future__ import annotations

import json
import subprocess

import pytest

from kimik3_simulator.prefix_cache import block_hashes
from kimik3_simulator.vocab import token_id

from .test_vllm_contract import ROOT, vllm_python

CASES = [(words, block, seed) for words, block in ((5, 16), (16, 16), (50, 16), (1000, 128), (3000, 768))
         for seed in (None, "0", "12345")]


def test_block_hashes_are_vllms_sha256_cbor_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = {f"{n}w-b{b}-s{s}": ([f"w{i % 311}-{n}" for i in range(n)], b, s) for n, b, s in CASES}
    batch = [{"name": name, "block_size": b, "seed": s, "token_ids": [token_id(w) for w in words]}
             for name, (words, b, s) in prompts.items()]
    run = subprocess.run([str(vllm_python()), str(ROOT / "tests" / "contract" / "vllm_hashes.py")],
                         input=json.dumps(batch), capture_output=True, text=True, timeout=600,
                         env={"PATH": "/usr/bin:/bin", "VLLM_TARGET_DEVICE": "cpu"})
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = json.loads(run.stdout)
    for name, (words, b, seed) in prompts.items():
        if seed is None:
            monkeypatch.delenv("PYTHONHASHSEED", raising=False)
        else:
            monkeypatch.setenv("PYTHONHASHSEED", seed)
        ours = block_hashes(words, b)
        assert [h.hex() for h in ours] == theirs[name]["hex"], name
        assert len(ours) == len(words) // b
        # What a KV event carries (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, on by default): the low 64 bits.
        assert [int.from_bytes(h, "big") & (2**64 - 1) for h in ours] == theirs[name]["event_ids"], name
