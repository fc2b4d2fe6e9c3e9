"""Tokens in and out: whitespace words for prompts, and a deterministic model for answers.

A prompt's tokens are its whitespace-separated words (token ids given as a list count one each,
as the words `#N`; vocab.py gives every word its id), so prompt lengths, prefix-cache blocks and
usage are predictable from the text. A chat prompt is its messages (a role marker, then the
words) plus the words of the tool schemas it carries; an image part stands for IMAGE_TOKENS tokens,
and its URL meets vLLM's fetch policy (MediaPolicy) but is never fetched.

An answer is plain text cycling through a fixed sentence from an offset the prompt picks (after a
think channel when a chat request asks K3 to think), a function of the context alone, so a stream
resumed on another engine from its prompt and generated ids goes on with the same tokens (Plan); or,
when the request offers tools (tool_choice not "none") and the last message is not a tool result, one
call to the named or first tool in Kimi K3's XTML tools channel, the tokens vLLM's kimi_k3 tool
parser reads back (tool_parsers/kimi_k3_tool_parser.py). Arguments come from the tool's JSON
schema: a string argument takes the last word of the last user message.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import uuid
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from .vocab import token_id

SENTENCE = ("This is a simulated Kimi K3 answer from one vLLM 0.33.0 stand-in whose timing follows our "
            "operator's performance model for that GPU, layout and batch it runs at.").split()
"""The answer's words, cycled. Every word occurs once, so a word says where in the sentence it is."""
THOUGHT = "Let me consider what the question needs, then how best to reply before writing".split()
"""The think channel's words, cycled; none of them is a SENTENCE word or a marker's."""
THINK_OPEN = ("<|open|>", "think", "<|sep|>")
"""K3's think channel opener (reasoning/kimi_k3_reasoning_parser.py): a thinking chat prompt ends
with it (the serving layer feeds it as the generation prefix), so the model starts inside the channel."""
THINK_CLOSE = ("<|close|>", "think", "<|sep|>")


class PromptError(ValueError):
    """The request's prompt or messages cannot be read (HTTP 400)."""


def completion_prompt(prompt: Any) -> list[str]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt.split()
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [f"#{t}" for t in prompt]
    raise PromptError("prompt must be a string or a list of token ids (one prompt per request)")


IMAGE_TOKENS = 256
"""Prompt tokens one image stands for. K3's processor turns an image into <|media_pad|> tokens, as
many as its size asks (vllm/models/kimi_k3/common/mm_preprocess.py); a fixed count keeps prompt
lengths, and so prefill time and KV, predictable while still counting images."""
IMAGE_TOKEN = "<|media_pad|>"


@dataclass(frozen=True)
class MediaPolicy:
    """vLLM's rules for image inputs, from its command line."""

    domains: tuple[str, ...] = ()
    """--allowed-media-domains; empty: any host (vLLM's reading too)."""
    image_limit: int | None = None
    """--limit-mm-per-prompt's image entry; None: vLLM's default (no limit here)."""
    rust: bool = False
    """The Rust frontend's policy instead: no allow list, no media from a private address."""


def _private_class(host: str) -> str | None:
    """The address class the Rust frontend refuses media from, for an IP literal (the simulator
    resolves no name: a name stands for a public host)."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    for test, name in ((address.is_loopback, "loopback"), (address.is_link_local, "link-local"),
                       (address.is_private, "private"), (address.is_multicast, "multicast"),
                       (address.is_unspecified, "unspecified"), (address.is_reserved, "reserved")):
        if test:
            return name
    return None


def _image_words(part: dict[str, Any], media: MediaPolicy) -> list[str]:
    """An image part's tokens once its URL passes the checks vLLM makes before it fetches
    (vllm/multimodal/media/connector.py, load_from_url: data: URLs are decoded, http(s) URLs
    must be on an allowed host, file: URLs need --allowed-local-media-path, which is never set)."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str) or not url:
        raise PromptError("an image_url part needs a url")
    if url[:5].lower() != "data:":
        try:  # urllib3's parser, as vLLM's connector uses (lower-cased host, userinfo split off)
            spec = parse_url(url)
        except LocationParseError as exc:
            raise PromptError(f"Failed to parse URL: {exc}") from None
        scheme, host = spec.scheme or "", spec.host or ""
        if not scheme.startswith("http"):
            raise PromptError("Cannot load local files without `--allowed-local-media-path`."
                              if scheme == "file" else "The URL must be either a HTTP, data or file URL.")
        if media.rust:
            if (kind := _private_class(host)) is not None:
                raise PromptError(f"media host '{host}' resolves to a {kind} IP address, which media is not "
                                  "fetched from unless private media hosts are allowed")
        elif media.domains and host not in media.domains:
            raise PromptError(f"The URL must be from one of the allowed domains: {list(media.domains)}. "
                              f"Input URL domain: {host}")
    return [IMAGE_TOKEN] * IMAGE_TOKENS


