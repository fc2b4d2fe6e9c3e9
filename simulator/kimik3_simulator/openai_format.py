"""OpenAI response bodies as vLLM 0.33.0's serving layer writes them (entrypoints/openai/*/serving.py).

Streaming chunks carry `kv_transfer_params` only on the chunk that finishes a choice (null
before); the final usage chunk has no choices. Chat streams open with a role chunk; the kimi_k3
tool parser emits each tool call as one delta once its block closes, and the finishing chunk says
"tool_calls".
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from .text import Answer, ToolCall

if TYPE_CHECKING:
    from .engine import Output, Sequence


class BadRequest(Exception):
    """A request vLLM refuses: answered with error_body(message, kind, status, param)."""

    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param


def error_body(message: str, kind: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None}


def sse(body: dict[str, Any] | str) -> bytes:
    return f"data: {body if isinstance(body, str) else json.dumps(body, separators=(',', ':'))}\n\n".encode()


class Envelope:
    """The fields every response and chunk of one request share."""

    def __init__(self, rid: str, model: str, chat: bool) -> None:
        self.id, self.model, self.chat = rid, model, chat
        self.created = int(time.time())

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def completion_chunk(self, text: str, finish: str | None, kv: dict[str, Any] | None) -> dict[str, Any]:
        return {**self._base("text_completion"),
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                             "stop_reason": None, "prompt_token_ids": None, "token_ids": None}],
                "kv_transfer_params": kv}

    def chat_chunk(self, delta: dict[str, Any], finish: str | None, kv: dict[str, Any] | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        return {**self._base("chat.completion.chunk"), "choices": [choice], "kv_transfer_params": kv}

    def role_chunk(self) -> dict[str, Any]:
        return {**self._base("chat.completion.chunk"),
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}]}

    def usage_chunk(self, prompt: int, completion: int) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._base(obj), "choices": [], "usage": usage(prompt, completion)}

    def completion(self, text: str, finish: str, prompt: int, completion: int,
                   kv: dict[str, Any] | None) -> dict[str, Any]:
        return {**self._base("text_completion"),
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                             "stop_reason": None, "prompt_logprobs": None}],
                "service_tier": None, "system_fingerprint": None,
                "usage": usage(prompt, completion), "kv_transfer_params": kv}

    def whole(self, answer: Answer, seq: Sequence, out: Output) -> dict[str, Any]:
        """The whole answer of a finished request (chat or completion)."""
        generated, prompt, finish = seq.generated, seq.prompt_len, out.finish_reason
        assert finish is not None, "a whole answer is made once the request finished"
        if self.chat:
            return self.chat_completion(answer.text(0, generated) or None, answer.call_done(generated),
                                        answer.finish_reason(generated, finish), prompt, generated,
                                        out.kv_transfer_params)
        return self.completion(answer.raw(0, generated), finish, prompt, generated, out.kv_transfer_params)

    def chat_completion(self, content: str | None, call: ToolCall | None, finish: str, prompt: int,
                        completion: int, kv: dict[str, Any] | None) -> dict[str, Any]:
        message = {"role": "assistant", "content": content, "refusal": None, "annotations": None, "audio": None,
                   "function_call": None, "tool_calls": [call.as_dict()] if call else [], "reasoning": None}
        return {**self._base("chat.completion"),
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                             "stop_reason": None}],
                "service_tier": None, "system_fingerprint": None, "prompt_logprobs": None,
                "usage": usage(prompt, completion), "kv_transfer_params": kv}


def tool_call_delta(call: ToolCall) -> dict[str, Any]:
    return {"tool_calls": [{"index": 0, "id": call.id, "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments}}]}
