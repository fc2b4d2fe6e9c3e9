"""The CRD on a real API server: examples are accepted, each CEL rule rejects its negative example
with its own message, and malformed fields are refused by the schema."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from e2e.harness.kube import apply, kubectl
from tests.support.cases import INVALID, base_deployment, load_examples

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def example_namespace(chart: str) -> str:
    # The examples name their own namespace; dry-run still needs it to exist.
    kubectl("apply", "-f", "-", input=yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": "inference"}}))
    return "inference"


@pytest.mark.parametrize(("name", "body"), load_examples(), ids=[n for n, _ in load_examples()])
def test_example_passes_server_dry_run(example_namespace: str, name: str, body: dict[str, Any]) -> None:
    result = apply(body, "--dry-run=server", check=False)
    assert result.returncode == 0, f"{name} rejected: {result.stderr}"


@pytest.mark.parametrize("message", sorted(INVALID))
def test_cel_rule_rejects_negative_example(namespace: str, message: str) -> None:
    body = INVALID[message]()
    body["metadata"]["namespace"] = namespace
    result = apply(body, "--dry-run=server", check=False)
    assert result.returncode != 0, f"accepted, but should fail with: {message}"
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda d: d["spec"]["pools"][0].update(gpu={"product": "A100"}), "Unsupported value: \"A100\""),
    (lambda d: d["spec"]["model"].update(uri="http://example.com/model"), "spec.model.uri"),
    (lambda d: d["spec"]["pools"][0].update(unknownField=1), "unknown field"),
    (lambda d: d["metadata"].update(name="9starts-with-digit"), "metadata.name"),
    (lambda d: d["spec"]["pools"].append(dict(d["spec"]["pools"][0])), "Duplicate value"),
])
def test_schema_rejects_malformed_fields(namespace: str, edit, needle: str) -> None:
    body = base_deployment(namespace=namespace)
    edit(body)
    result = apply(body, "--dry-run=server", check=False)
    assert result.returncode != 0 and needle in result.stderr, result.stderr
