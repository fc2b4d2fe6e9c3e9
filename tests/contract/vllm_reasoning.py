#!/usr/bin/env python3
"""vLLM 0.33.0's kimi_k3 reasoning parser over given streams, offline (run with the python of the
venv scripts/vllm-venv.sh makes; never imported by the project's venv, which has no vllm).

Input (stdin): a JSON list of {"name": str, "pieces": [str], "ids": [[int]], "thinking": bool}: a
chat answer's raw text per streamed chunk (special tokens kept, as the parser's adjust_request asks)
and each chunk's token ids. The tokenizer stands in for K3's where the parser needs one: it encodes
a marker such as `<|close|>think<|sep|>` as its three tokens, each id the id the simulator gives
that word (vocab.py's function, given as {"word": id} in "vocab"). Output (stdout): name ->
{"whole": [reasoning, content] from extract_reasoning, "streamed": the same joined from
extract_reasoning_streaming chunk by chunk}."""

from __future__ import annotations

import json
import re
import sys
from types import SimpleNamespace
from typing import Any

SPECIAL = re.compile(r"(<\|[a-z_]+\|>)")


class Tokenizer:
    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        words = [w for part in SPECIAL.split(text) for w in ([part] if SPECIAL.fullmatch(part) else part.split())]
        return [self.vocab[w] for w in words]

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


def main() -> int:
    from vllm.reasoning.kimi_k3_reasoning_parser import KimiK3ReasoningParser

    cases = json.load(sys.stdin)
    out: dict[str, Any] = {}
    for case in cases:
        tok = Tokenizer(case["vocab"])
        kwargs = {"chat_template_kwargs": {"thinking": case["thinking"]}}
        request = SimpleNamespace(tools=None, tool_choice="none")
        whole = KimiK3ReasoningParser(tok, **kwargs).extract_reasoning("".join(case["pieces"]), request)
        parser = KimiK3ReasoningParser(tok, **kwargs)
        previous, previous_ids, reasoning, content = "", [], "", ""
        for piece, ids in zip(case["pieces"], case["ids"], strict=True):
            delta = parser.extract_reasoning_streaming(previous, previous + piece, piece, previous_ids,
                                                       previous_ids + ids, ids)
            previous, previous_ids = previous + piece, previous_ids + ids
            if delta is not None:
                reasoning += delta.reasoning or ""
                content += delta.content or ""
        out[case["name"]] = {"whole": [whole[0] or "", whole[1] or ""], "streamed": [reasoning, content]}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
