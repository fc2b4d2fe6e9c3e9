#!/usr/bin/env python3
"""A KV event subscriber built from vLLM 0.33.0's own classes, offline (run with the python of the
venv scripts/vllm-venv.sh makes; never imported by the project's venv, which has no vllm).

argv: a JSON object {"publishers": {rank: {"endpoint": ..., "replay_endpoint": ..., "topic": ...}}}.
It subscribes to every rank, prints `ready` once subscribed, and collects until its stdin closes;
then asks each rank's replay socket for everything from sequence 0, as a subscriber that missed
batches would. Every payload is decoded with msgspec.msgpack.Decoder(vllm.distributed.kv_events.
KVEventBatch), as vLLM's consumers decode them. Output (stdout, after `ready`): one JSON object
{rank: {"live": [batch...], "replayed": [batch...], "end_marker": bool}}, each batch
{"seq": int, "ts": float, "rank": int, "events": [{"type": class name, **fields}]}.

argv {"resolve": {config...}, "ranks": N}: instead, start vLLM's ZmqEventPublisher for ranks 0..N-1
with that config (as each engine core's scheduler does) and print each one's resolved
get_publisher_config(), the value GET /kv_event_sources lists for the rank, as {rank: config}."""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    import msgspec
    import zmq
    from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher

    args = json.loads(sys.argv[1])
    if "resolve" in args:
        return resolve(args["resolve"], args["ranks"])
    publishers = args["publishers"]
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    ctx = zmq.Context()

    def batch(seq: bytes, payload: bytes) -> dict[str, object]:
        b = decoder.decode(payload)
        return {"seq": int.from_bytes(seq, "big"), "ts": b.ts, "rank": b.data_parallel_rank,
                "events": [{"type": type(e).__name__, **msgspec.to_builtins(e)} for e in b.events]}

    subs = {}
    for rank, pub in publishers.items():
        sub = ctx.socket(zmq.SUB)
        sub.connect(pub["endpoint"])
        sub.setsockopt(zmq.SUBSCRIBE, pub["topic"].encode())
        subs[rank] = sub
    time.sleep(1.0)  # ZMQ's slow joiner: a PUB drops what it sends before the subscription arrives
    print("ready", flush=True)
    sys.stdin.read()  # the test closes stdin once its requests are done
    out: dict[str, dict[str, object]] = {}
    for rank, sub in subs.items():
        live = []
        while sub.poll(500):
            topic, seq, payload = sub.recv_multipart()
            live.append(batch(seq, payload))
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(publishers[rank]["replay_endpoint"])
        dealer.send_multipart((b"", (0).to_bytes(8, "big")))
        replayed, end = [], False
        while dealer.poll(5000):
            _, topic, seq, payload = dealer.recv_multipart()
            if seq == ZmqEventPublisher.END_SEQ:
                end = True
                break
            replayed.append(batch(seq, payload))
        out[rank] = {"live": live, "replayed": replayed, "end_marker": end}
    json.dump(out, sys.stdout)
    return 0


def resolve(config: dict[str, object], ranks: int) -> int:
    from dataclasses import asdict

    from vllm.distributed.kv_events import ZmqEventPublisher

    kwargs = {k: v for k, v in config.items() if k not in ("enable_kv_cache_events", "publisher")}
    publishers = [ZmqEventPublisher(rank, **kwargs) for rank in range(ranks)]  # type: ignore[arg-type]
    try:
        json.dump({str(r): asdict(p.get_publisher_config()) for r, p in enumerate(publishers)}, sys.stdout)
    finally:
        for p in publishers:
            p.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
