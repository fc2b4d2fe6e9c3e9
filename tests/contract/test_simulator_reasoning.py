"""The simulator's chat split of a thinking answer is what vLLM 0.33.0's kimi_k3 reasoning parser
makes of the same tokens (tests/contract/vllm_reasoning.py in the cached vLLM venv): reasoning up to
`<|close|>think<|sep|>`, content after, whole and streamed chunk by chunk, also for an answer that
begins mid-way (the continuation a router sends after a migration, which never starts inside a
marker). kimik3-router's own parser is
held to the simulator's split end to end (router/tests/simulator.rs), so it agrees with vLLM's on
these streams too (docs/migration.md)."""

from __future__ import annotations

import json
import subprocess

from kimik3_simulator.text import SENTENCE, THINK_CLOSE, THINK_OPEN, THOUGHT, Answer
from kimik3_simulator.vocab import token_id

from .test_vllm_contract import ROOT, vllm_python

PROMPT = [token_id(w) for w in "think about the weather in Paris".split()] + [token_id(w) for w in THINK_OPEN]
VOCAB = {w: token_id(w) for w in (*SENTENCE, *THOUGHT, *THINK_OPEN, *THINK_CLOSE, "response", "message")}


def _case(name: str, answer: Answer, step: int) -> tuple[dict[str, object], tuple[str, str]]:
    n = answer.natural_length
    cuts = list(range(0, n, step)) + [n]
    pieces = [answer.raw(a, b, skip_special=False) for a, b in zip(cuts, cuts[1:], strict=False)]
    ids = [answer.ids(a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
    # The parser is told the answer thinks when it starts inside the think channel (the router's
    # state for a continuation: where the last text it showed was).
    case = {"name": name, "pieces": pieces, "ids": ids, "thinking": answer.plan.close > 0, "vocab": VOCAB}
    return case, (answer.reasoning(0, n), answer.text(0, n))


def test_the_simulators_think_channel_is_what_vllms_kimi_k3_parser_reads() -> None:
    whole = Answer.after(PROMPT, 20, 12)
    cases = {}
    for step in (1, 2, 5):  # one token per chunk, and DSpark-like chunks of several
        cases[f"whole-{step}"] = _case(f"whole-{step}", whole, step)
    # Resumed inside the thought, right before the close marker, right after it. A cut inside the
    # marker is never resumed there: the router rolls back the tokens the parser held (migrate.rs).
    for cut in (4, 12, 16):
        rest = Answer.after(PROMPT + whole.ids(0, cut), 20, 12)
        cases[f"resumed-{cut}"] = _case(f"resumed-{cut}", rest, 3)
    run = subprocess.run([str(vllm_python()), str(ROOT / "tests" / "contract" / "vllm_reasoning.py")],
                         input=json.dumps([c for c, _ in cases.values()]), capture_output=True, text=True,
                         timeout=600, env={"PATH": "/usr/bin:/bin", "VLLM_TARGET_DEVICE": "cpu"})
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = json.loads(run.stdout)
    for name, (_, ours) in cases.items():
        assert tuple(theirs[name]["whole"]) == ours, name
        assert tuple(theirs[name]["streamed"]) == ours, name
    assert cases["whole-1"][1][0].split() == [THOUGHT[i % len(THOUGHT)] for i in range(12)]
