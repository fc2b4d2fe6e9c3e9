"""The Responses API (POST /v1/responses) as vLLM 0.33.0 serves it for a model without harmony
(entrypoints/openai/responses/: protocol.py, serving.py, streaming_events.py, utils.py).

- The request is rendered as a chat: `instructions` is a system message, `input` a user message (a
  string) or a list of message items whose content is a string or a list of text parts. The engine
  work is the chat path's; only the envelope differs.
- `store` is turned off without VLLM_ENABLE_RESPONSES_API_STORE (serving.py:355-362; the operator
  never sets it), so `background` with `store` is a 400 (serving.py:265-277) and a
  `previous_response_id` is a 404 "not found": nothing is ever stored (serving.py:365-370).
- A whole answer is a ResponsesResponse (protocol.py:870-1030): status `incomplete` with
  `incomplete_details.reason: max_output_tokens` when the length stopped it (utils.py:103-107),
  `kv_transfer_params` at the top level. A stream is `event: <type>` + `data:` events: created,
  in_progress, then output_item.added and content_part.added on the first text, output_text.delta
  per step, output_text.done, content_part.done, output_item.done, and response.completed or
  response.incomplete (serving.py:1343-1470, streaming_events.py:835-960); a failure mid-way is an
  `error` event and the end of the stream.
Tools are not modelled here: a request's `tools` are echoed, never called.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from .openai_format import BadRequest

if TYPE_CHECKING:
    from .engine import Output, Sequence
    from .text import Answer

STORE_NEEDED = ("This vLLM engine does not support `store=True` and therefore does not support the background mode. "
                "To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when "
                "launching the vLLM server.")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return json.dumps(content)


def as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request the engine runs for a Responses request (refusals as vLLM's)."""
    store = body.get("store", True) is not False
    if store and body.get("background"):
        raise BadRequest(STORE_NEEDED, 400, "invalid_request_error", "background")
    previous = body.get("previous_response_id")
    if previous is not None:
        raise BadRequest(f"Response with id '{previous}' not found.", 404, "invalid_request_error", "response_id")
    given = body.get("input")
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for item in given:
            if isinstance(item, dict) and "role" in item:
                messages.append({"role": item["role"], "content": _text(item.get("content"))})
            else:
                messages.append({"role": "user", "content": json.dumps(item)})
    else:
        raise BadRequest("`input` must be a string or a list of input items", 400, "invalid_request_error", "input")
    chat = {k: v for k, v in body.items() if k not in ("input", "instructions", "max_output_tokens", "tools")}
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    return chat


class ResponsesEnvelope:
    """One Responses request's shared fields and its answer shapes."""

    def __init__(self, body: dict[str, Any], model: str, max_tokens: int) -> None:
        self.body, self.model, self.max_tokens = body, model, max_tokens
        self.id = f"resp_{uuid.uuid4().hex}"
        self.item_id = f"msg_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.sequence = 0

    def response(self, status: str, text: str | None, prompt: int, generated: int, kv: dict[str, Any] | None,
                 cached: int = 0) -> dict[str, Any]:
        b = self.body
        output = [] if text is None else [self.message(text, "incomplete" if status == "incomplete" else "completed")]
        return {
            "id": self.id, "created_at": self.created,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": b.get("instructions"), "metadata": b.get("metadata"), "model": self.model,
            "object": "response", "output": output, "parallel_tool_calls": b.get("parallel_tool_calls", True),
            "temperature": b.get("temperature") if b.get("temperature") is not None else 1.0,
            "tool_choice": b.get("tool_choice", "auto"), "tools": b.get("tools") or [],
            "top_p": b.get("top_p") if b.get("top_p") is not None else 1.0, "background": bool(b.get("background")),
            "max_output_tokens": self.max_tokens, "max_tool_calls": b.get("max_tool_calls"),
            "previous_response_id": None, "prompt": None, "prompt_cache_options": None, "prompt_cache_key": None,
            "prompt_cache_retention": None, "reasoning": b.get("reasoning"), "safety_identifier": None,
            "service_tier": b.get("service_tier", "auto"), "status": status, "text": b.get("text"),
            "top_logprobs": None, "truncation": b.get("truncation", "disabled"),
            "usage": None if status == "in_progress" else usage(prompt, generated, cached), "user": b.get("user"),
            "presence_penalty": b.get("presence_penalty") or 0.0,
            "frequency_penalty": b.get("frequency_penalty") or 0.0,
            "kv_transfer_params": kv, "ec_transfer_params": None, "input_messages": None, "output_messages": None,
        }

    def whole(self, answer: Answer, seq: Sequence, out: Output) -> dict[str, Any]:
        """The whole answer of a finished request: incomplete when its length stopped it."""
        status = "incomplete" if out.finish_reason == "length" else "completed"
        return self.response(status, answer.text(0, seq.generated), seq.prompt_len, seq.generated,
                             out.kv_transfer_params, seq.local_hit)

    def message(self, text: str, status: str) -> dict[str, Any]:
        content: list[dict[str, Any]] = ([{"annotations": [], "text": text, "type": "output_text", "logprobs": None}]
                                         if text else [])
        return {"id": self.item_id, "content": content, "role": "assistant", "status": status, "type": "message",
                "phase": None}

    def event(self, kind: str, **fields: Any) -> bytes:
        """One SSE event, numbered in order."""
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

    def opening(self) -> list[bytes]:
        start = self.response("in_progress", None, 0, 0, None)
        return [self.event("response.created", response=start), self.event("response.in_progress", response=start)]

    def text_open(self) -> list[bytes]:
        return [self.event("response.output_item.added", output_index=0, item={
                    "id": self.item_id, "content": [], "role": "assistant", "status": "in_progress",
                    "type": "message", "phase": None}),
                self.event("response.content_part.added", output_index=0, item_id=self.item_id, content_index=0,
                           part={"annotations": [], "text": "", "type": "output_text", "logprobs": []})]

    def delta(self, text: str) -> bytes:
        return self.event("response.output_text.delta", content_index=0, output_index=0, item_id=self.item_id,
                          delta=text, logprobs=[])

    def closing(self, text: str, status: str, prompt: int, generated: int, kv: dict[str, Any] | None,
                cached: int) -> list[bytes]:
        events = []
        if text:
            part: dict[str, Any] = {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
            events = [self.event("response.output_text.done", output_index=0, content_index=0, text=text,
                                 logprobs=[], item_id=self.item_id),
                      self.event("response.content_part.done", item_id=self.item_id, output_index=0,
                                 content_index=0, part=part),
                      self.event("response.output_item.done", output_index=0,
                                 item=self.message(text, "incomplete" if status == "incomplete" else "completed"))]
        final = self.response(status, text, prompt, generated, kv, cached)
        return [*events, self.event(f"response.{status}", response=final)]

    def error(self, message: str, code: str) -> bytes:
        return self.event("error", code=code, message=message, param=None)


def usage(prompt: int, generated: int, cached: int) -> dict[str, Any]:
    """The Responses usage (serving.py:880-920): cached tokens are the prompt's prefix-cache hits."""
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0,
                                     "input_tokens_per_turn": [prompt], "cached_tokens_per_turn": [cached]},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                      "output_tokens_per_turn": [generated], "tool_output_tokens_per_turn": [0]},
            "total_tokens": prompt + generated}
