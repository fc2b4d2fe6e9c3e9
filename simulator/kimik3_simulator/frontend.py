"""What vLLM 0.33.0's HTTP frontend does around generation: prompts, /tokenize, /detokenize, the
scale-out /render paths, and the X-data-parallel-rank header. A router calls these (vllm-router's
cache_aware policy POSTs `{route}/render` to every candidate worker and falls back to /tokenize
only when render answers 404, 405 or 501; a 403 means no token ids, so no prefix affinity).

vLLM has two frontends, and the pod's VLLM_USE_RUST_FRONTEND picks one (settings.py); they differ
in /render and in the wording of two errors. Cited in the vLLM 0.33.0 wheel, and observed on the
wheel's own `vllm/vllm-rs` binary started as vLLM starts it (v1/utils.py:280-375) with a stand-in
engine that only says READY (tests/contract/vllm_rs_frontend.py, which the contract tests rerun):
- Both, without --enable-scale-out: the render paths answer 403 PermissionDeniedError "Scale-out
  endpoints are disabled..." (Python: entrypoints/scale_out/factories.py:98-127; Rust: the same
  text from routes.rs:175, observed).
- Python with --enable-scale-out: render answers what a generate server takes, a GenerateRequest
  (scale_out/render/api_router.py:30-91, render/serving.py:117-345; a list of them for completions).
- Rust with --enable-scale-out: render answers 501 NotImplementedError "... is not supported by
  the Rust frontend yet" (observed), so a router falls back to /tokenize.
- /tokenize and /detokenize are served by both (serve/tokenize/api_router.py:35-83): `{"count",
  "max_model_len", "tokens", "token_strs"}` for a `prompt` or a `messages` body
  (tokenize/protocol.py:23-186, serving.py:57-135), and `{"prompt"}` back for `tokens`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from .config import EngineConfig
from .openai_format import BadRequest
from .text import THINK_OPEN, MediaPolicy, chat_prompt, completion_prompt, thinks
from .vocab import Vocabulary

RENDER_PATHS = {"/v1/completions/render": False, "/v1/chat/completions/render": True}
"""The render paths of the routes the simulator serves, and whether each is chat."""
SCALE_OUT_DISABLED = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."
OUTPUT_KIND = {True: 1, False: 2}
"""SamplingParams.output_kind (sampling_params.py:208-214): DELTA when streaming, else FINAL_ONLY."""


class Frontend:
    """One engine's frontend: its served names, its limits and the ids it has handed out."""

    def __init__(self, config: EngineConfig, vocab: Vocabulary | None = None) -> None:
        self.config = config
        self.vocab = vocab or Vocabulary()
        serve = config.serve
        self.model_names = serve.served_model_names or (serve.model,)
        images = (serve.limit_mm_per_prompt or {}).get("image")
        self.media = MediaPolicy(domains=serve.allowed_media_domains,
                                 image_limit=images.get("count") if isinstance(images, dict) else images,
                                 rust=config.settings.rust_frontend)

    @property
    def rust(self) -> bool:
        return self.config.settings.rust_frontend

    def check_model(self, body: Mapping[str, Any]) -> None:
        """An unknown model is a 404 on `model` (serve/engine/serving.py:49-84); Python also lists the
        served names, Rust does not (observed)."""
        model = body.get("model")
        if model is not None and model not in self.model_names:
            aliases = "" if self.rust else f" Valid aliases: {', '.join(self.model_names)}."
            raise BadRequest(f"The model `{model}` does not exist.{aliases}", 404, "NotFoundError", "model")

    def prompt(self, body: Mapping[str, Any], chat: bool) -> tuple[list[str], int]:
        """A generation request's prompt tokens and the room max_model_len leaves after them."""
        tokens = (chat_prompt(body.get("messages"), body.get("tools"), self.media) if chat
                  else completion_prompt(body.get("prompt")))
        if chat and thinks(body):
            tokens += THINK_OPEN  # the generation prefix K3's template ends a thinking prompt with
        if not tokens:
            raise BadRequest("the prompt is empty")
        room = self.config.max_model_len - len(tokens)
        if room <= 0:
            raise BadRequest(f"This model's maximum context length is {self.config.max_model_len} tokens. However, "
                             f"your prompt contains {len(tokens)} input tokens, which exceeds this limit even without "
                             f"any output tokens. Please reduce the length of the input prompt.")
        return tokens, room

    def max_tokens(self, body: Mapping[str, Any], chat: bool, room: int) -> int | None:
        """The max_tokens a request gave (chat: max_completion_tokens first), checked against the room."""
        param = body.get("max_completion_tokens") if chat else None
        param = param if param is not None else body.get("max_tokens")
        if param is not None and (not isinstance(param, int) or isinstance(param, bool) or param < 1):
            raise BadRequest("max_tokens must be a positive integer")
        if param is not None and param > room:
            raise BadRequest(f"'max_tokens' is too large: {param}. This model's maximum context length is "
                             f"{self.config.max_model_len} tokens and your request has "
                             f"{self.config.max_model_len - room} input tokens.")
        return param

    def data_parallel_rank(self, header: str | None) -> int | None:
        """The rank X-data-parallel-rank asks for. Python reads it with int() and ignores what does not
        parse (generate/base/serving.py:215-228); Rust ignores what is not a u32 (observed: "-1" and
        "abc" are ignored). A rank outside [0, data-parallel size) is a 400 in both
        (v1/engine/input_processor.py:396-400; Rust: observed, with a bare "engine-core error")."""
        if header is None:
            return None
        text = header.strip()
        if self.rust and not (text.isascii() and text.isdigit() and int(text) < 1 << 32):
            return None
        try:
            rank = int(text)
        except ValueError:
            return None
        if not 0 <= rank < self.config.ranks:
            raise BadRequest("engine-core error" if self.rust else
                             f"data_parallel_rank {rank} is out of range [0, {self.config.ranks}).")
        return rank

    # ---- /tokenize and /detokenize ----------------------------------------------------------

    def tokenize(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.check_model(body)
        if isinstance(body.get("messages"), list):  # rendered as a generation request renders it
            words = chat_prompt(body["messages"], body.get("tools"), self.media)
            if thinks(body):
                words += THINK_OPEN
        elif isinstance(body.get("prompt"), str):
            words = body["prompt"].split()
        else:
            raise BadRequest("/tokenize takes a `prompt` string or a `messages` list")
        ids = self.vocab.encode(words)
        return {"count": len(ids), "max_model_len": self.config.max_model_len, "tokens": ids,
                "token_strs": words if body.get("return_token_strs") else None}

    def detokenize(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.check_model(body)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                for t in ids):
            raise BadRequest("/detokenize takes `tokens`, a list of non-negative integers")
        return {"prompt": self.vocab.decode(ids)}

    # ---- the scale-out render paths ---------------------------------------------------------

    def render(self, path: str, body: Mapping[str, Any], request_id: str | None) -> Any:
        """What `POST {route}/render` answers: refusals as BadRequest, else the GenerateRequest(s)."""
        if not self.config.serve.enable_scale_out:
            raise BadRequest(SCALE_OUT_DISABLED, 403, "PermissionDeniedError")
        if self.rust:
            raise BadRequest(f"POST {path} is not supported by the Rust frontend yet. Set VLLM_USE_RUST_FRONTEND=0 "
                             f"to use the Python frontend.", 501, "NotImplementedError")
        chat = RENDER_PATHS[path]
        self.check_model(body)
        words, room = self.prompt(body, chat)
        param = self.max_tokens(body, chat, room)
        generate = _generate_request(response_id(request_id, body, chat), self.vocab.encode(words), body,
                                     param if param is not None else room)
        return {**generate, "parse_context": _parse_context(body)} if chat else [generate]


def response_id(header: str | None, body: Mapping[str, Any], chat: bool) -> str:
    """vLLM's `cmpl-`/`chatcmpl-` + _base_request_id: the X-Request-Id header, else the body's
    request_id, else a fresh id."""
    given = body.get("request_id")
    base = header or (given if isinstance(given, str) else None) or uuid.uuid4().hex
    return f"{'chatcmpl' if chat else 'cmpl'}-{base}"


def _generate_request(request_id: str, ids: list[int], body: Mapping[str, Any], max_tokens: int) -> dict[str, Any]:
    """A GenerateRequest as vLLM's model_dump writes it (token_in_token_out/protocol.py:221-359). Its
    sampling_params carry the fields the simulator reads, as SamplingParams dumps them: only those
    not at their defaults."""
    stream = bool(body.get("stream"))
    sampling: dict[str, Any] = {"max_tokens": max_tokens, "output_kind": OUTPUT_KIND[stream], "skip_clone": True}
    for key, default in (("temperature", None), ("min_tokens", 0), ("ignore_eos", False)):
        if body.get(key, default) != default:
            sampling[key] = body[key]
    return {"request_id": request_id, "token_ids": ids, "token_offsets": None, "features": None,
            "content_parts": None, "sampling_params": sampling, "model": body.get("model"),
            "reasoning_ended": None, "reasoning_parser_kwargs": None,
            "return_token_ids": body.get("return_token_ids"), "output_mode": "tokens", "parse_context": None,
            "stream": stream, "stream_options": _stream_options(body.get("stream_options")) if stream else None,
            "cache_salt": body.get("cache_salt"), "priority": body.get("priority", 0),
            "kv_transfer_params": body.get("kv_transfer_params"), "ec_transfer_params": None}


def _stream_options(options: Any) -> dict[str, Any] | None:
    """StreamOptions as dumped, every field present (generate/base/protocol.py:293-295)."""
    if not isinstance(options, dict):
        return None
    return {"include_usage": options.get("include_usage", False),
            "continuous_usage_stats": options.get("continuous_usage_stats", False)}


def _parse_context(body: Mapping[str, Any]) -> dict[str, Any]:
    """What a chat render hands the generate server to parse the output with (protocol.py:52-72);
    a tool's function is dumped with its description, null if it had none."""
    tools = body.get("tools")
    if isinstance(tools, list):
        tools = [{**t, "function": {"description": None, **t["function"]}} if isinstance(t, dict)
                 and isinstance(t.get("function"), dict) else t for t in tools]
    return {"tools": tools, "tool_choice": body.get("tool_choice", "auto" if tools else "none"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "include_reasoning": body.get("include_reasoning", True),
            "chat_template_kwargs": body.get("chat_template_kwargs") or {},
            "history_tool_call_cnt": sum(len(m.get("tool_calls") or []) for m in body["messages"]
                                         if m.get("role") == "assistant")}