def _content_words(content: Any, media: MediaPolicy) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return content.split()
    if isinstance(content, list):
        words: list[str] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                words += _image_words(part, media)
            elif isinstance(part, dict):
                words += str(part.get("text", "")).split()
        return words
    raise PromptError("message content must be a string or a list of parts")


def chat_prompt(messages: Any, tools: Any, media: MediaPolicy = MediaPolicy()) -> list[str]:
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages must be a non-empty list")
    tokens: list[str] = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise PromptError("every message needs a role")
        tokens.append(f"<|{m['role']}|>")
        tokens += _content_words(m.get("content"), media)
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {}) if isinstance(call, dict) else {}
            tokens += [str(fn.get("name", "")), *str(fn.get("arguments", "")).split()]
    if tools:
        tokens += json.dumps(tools, sort_keys=True).split()
    images = tokens.count(IMAGE_TOKEN) // IMAGE_TOKENS
    if media.image_limit is not None and images > media.image_limit:
        # vllm/multimodal/processing/context.py: the processor refuses more items than the limit
        raise PromptError(f"At most {media.image_limit} image(s) may be provided in one prompt.")
    return tokens


def thinks(body: Any) -> bool:
    """Whether a chat request asks K3 to think: chat_template_kwargs `thinking` (else
    `enable_thinking`) true, as the kimi_k3 reasoning parser reads them. K3's template thinks by
    default; the simulator thinks only when asked, so answers stay the plain ones unless a test wants
    a think channel."""
    kwargs = body.get("chat_template_kwargs") if isinstance(body, dict) else None
    if not isinstance(kwargs, dict):
        return False
    flag = kwargs.get("thinking", kwargs.get("enable_thinking"))
    return flag is True


def prompt_seed(ids: Sequence[int]) -> int:
    """A context's seed, from its token ids: a text prompt and the same prompt as ids agree."""
    return int.from_bytes(hashlib.blake2b(array("I", ids).tobytes(), digest_size=8).digest(), "big")


def _positions(words: Sequence[str]) -> dict[int, int]:
    return {token_id(w): i for i, w in enumerate(words)}


SENTENCE_AT, THOUGHT_AT = _positions(SENTENCE), _positions(THOUGHT)
CLOSE_IDS, OPEN_IDS = [token_id(w) for w in THINK_CLOSE], [token_id(w) for w in THINK_OPEN]


def special(word: str) -> bool:
    """A special token (`<|...|>`): skipped in text unless skip_special_tokens is false, and never
    spaced from its neighbours (spaces_between_special_tokens false, as the kimi_k3 parser asks)."""
    return word.startswith("<|") and word.endswith("|>")


def _run(ids: Sequence[int], end: int, at: dict[int, int]) -> int:
    """How many tokens before `end` continue each other in a cycled word list (`at`: id -> place)."""
    n, i = 0, end - 1
    while i >= 0 and ids[i] in at and (n == 0 or (at[ids[i]] + 1) % len(at) == at[ids[i + 1]]):
        n, i = n + 1, i - 1
    return n


