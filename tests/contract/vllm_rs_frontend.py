#!/usr/bin/env python3
"""Ask vLLM 0.33.0's Rust frontend (the wheel's `vllm/vllm-rs`) the requests given, and print its answers.

Run with the python of the venv made by scripts/vllm-venv.sh (the project's venv has no vllm):

    echo '[{"name": "r", "scale_out": false, "path": "/v1/completions/render", "body": {"prompt": "a"}}]' \\
      | "$(scripts/vllm-venv.sh)/bin/python" tests/contract/vllm_rs_frontend.py
    -> {"r": {"status": 403, "body": {"error": {...}}}}

The frontend is started the way `vllm serve` with VLLM_USE_RUST_FRONTEND=1 starts it
(v1/utils.py:280-375, RustFrontendProcessManager): `vllm-rs frontend` on inherited listening
sockets for HTTP and for the engines' ZMQ input and output, and the non-default `vllm serve`
arguments as --args-json. No GPU engine runs: a stand-in engine connects a DEALER to the input
socket and sends the READY message an engine core sends (v1/engine/core.py:1883-1979,
EngineCoreReadyResponse), which is all the frontend waits for before it serves HTTP. It never
answers a generation, so only requests the frontend answers by itself can be asked (render,
tokenize, detokenize, a refused data-parallel rank). The model folder is a tiny word-level
tokenizer (the frontend loads one at startup) under the served name kimi-k3. One frontend per
value of `scale_out` (--enable-scale-out) among the requests; every process is stopped at the end.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

os.environ["VLLM_TARGET_DEVICE"] = "cpu"
READY_SECONDS = 60


def _model(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, **{f"w{i}": 3 + i for i in range(100)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "[UNK]", "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 4, "num_hidden_layers": 1, "intermediate_size": 128, "vocab_size": len(vocab),
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2}))


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    os.set_inheritable(s.fileno(), True)
    return s


def _ready_message() -> bytes:
    import msgspec

    return msgspec.msgpack.encode({
        "max_model_len": 2048, "num_gpu_blocks": 100, "block_size": 16, "dp_stats_address": None,
        "dtype": "bfloat16", "vllm_version": "0.33.0", "world_size": 1, "data_parallel_size": 1,
        "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "decode_context_parallel_size": 1,
        "data_parallel_rank": 0, "max_num_seqs": 8, "max_num_batched_tokens": 2048, "instance_id": "contract",
        "supports_lora": False, "max_loras": 0, "mamba_block_size": None, "kv_cache_size_tokens": 1600,
        "kv_cache_max_concurrency": 1.0, "kv_events_config": None, "weight_transfer_backend": None,
        "enable_sleep_mode": False, "supports_draft_weight_updates": False, "effective_attention_block_size": 16,
        "coord_store_port": 0, "coordinator_input_address": None, "coordinator_output_address": None})


def _ask(url: str, request: dict[str, Any]) -> dict[str, Any]:
    data = json.dumps(request.get("body", {})).encode()
    headers = {"Content-Type": "application/json", **request.get("headers", {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url + request["path"], data, headers), timeout=10) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = text
    return {"status": status, "body": body}


def _frontend(binary: Path, model: Path, scale_out: bool, requests: list[dict[str, Any]]) -> dict[str, Any]:
    import zmq

    http, inputs, outputs = _listener(), _listener(), _listener()
    args: dict[str, Any] = {"model_tag": str(model), "served_model_name": ["kimi-k3"],
                            "engine_ready_timeout_secs": READY_SECONDS, "http_timeout_keep_alive": 5}
    if scale_out:
        args["enable_scale_out"] = True
    fds = [http.fileno(), inputs.fileno(), outputs.fileno()]
    process = subprocess.Popen(
        [str(binary), "frontend", "--listen-fd", str(fds[0]), "--input-listener-fd", str(fds[1]),
         "--output-listener-fd", str(fds[2]), "--args-json", json.dumps(args, sort_keys=True)],
        pass_fds=fds, stdout=sys.stderr, stderr=sys.stderr)
    context = zmq.Context()
    engine = context.socket(zmq.DEALER)
    engine.setsockopt(zmq.IDENTITY, (0).to_bytes(2, "little"))  # rank 0, as core.py:1191 names it
    engine.setsockopt(zmq.LINGER, 0)
    engine.connect(f"tcp://127.0.0.1:{inputs.getsockname()[1]}")
    engine_out = context.socket(zmq.PUSH)
    engine_out.setsockopt(zmq.LINGER, 0)
    engine_out.connect(f"tcp://127.0.0.1:{outputs.getsockname()[1]}")
    engine.send(_ready_message())
    url = f"http://127.0.0.1:{http.getsockname()[1]}"
    try:
        deadline = time.monotonic() + READY_SECONDS
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, TimeoutError, ConnectionError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"vllm-rs frontend did not come up (exit code {process.poll()})")
            time.sleep(0.2)
        return {r["name"]: _ask(url, r) for r in requests}
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        engine.close()
        engine_out.close()
        context.term()
        for s in (http, inputs, outputs):
            s.close()


def main() -> int:
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None, "no vllm in this venv"
    binary = Path(spec.origin).parent / "vllm-rs"
    requests = json.load(sys.stdin)
    answers: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder)
        _model(model)
        for scale_out in sorted({bool(r.get("scale_out")) for r in requests}):
            answers.update(_frontend(binary, model, scale_out,
                                     [r for r in requests if bool(r.get("scale_out")) == scale_out]))
    json.dump(answers, out)
    out.write("\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
