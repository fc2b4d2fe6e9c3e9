"""Pydantic refuses exactly what the API server refuses: the minimal disagreements the fuzz found
(tests/fuzz, e2e/tests/test_fuzz.py), each checked against the CRD schema too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kimik3_operator.api.crd import openapi_schema
from kimik3_operator.api.owned_flags import owned_flag
from kimik3_operator.api.rust_frontend_flags import rust_frontend_refuses
from tests.fuzz.openapi import validate
from tests.fuzz.verdict import pydantic_verdict
from tests.support.cases import base_deployment


def _pool(d: dict[str, Any]) -> dict[str, Any]:
    return d["spec"]["pools"][0]


def _agg(d: dict[str, Any]) -> dict[str, Any]:
    return _pool(d)["aggregated"]


# (what, edit, verdict of both the API server and pydantic)
CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("all2all is the wire name (docs/architecture.md), not to_camel's all2All",
     lambda d: _pool(d).update(backends={"all2all": "naive"}), "accepted"),
    ("all2All is an unknown field", lambda d: _pool(d).update(backends={"all2All": "naive"}), "schema"),
    ("snake_case field names are unknown fields", lambda d: _pool(d).update(node_selector={}), "schema"),
    ("a null field is pruned", lambda d: _agg(d)["parallelism"].update(pipeline=None), "accepted"),
    ("a null object is pruned", lambda d: d["spec"].update(engine=None), "accepted"),
    ("a null map value is pruned", lambda d: _pool(d)["nodeSelector"].update(extra=None), "accepted"),
    ("a null list item is not", lambda d: d["spec"].update(engine={"extraArgs": [None]}), "schema"),
    ("no string for an integer", lambda d: _agg(d).update(replicas="1"), "schema"),
    ("no boolean for an integer", lambda d: _agg(d).update(replicas=True), "schema"),
    ("no integer for a boolean", lambda d: _agg(d)["parallelism"].update(expert=1), "schema"),
    ("no string for a number", lambda d: d["spec"].update(workload={"requestsPerSecond": "2"}), "schema"),
    ("an integer for a number", lambda d: d["spec"].update(workload={"requestsPerSecond": 2}), "accepted"),
    ("8.0 is an integer", lambda d: _agg(d).update(replicas=2.0), "accepted"),
    ("but not where CEL reads it", lambda d: _agg(d)["parallelism"].update(tensor=8.0), "schema"),
    ("1.5 is not an integer", lambda d: _agg(d).update(replicas=1.5), "schema"),
    ("tolerationSeconds fits a float64 bound", lambda d: _pool(d).update(tolerations=[{"tolerationSeconds": 1 << 60}]),
     "schema"),
    ("a vertical tab in a URI is whitespace to both", lambda d: d["spec"]["model"].update(uri="hf://a\x0bb"), "schema"),
    ("a no-break space is not ASCII whitespace",
     lambda d: d["spec"]["model"].update(uri="s3://models/kimi\u00a0k3"), "accepted"),
]


@pytest.mark.parametrize(("what", "edit", "expected"), CASES, ids=[c[0] for c in CASES])
def test_pydantic_and_the_crd_schema_agree(what: str, edit: Callable[[dict[str, Any]], None], expected: str) -> None:
    body = base_deployment()
    edit(body)
    verdict, _ = pydantic_verdict(body)
    assert verdict.category == expected, verdict.detail
    assert bool(validate(body, openapi_schema())) == (expected == "schema")


@pytest.mark.parametrize("arg", [
    "--tensor_parallel_size=4", "--tensor-par", "-n4", "-e", "--speculative-config.method=mtp",
    "--kv-transfer-config.kv_role=kv_both", "--device-memory-utilization=0.9", "--disable-expert-parallel",
    "--mamba-ssm-cache-dtype=bfloat16", "--no-fail-on-environ-validation", "--disable-auto-tool-choice",
    "--language-model-only", "--mm-encoder-tp-mode=weights",
])
def test_owned_flags_are_owned_in_every_spelling_vllm_reads(arg: str) -> None:
    assert owned_flag(["--seed=1", arg]) is not None
    body = base_deployment()
    body["spec"]["engine"] = {"extraArgs": [arg]}
    assert pydantic_verdict(body)[0].rules == {"extraArgs sets a flag the operator owns"}


@pytest.mark.parametrize("arg", ["--seed=1", "-dpb", "--max-logprobs", "64", "-1", "--enforce-eager"])
def test_other_arguments_are_left_alone(arg: str) -> None:
    assert owned_flag([arg]) is None


@pytest.mark.parametrize("args", [["--max-log-len=100"], ["--seed=1", "--uvicorn_log_level", "warning"],
                                  ["--enable-log-outputs"], ["--hf-tok=x"], ["--config=/etc/k3.yaml"]])
def test_options_the_rust_frontend_refuses_need_the_python_frontend(args: list[str]) -> None:
    body = base_deployment()
    body["spec"]["engine"] = {"extraArgs": args}
    verdict = pydantic_verdict(body)[0]
    assert len(verdict.rules) == 1 and "Rust frontend" in next(iter(verdict.rules)), verdict.detail
    body["spec"]["engine"]["rustFrontend"] = False
    assert pydantic_verdict(body)[0].category == "accepted"


@pytest.mark.parametrize("arg", ["--seed=1", "--max-logprobs=5", "--enable-log-requests", "--tokenizer-mode=auto",
                                 "--disable-log-stats", "--enforce-eager"])
def test_options_the_rust_frontend_takes_are_left_alone(arg: str) -> None:
    assert rust_frontend_refuses([arg]) is None