@dataclass(frozen=True)
class Plan:
    """What the model generates after a context, read off the context's end: the simulated model is
    autoregressive, so a context that already holds part of an answer (a request resumed from its
    prompt and generated ids on another engine) continues it token for token.

    A thinking answer is THOUGHT words, THINK_CLOSE, then SENTENCE words; any other answer is SENTENCE
    words from an offset the context's seed picks. A context ending inside a channel continues it:
    SENTENCE words in order continue the answer (which stops once `natural` of them are out), THOUGHT
    words the thought (which closes after `thinking` of them), part of THINK_CLOSE the close."""

    thought: int = 0
    """THOUGHT words still to come."""
    thought_at: int = 0
    thought_done: int = 0
    close: int = 0
    """THINK_CLOSE tokens still to come."""
    content_at: int = 0
    content_done: int = 0
    content: int = 0
    """SENTENCE words still to come before the model stops by itself."""
    lead: bool = False
    """Whether the first token follows an answer token of the context (it is then spaced from it)."""

    @staticmethod
    def after(ids: Sequence[int], natural: int, thinking: int) -> Plan:
        n = len(ids)
        if c := _run(ids, n, SENTENCE_AT):
            return Plan(content_at=(SENTENCE_AT[ids[-1]] + 1) % len(SENTENCE), content_done=c,
                        content=max(0, natural - c), lead=True)
        closed = next((m for m in (3, 2, 1) if list(ids[n - m:]) == CLOSE_IDS[:m]), 0)
        q = _run(ids, n - closed, THOUGHT_AT)
        opened = list(ids[max(0, n - closed - q - 3):n - closed - q]) == OPEN_IDS
        if not (q or opened):
            return Plan(content_at=prompt_seed(ids) % len(SENTENCE), content=natural)
        thought = 0 if closed else max(0, thinking - q)
        at = (THOUGHT_AT[ids[n - closed - 1]] + 1) % len(THOUGHT) if q else 0
        upcoming = [token_id(THOUGHT[(at + i) % len(THOUGHT)]) for i in range(thought)] + CLOSE_IDS[closed:]
        return Plan(thought=thought, thought_at=at, thought_done=q, close=3 - closed,
                    content_at=prompt_seed([*ids, *upcoming]) % len(SENTENCE), content=natural,
                    lead=bool(q) and not closed)

    @property
    def length(self) -> int:
        return self.thought + self.close + self.content

    def word(self, i: int) -> tuple[str, int, str]:
        """Token i's channel ("reasoning", "marker", "content"), its place in the channel, its word."""
        if i < self.thought:
            return "reasoning", self.thought_done + i, THOUGHT[(self.thought_at + i) % len(THOUGHT)]
        i -= self.thought
        if i < self.close:
            return "marker", 3 - self.close + i, THINK_CLOSE[3 - self.close + i]
        i -= self.close
        return "content", self.content_done + i, SENTENCE[(self.content_at + i) % len(SENTENCE)]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Answer:
    """What the model generates for one request, token by token."""

    seed: int
    natural_length: int
    """Tokens before the model stops by itself (K3SIM_OUTPUT_TOKENS, or the end of the tools channel)."""
    markup: tuple[str, ...] = ()
    """The XTML tokens of a tool call answer; empty for plain text."""
    tool_call: ToolCall | None = None
    call_closed_at: int = 0
    """Tokens generated once the call block is closed (the parser emits the call then)."""
    plan: Plan = Plan()

    @staticmethod
    def after(ids: Sequence[int], natural: int, thinking: int) -> Answer:
        plan = Plan.after(ids, natural, thinking)
        return Answer(seed=plan.content_at, natural_length=plan.length, plan=plan)

    def call_done(self, generated: int) -> ToolCall | None:
        """The tool call once its block has been generated (what the tool parser then reports)."""
        return self.tool_call if self.tool_call is not None and generated >= self.call_closed_at else None

    def finish_reason(self, generated: int, engine_reason: str) -> str:
        """vLLM's chat finish reason: "tool_calls" once a call was made, else the engine's."""
        return "tool_calls" if self.call_done(generated) and engine_reason in ("stop", "length") else engine_reason

    def _channel(self, start: int, end: int, channel: str) -> str:
        out = []
        for i in range(start, end):
            kind, place, word = self.plan.word(i)
            if kind == channel:
                out.append(word if place == 0 else " " + word)
        return "".join(out)

    def text(self, start: int, end: int) -> str:
        """Content text of tokens [start, end): what the kimi_k3 parsers leave as content (nothing
        for the tools channel)."""
        return "" if self.tool_call is not None else self._channel(start, end, "content")

    def reasoning(self, start: int, end: int) -> str:
        """Think-channel text of tokens [start, end)."""
        return "" if self.tool_call is not None else self._channel(start, end, "reasoning")

    def word(self, i: int) -> str:
        return self.markup[i] if self.tool_call is not None else self.plan.word(i)[2]

    def ids(self, start: int, end: int) -> list[int]:
        return [token_id(self.word(i)) for i in range(start, end)]

    def raw(self, start: int, end: int, skip_special: bool = True) -> str:
        """The generated text as /v1/completions returns it: every token, special ones only when
        skip_special_tokens is false; no space next to a special token."""
        if self.tool_call is not None:
            return "".join(self.markup[start:end])
        out = []
        prev = self.word(start - 1) if start else None
        for i in range(start, end):
            word = self.word(i)
            if special(word) and skip_special:
                prev = word
                continue
            spaced = (self.plan.lead if prev is None else not special(prev)) and not special(word)
            out.append(" " + word if spaced else word)
            prev = word
        return "".join(out)


