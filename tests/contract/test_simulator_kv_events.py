"""The simulator's KV events are vLLM 0.33.0's on the wire: a subscriber made of vLLM's own classes
(tests/contract/vllm_kv_events.py, in the cached vLLM venv) subscribes to every data-parallel rank
that GET /kv_event_sources lists, decodes every batch with vLLM's KVEventBatch, and replays from 0.

What it checks: one publisher per rank at the endpoint's port + rank (or, for `tcp://*:0`, at the
address vLLM's own publisher reports for the same config), sequence numbers from 0
without a gap, each batch's rank; BlockStored for K3's MLA group carries the sha256_cbor chain of
the prompt's ids (the keys test_simulator_hashes.py holds to vLLM's hasher) as 64-bit event hashes,
each run with its parent and tokens; the KDA group (`mamba`) stores only where vLLM keeps a state
(the prompt's last whole block under semantic retention); a replay returns the live batches byte
for byte in meaning and ends with vLLM's end marker."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kimik3_simulator.kv_events import event_hash
from kimik3_simulator.prefix_cache import block_hashes
from kimik3_simulator.vocab import token_id

from ..simulator.sims import free_port_base, role_report, simulator
from .test_vllm_contract import ROOT, vllm_python


def _local(endpoint: str) -> str:
    return endpoint.replace("tcp://*:", "tcp://127.0.0.1:")


def _vllm_resolves(config: dict[str, Any], ranks: int) -> dict[str, Any]:
    """What vLLM's own ZmqEventPublisher reports per rank for `config` on a node whose IP is loopback."""
    done = subprocess.run([str(vllm_python()), str(ROOT / "tests" / "contract" / "vllm_kv_events.py"),
                           json.dumps({"resolve": config, "ranks": ranks})], capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "VLLM_TARGET_DEVICE": "cpu",
                                            "VLLM_HOST_IP": "127.0.0.1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _port_free(sources: dict[str, Any]) -> dict[str, Any]:
    return {r: {k: v.rpartition(":")[0] if k.endswith("endpoint") else v for k, v in c.items()}
            for r, c in sources.items()}


@pytest.mark.parametrize("ephemeral", [False, True], ids=["port-plan", "tcp-star-0"])
def test_kv_events_decode_with_vllms_classes_per_rank_and_replay(tmp_path: Path, ephemeral: bool) -> None:
    """Both ways a deployment can place the publishers: a port plan (base + rank, wildcard host: the
    consumer supplies the host), and `tcp://*:0`, where each rank binds the node's IP on a port the OS
    picks and /kv_event_sources names the address (what the operator renders: render/engine.py)."""
    role = role_report("b200-dep16-disaggregated", "prefill")  # TP8 x DP2: two ranks, two publishers
    base = free_port_base(4)
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{base}",
              "replay_endpoint": f"tcp://*:{base + 2}", "topic": "kv"}
    if ephemeral:
        config = {**config, "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0"}
    argv = [*role["command"], "--kv-events-config", json.dumps(config)]
    env = {"K3SIM_GPU_PRODUCT": role["gpuProduct"], "VLLM_HOST_IP": "127.0.0.1"}
    with simulator(argv, tmp_path, env) as sim:
        sources = sim.get("/kv_event_sources").json()
        assert sorted(sources) == ["0", "1"]
        if ephemeral:  # every field as vLLM's publisher resolves it, the OS's ports aside
            assert _port_free(sources) == _port_free(_vllm_resolves(config, 2))
            ports = {int(sources[r][k].rpartition(":")[2]) for r in "01" for k in ("endpoint", "replay_endpoint")}
            assert len(ports) == 4 and 0 not in ports
        else:
            assert [sources[r]["endpoint"] for r in "01"] == [f"tcp://*:{base}", f"tcp://*:{base + 1}"]
            assert [sources[r]["replay_endpoint"] for r in "01"] == [f"tcp://*:{base + 2}", f"tcp://*:{base + 3}"]
        block = sim.stats()["engine"]["block_size"]
        publishers = {r: {**s, "endpoint": _local(s["endpoint"]), "replay_endpoint": _local(s["replay_endpoint"])}
                      for r, s in sources.items()}
        sub = subprocess.Popen([str(vllm_python()), str(ROOT / "tests" / "contract" / "vllm_kv_events.py"),
                                json.dumps({"publishers": publishers})], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={"PATH": "/usr/bin:/bin", "VLLM_TARGET_DEVICE": "cpu"})
        try:
            assert sub.stdout is not None and sub.stdout.readline().strip() == "ready", sub.stderr
            prompts = {0: [f"a{i}" for i in range(3 * block + 5)], 1: [f"b{i}" for i in range(2 * block + 1)]}
            for rank, words in prompts.items():
                r = sim.post("/v1/completions", {"prompt": " ".join(words), "max_tokens": 2},
                             headers={"X-data-parallel-rank": str(rank)})
                assert r.status_code == 200, r.text
            # The same prompt again on rank 0: all cached, nothing new to store.
            sim.post("/v1/completions", {"prompt": " ".join(prompts[0]), "max_tokens": 2},
                     headers={"X-data-parallel-rank": "0"})
            out, err = sub.communicate("", timeout=120)
        finally:
            if sub.poll() is None:
                sub.kill()
        assert sub.returncode == 0, err[-3000:]
    got: dict[str, Any] = json.loads(out)
    for rank, words in prompts.items():
        live = got[str(rank)]["live"]
        assert [b["seq"] for b in live] == list(range(len(live))) and live, (rank, live)
        assert all(b["rank"] == rank for b in live)
        assert got[str(rank)]["end_marker"]
        assert [(b["seq"], b["events"]) for b in got[str(rank)]["replayed"]] == [(b["seq"], b["events"]) for b in live]
        events = [e for b in live for e in b["events"]]
        hashes = [event_hash(h) for h in block_hashes(words, block, "sha256_cbor")]
        ids = [token_id(w) for w in words]
        mla = [e for e in events if e["type"] == "BlockStored" and e["group_idx"] == 0]
        assert [h for e in mla for h in e["block_hashes"]] == hashes, rank  # once each: a repeat stores nothing
        first = mla[0]
        assert first["parent_block_hash"] is None and first["kv_cache_spec_kind"] == "mla_attention"
        assert first["token_ids"] == ids[:len(first["block_hashes"]) * block] and first["block_size"] == block
        assert first["medium"] == "GPU" and first["lora_id"] is None
        kda = [e for e in events if e["type"] == "BlockStored" and e["group_idx"] == 1]
        kept = (len(words) - 1) // block  # semantic retention: a state at the last whole block end below N
        assert [e["block_hashes"] for e in kda] == [[hashes[kept - 1]]], rank
        assert kda[0]["kv_cache_spec_kind"] == "mamba" and kda[0]["parent_block_hash"] == (
            hashes[kept - 2] if kept > 1 else None)
        assert not [e for e in events if e["type"] == "BlockRemoved"]


@pytest.mark.parametrize("text", ['{"publisher": "kafka"}', '{"nope": 1}', "not json"])
def test_a_bad_kv_events_config_is_refused(text: str) -> None:
    from kimik3_simulator.cmdline import CommandLineError, parse_serve

    with pytest.raises(CommandLineError):
        parse_serve(["vllm", "serve", "m", "--kv-events-config", text])
