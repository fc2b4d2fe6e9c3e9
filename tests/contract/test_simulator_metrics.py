"""The simulator's /metrics against what vLLM 0.33.0's own stat logger registers, for every golden leader.

For each role of each golden scenario, the simulator is configured from the leader command the
operator renders; its exposition (parsed with prometheus_client's parser, as a scraper reads it)
must have exactly the families vLLM registers for an engine with the same KV role, speculative
tokens, data-parallel engines and max_model_len: same names, types, sample names, label names,
engine label values and histogram buckets. vLLM's side comes from tests/contract/vllm_metrics.py
in the cached vLLM venv (one subprocess for all cases). The flags the simulator reads are checked
to be `vllm serve` options with the same meaning.
"""

from __future__ import annotations

import json
import subprocess
from functools import lru_cache
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kimik3_operator.render.report import plan_report
from kimik3_simulator.cmdline import SIMULATOR_OPTIONS, parse_serve
from kimik3_simulator.config import engine_config, engine_metrics
from kimik3_simulator.settings import SimSettings
from tests.golden.scenarios import SCENARIOS
from tests.golden.test_golden import plan_scenario

from .test_vllm_contract import ROOT, vllm_python

Families = dict[str, dict[str, Any]]

REQUIRED = (
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds", "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc", "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits", "vllm:request_success",
)
"""What dashboards and the autoscaler read: must be there whatever the role."""
NIXL = ("vllm:nixl_xfer_time_seconds", "vllm:nixl_bytes_transferred", "vllm:nixl_num_failed_transfers")
SPEC = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


@lru_cache(maxsize=1)
def leaders() -> tuple[tuple[str, list[str], str], ...]:
    """(case name, leader command, GPU product) of every role of every golden scenario."""
    out = []
    for scenario, body in sorted(SCENARIOS.items()):
        for pool in plan_report(plan_scenario(body))["pools"]:
            for role in pool["roles"]:
                out.append((f"{scenario}/{pool['name']}/{role['role']}", role["command"], pool["gpuProduct"]))
    return tuple(out)


def families(exposition: str) -> Families:
    """The vllm: families of a /metrics text as a scraper parses it."""
    out: Families = {}
    for family in text_string_to_metric_families(exposition):
        if not family.name.startswith("vllm:"):
            continue
        out[family.name] = {
            "type": family.type,
            "samples": sorted({s.name for s in family.samples}),
            "labels": sorted({k for s in family.samples for k in s.labels}),
            "buckets": sorted({float(s.labels["le"]) for s in family.samples if "le" in s.labels}),
            "engines": sorted({s.labels["engine"] for s in family.samples if "engine" in s.labels}),
        }
    return out


def simulator_side(command: list[str], gpu: str) -> tuple[Families, dict[str, Any]]:
    """The simulator's families for this leader command, and the engine facts vLLM's side is built from."""
    config = engine_config(parse_serve(command), SimSettings(gpu_product=gpu))
    engine = {"kv_role": config.serve.kv_role, "spec_tokens": config.spec_tokens, "engines": config.ranks,
              "max_model_len": config.max_model_len, "model_name": config.serve.served_model_name}
    return families(generate_latest(engine_metrics(config).registry).decode()), engine


@lru_cache(maxsize=1)
def both_sides() -> dict[str, tuple[Families, Families]]:
    ours = {name: simulator_side(command, gpu) for name, command, gpu in leaders()}
    run = subprocess.run([str(vllm_python()), str(ROOT / "tests" / "contract" / "vllm_metrics.py")],
                         input=json.dumps([{"name": n, **engine} for n, (_, engine) in ours.items()]),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"vllm_metrics.py failed:\n{run.stderr[-3000:]}"
    theirs = json.loads(run.stdout)
    return {name: (fams, families(theirs[name])) for name, (fams, _) in ours.items()}


def differences(ours: Families, theirs: Families) -> list[str]:
    out = [f"{name}: vLLM has no such family" for name in sorted(set(ours) - set(theirs))]
    out += [f"{name}: vLLM exports it, the simulator does not" for name in sorted(set(theirs) - set(ours))]
    for name in sorted(set(ours) & set(theirs)):
        for key in ("type", "samples", "labels", "buckets", "engines"):
            if ours[name][key] != theirs[name][key]:
                out.append(f"{name}: {key} {ours[name][key]} != vLLM's {theirs[name][key]}")
    return out


@pytest.mark.parametrize("case", [name for name, _, _ in leaders()])
def test_simulator_exports_what_vllm_exports(case: str) -> None:
    ours, theirs = both_sides()[case]
    assert not differences(ours, theirs), "\n".join(differences(ours, theirs))
    assert set(REQUIRED) <= set(ours)
    kv_role = parse_serve(dict((n, c) for n, c, _ in leaders())[case]).kv_role
    assert set(NIXL) <= set(ours) if kv_role else not set(NIXL) & set(ours)


def test_the_cases_cover_every_kind_of_engine() -> None:
    commands = [parse_serve(c) for _, c, _ in leaders()]
    assert {c.kv_role for c in commands} == {None, "kv_producer", "kv_consumer"}
    assert any(c.speculative_tokens for c in commands) and any(c.data > 1 for c in commands)
    ours, _ = both_sides()[next(n for n, c, _ in leaders() if parse_serve(c).speculative_tokens)]
    assert set(SPEC) <= set(ours)


def test_a_misspelt_or_relabelled_family_is_caught() -> None:
    ours, theirs = next(iter(both_sides().values()))
    misspelt = {("vllm:prompt_token" if n == "vllm:prompt_tokens" else n): f for n, f in ours.items()}
    found = differences(misspelt, theirs)
    assert "vllm:prompt_token: vLLM has no such family" in found
    assert "vllm:prompt_tokens: vLLM exports it, the simulator does not" in found
    relabelled = {**ours, "vllm:kv_cache_usage_perc": {**ours["vllm:kv_cache_usage_perc"],
                                                       "labels": ["engine", "model"]}}
    assert any(d.startswith("vllm:kv_cache_usage_perc: labels") for d in differences(relabelled, theirs))


@lru_cache(maxsize=1)
def vllm_options() -> dict[str, str]:
    run = subprocess.run([str(vllm_python()), str(ROOT / "tests" / "contract" / "vllm_options.py")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"vllm_options.py failed:\n{run.stderr[-3000:]}"
    return json.loads(run.stdout)


def test_every_flag_the_simulator_reads_is_a_vllm_serve_option() -> None:
    options = vllm_options()
    wrong = {opt: (dest, options.get(opt)) for opt, dest in SIMULATOR_OPTIONS.items() if options.get(opt) != dest}
    assert not wrong, f"option: (simulator dest, vLLM dest): {wrong}"