CORRUPT_WORD = "<k3sim:corrupt-kv>"
"""Every token of an answer decoded from KV blocks that were no longer the request's (a second read
of one set of kv_transfer_params, or a read after the prefill's lease expired). The real engine
produces plausible but wrong text there and reports nothing; the simulator makes it unmistakable."""


@dataclass(frozen=True)
class CorruptAnswer(Answer):
    """The answer of a decode whose KV was not the prompt's: CORRUPT_WORD per token, never a tool call."""

    def text(self, start: int, end: int) -> str:
        return "".join(("" if i == 0 else " ") + CORRUPT_WORD for i in range(start, end))

    def reasoning(self, start: int, end: int) -> str:
        return ""

    def word(self, i: int) -> str:
        return CORRUPT_WORD

    def raw(self, start: int, end: int, skip_special: bool = True) -> str:
        return self.text(start, end)


def corrupted(answer: Answer) -> Answer:
    return CorruptAnswer(seed=answer.seed, natural_length=answer.natural_length)


def _value(schema: dict[str, Any], word: str) -> tuple[str, Any]:
    kind = schema.get("type", "string")
    if "enum" in schema and schema["enum"]:
        return ("string" if isinstance(schema["enum"][0], str) else "number"), schema["enum"][0]
    return {"integer": ("integer", 1), "number": ("number", 1), "boolean": ("boolean", True),
            "array": ("array", []), "object": ("object", {})}.get(str(kind), ("string", word))


def _tool_arguments(function: dict[str, Any], word: str) -> tuple[dict[str, Any], list[str]]:
    params = function.get("parameters") or {}
    props = params.get("properties") or {}
    keys = [k for k in (params.get("required") or list(props)) if k in props] or list(props)[:1]
    args: dict[str, Any] = {}
    markup: list[str] = []
    for key in keys:
        kind, value = _value(props[key] if isinstance(props[key], dict) else {}, word)
        args[key] = value
        text = value if kind == "string" else json.dumps(value)
        markup += ["<|open|>", f'argument key="{key}" type="{kind}"', "<|sep|>", str(text),
                   "<|close|>", "argument", "<|sep|>"]
    return args, markup


def _chosen_tool(tools: list[Any], tool_choice: Any) -> dict[str, Any] | None:
    functions = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    if isinstance(tool_choice, dict):
        wanted = (tool_choice.get("function") or {}).get("name")
        return next((f for f in functions if f.get("name") == wanted), None)
    return functions[0] if functions else None


def chat_answer(messages: list[dict[str, Any]], tools: Any, tool_choice: Any, plain: Answer) -> Answer:
    """A tool call when the request offers tools and the last message is not a tool's result, else
    `plain` (the answer the context gives)."""
    last = messages[-1] if messages else {}
    if not tools or tool_choice == "none" or last.get("role") == "tool":
        return plain
    function = _chosen_tool(tools, tool_choice)
    if function is None or not function.get("name"):
        return plain
    user: dict[str, Any] = next((m for m in reversed(messages) if m.get("role") == "user"), {})
    words = _content_words(user.get("content"), MediaPolicy()) or ["value"]
    word = words[-1].strip(".,;:!?\"'") or "value"
    args, arg_markup = _tool_arguments(function, word)
    markup = ["<|open|>", "tools", "<|sep|>", "<|open|>", f'call tool="{function["name"]}" index="0"', "<|sep|>",
              *arg_markup, "<|close|>", "call", "<|sep|>"]
    closed_at = len(markup)
    markup += ["<|close|>", "tools", "<|sep|>"]
    call = ToolCall(id=f"chatcmpl-tool-{uuid.uuid4().hex}", name=str(function["name"]),
                    arguments=json.dumps(args, ensure_ascii=False))
    return Answer(seed=plain.seed, natural_length=len(markup), markup=tuple(markup), tool_call=call,
                  call_closed_at=closed_at)
