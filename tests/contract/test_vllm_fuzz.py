"""Fuzzed specs through vLLM 0.33.0's own parser, and the owned-flags list against that parser.

Every distinct command line (leader and worker) rendered from the accepted, plannable specs of
the fuzz corpus goes through vllm_check.py in one subprocess: it must parse and validate, its
VLLM_* variables must be known with valid values, and the user's extraArgs at its end must not
change any setting the operator's own options set (an alias, an abbreviation or a
`--json-flag.key=` spelling would). Separately, every spelling vLLM's parser has for a setting the
operator renders or owns must be caught by the extraArgs rule (owned_flags.owner_of), and no other
option may be.
"""

from __future__ import annotations

import json
import subprocess
from functools import lru_cache
from typing import Any

from kimik3_operator.api.owned_flags import OWNED_FLAGS, option_in, owner_of
from kimik3_operator.api.rust_frontend_flags import (
    RUST_FRONTEND_REFUSED,
    RUST_FRONTEND_VALUES,
    rust_frontend_refused_value,
)
from kimik3_operator.render import Owner, render_children
from tests.fuzz.checks import containers
from tests.fuzz.corpus import CORPUS, planned

from .test_vllm_contract import ROOT, run_check, vllm_python
from .test_vllm_contract import cases as golden_cases


def _vllm_env(env: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in env if e["name"].startswith("VLLM_") and "value" in e}


@lru_cache(maxsize=1)
def fuzz_cases() -> tuple[dict[str, Any], ...]:
    """Distinct (argv, env) of every container the corpus renders, with where the user's extraArgs start."""
    seen: dict[str, dict[str, Any]] = {}
    for item in planned(CORPUS):
        extra = len(item.cr.spec.engine.extra_args)
        owner = Owner(name=item.cr.metadata.name, namespace="fuzz", uid="fuzz")
        for child in render_children(owner, item.plan):
            if child["kind"] != "LeaderWorkerSet":
                continue
            for template, c in containers(child):
                case = {"argv": c["command"], "env": _vllm_env(c["env"]),
                        "operator_args": len(c["command"]) - extra}
                key = json.dumps(case, sort_keys=True)
                seen.setdefault(key, {"name": f"fuzz-{item.index}/{child['metadata']['name']}/{template}", **case})
    return tuple(seen.values())


def test_vllm_accepts_every_fuzzed_command_line() -> None:
    batch = list(fuzz_cases())
    verdicts = run_check(batch, timeout=900)
    failed = {name: v["errors"] for name, v in verdicts.items() if not v["ok"]}
    print(f"\nvLLM 0.33.0 parsed {len(batch)} distinct fuzzed command lines, "
          f"{sum(1 for c in batch if c['operator_args'] < len(c['argv']))} with extraArgs")
    assert len(verdicts) == len(batch) >= 100
    assert not failed, json.dumps(dict(list(failed.items())[:10]), indent=1)


@lru_cache(maxsize=1)
def vllm_options() -> dict[str, str]:
    run = subprocess.run([str(vllm_python()), str(ROOT / "tests" / "contract" / "vllm_options.py")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_owned_flags_cover_every_spelling_vllm_accepts() -> None:
    options = vllm_options()
    rendered = {a.split("=", 1)[0] for c in [*golden_cases(), *fuzz_cases()]
                for a in c["argv"][2:c.get("operator_args")] if a.startswith("-")}
    assert rendered <= set(options), f"rendered flags vLLM does not know: {sorted(rendered - set(options))}"
    unknown = sorted(set(OWNED_FLAGS) - set(options))
    assert not unknown, f"owned flags vLLM does not know: {unknown}"
    owned_dests = {options[f] for f in rendered | set(OWNED_FLAGS)}
    loose = sorted(o for o, dest in options.items() if dest in owned_dests and owner_of(o) is None)
    assert not loose, f"vLLM spellings of settings the operator owns that extraArgs may still use: {loose}"
    over = sorted(o for o, dest in options.items() if dest not in owned_dests and owner_of(o) is not None)
    assert not over, f"vLLM options the extraArgs rule refuses though the operator does not own them: {over}"


def test_rust_frontend_refusals_are_what_vllm_rs_exits_on() -> None:
    """RUST_FRONTEND_REFUSED is every spelling of every setting the wheel's vllm-rs exits on
    (probed by vllm_rs_refused.py), less the settings the operator owns; no other option is caught."""
    run = subprocess.run([str(vllm_python()), str(ROOT / "tests" / "contract" / "vllm_rs_refused.py")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    probed: dict[str, list[str]] = json.loads(run.stdout)
    assert "max_log_len" in probed and "max_num_seqs" not in probed, sorted(probed)
    options = vllm_options()
    owned_dests = {dest for o, dest in options.items() if owner_of(o) is not None}
    expected = {s for dest, spellings in probed.items() if dest not in owned_dests for s in spellings}
    assert set(RUST_FRONTEND_REFUSED) == expected, (
        f"missing: {sorted(expected - set(RUST_FRONTEND_REFUSED))}, "
        f"not refused: {sorted(set(RUST_FRONTEND_REFUSED) - expected)}")
    over = sorted(o for o, dest in options.items()
                  if dest not in probed and dest not in owned_dests and option_in(o, RUST_FRONTEND_REFUSED))
    assert not over, f"vLLM options the Rust-frontend rule refuses though vllm-rs takes them: {over}"


OTHER_VALUES = {"--generation-config": ("/models/k3", "local"), "--tokenizer-mode": ("mistral", "cohere", "slow")}
"""Values vLLM's parser takes that are not in RUST_FRONTEND_VALUES (a folder, other tokenizer modes)."""


def test_values_the_rust_frontend_takes_are_what_vllm_rs_takes() -> None:
    """Every value RUST_FRONTEND_VALUES lists starts vllm-rs, and others vLLM accepts make it exit,
    on a golden Rust-frontend leader's command line (vllm_check.py runs vllm-rs as vllm serve would)."""
    leader = next(c for c in golden_cases() if c["name"].endswith("/leader") and
                  c["env"].get("VLLM_USE_RUST_FRONTEND") == "1")
    batch, expected = [], {}
    for option, values in RUST_FRONTEND_VALUES.items():
        for value in (*values, *OTHER_VALUES[option]):
            name = f"{option}={value}"
            batch.append({**leader, "name": name, "argv": [*leader["argv"], option, value]})
            expected[name] = value in values
            assert (rust_frontend_refused_value([option, value]) is None) == expected[name], name
    verdicts = run_check(batch)
    parsed = {n: v for n, v in verdicts.items() if not any(e.startswith("parse") for e in v["errors"])}
    assert {n: v["ok"] for n, v in parsed.items()} == {n: expected[n] for n in parsed}, verdicts
    assert sum(expected[n] is False for n in parsed) >= 3, f"too few refused values reached vllm-rs: {verdicts}"
