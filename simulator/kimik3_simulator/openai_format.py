"""OpenAI response bodies as vLLM 0.33.0's serving layer writes them (entrypoints/openai/*/serving.py).

Streaming chunks carry `kv_transfer_params` only on the chunk that finishes a choice (null
before); the final usage chunk has no choices. Chat streams open with a role chunk; the kimi_k3
tool parser emits each tool call as one delta once its block closes, and the finishing chunk says
"tool_calls".
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Shape:
    """What a request asks of its answer's form (vLLM 0.33.0's request fields)."""

    token_ids: bool = False
    """return_token_ids: prompt_token_ids once (the first chunk), token_ids per chunk."""
    skip_special: bool = True
    """skip_special_tokens: special tokens left out of a completion's text."""
    reasoning: bool = False
    """The kimi_k3 reasoning parser splits the think channel off (--reasoning-parser kimi_k3), and
    include_reasoning is not false: chat deltas carry `reasoning`."""
    prompt_ids: tuple[int, ...] = ()


class Envelope:
    """The fields every response and chunk of one request share."""

    def __init__(self, rid: str, model: str, chat: bool, shape: Shape = Shape()) -> None:
        self.id, self.model, self.chat, self.shape = rid, model, chat, shape
        self.created = int(time.time())

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _ids(self, answer: Answer, before: int, after: int) -> list[int] | None:
        return answer.ids(before, after) if self.shape.token_ids else None

    def _prompt_ids(self, first: bool) -> list[int] | None:
        return list(self.shape.prompt_ids) if self.shape.token_ids and first else None

    def completion_chunk(self, answer: Answer, before: int, after: int, finish: str | None,
                         kv: dict[str, Any] | None) -> dict[str, Any]:
        return {**self._base("text_completion"),
                "choices": [{"index": 0, "text": answer.raw(before, after, self.shape.skip_special), "logprobs": None,
                             "finish_reason": finish, "stop_reason": None,
                             "prompt_token_ids": self._prompt_ids(before == 0),
                             "token_ids": self._ids(answer, before, after)}],
                "kv_transfer_params": kv}

    def chat_delta(self, answer: Answer, before: int, after: int) -> dict[str, Any]:
        """What the kimi_k3 parsers make of tokens [before, after): content, reasoning, or a tool call
        once its block closes; the think channel is content as text when no parser splits it off."""
        if answer.tool_call is not None:
            call = answer.call_done(after)
            return tool_call_delta(call) if call and not answer.call_done(before) else {}
        if not self.shape.reasoning:
            return {"content": answer.raw(before, after)}
        delta: dict[str, Any] = {}
        if reasoning := answer.reasoning(before, after):
            delta["reasoning"] = reasoning
        content = answer.text(before, after)
        if content or not delta and answer.plan.word(before)[0] == "content":
            delta["content"] = content
        return delta

    def chat_chunk(self, answer: Answer, before: int, after: int, finish: str | None,
                   kv: dict[str, Any] | None) -> dict[str, Any] | None:
        """A chat chunk for tokens [before, after); None when vLLM sends none (the parser holds the
        tokens back and neither token ids nor a finish are due)."""
        delta = self.chat_delta(answer, before, after)
        if finish is not None:
            finish = answer.finish_reason(after, finish)
        if not delta and finish is None and not self.shape.token_ids:
            return None
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        if self.shape.token_ids:
            choice["token_ids"] = answer.ids(before, after)
        return {**self._base("chat.completion.chunk"), "choices": [choice],
                "kv_transfer_params": kv if finish else None}

    def role_chunk(self) -> dict[str, Any]:
        chunk = {**self._base("chat.completion.chunk"),
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}]}
        if self.shape.token_ids:
            chunk["prompt_token_ids"] = list(self.shape.prompt_ids)
        return chunk

    def usage_chunk(self, prompt: int, completion: int) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._base(obj), "choices": [], "usage": usage(prompt, completion)}

    def whole(self, answer: Answer, seq: Sequence, out: Output) -> dict[str, Any]:
        """The whole answer of a finished request (chat or completion)."""
        generated, prompt, finish = seq.generated, seq.prompt_len, out.finish_reason
        assert finish is not None, "a whole answer is made once the request finished"
        kv = out.kv_transfer_params
        if not self.chat:
            body = {**self._base("text_completion"),
                    "choices": [{"index": 0, "text": answer.raw(0, generated, self.shape.skip_special),
                                 "logprobs": None, "finish_reason": finish, "stop_reason": None,
                                 "prompt_logprobs": None, "prompt_token_ids": self._prompt_ids(True),
                                 "token_ids": self._ids(answer, 0, generated)}],
                    "service_tier": None, "system_fingerprint": None,
                    "usage": usage(prompt, generated), "kv_transfer_params": kv}
            return body
        delta = self.chat_delta(answer, 0, generated)
        call = answer.call_done(generated)
        message = {"role": "assistant", "content": delta.get("content") or None, "refusal": None,
                   "annotations": None, "audio": None, "function_call": None,
                   "tool_calls": [call.as_dict()] if call else [], "reasoning": delta.get("reasoning")}
        choice = {"index": 0, "message": message, "logprobs": None,
                  "finish_reason": answer.finish_reason(generated, finish), "stop_reason": None,
                  "token_ids": self._ids(answer, 0, generated)}
        return {**self._base("chat.completion"), "choices": [choice],
                "service_tier": None, "system_fingerprint": None, "prompt_logprobs": None,
                "prompt_token_ids": self._prompt_ids(True), "usage": usage(prompt, generated), "kv_transfer_params": kv}


def tool_call_delta(call: ToolCall) -> dict[str, Any]:
    return {"tool_calls": [{"index": 0, "id": call.id, "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments}}]}
