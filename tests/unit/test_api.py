"""The API models: examples parse, every cross-field rule rejects its negative example, the
generated CRD is structural and equals the committed one."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.crd import CRD_FILENAME, crd_yaml, custom_resource_definition
from tests.support.cases import INVALID, ROOT, all_rules, base_deployment, load_examples


@pytest.mark.parametrize(("name", "body"), load_examples(), ids=[n for n, _ in load_examples()])
def test_examples_parse(name: str, body: dict[str, Any]) -> None:
    KimiK3Deployment.model_validate(body)


def test_base_deployment_is_valid() -> None:
    KimiK3Deployment.model_validate(base_deployment())


def test_every_rule_has_a_negative_example() -> None:
    messages = {m for _, m in all_rules()}
    assert messages == set(INVALID), "each Rule needs exactly one negative example in tests/support/cases.py"


@pytest.mark.parametrize("message", sorted(INVALID))
def test_rule_rejects_its_negative_example(message: str) -> None:
    with pytest.raises(ValidationError) as info:
        KimiK3Deployment.model_validate(INVALID[message]())
    assert message in str(info.value)


def test_pool_names_are_unique() -> None:
    body = base_deployment()
    body["spec"]["pools"].append(dict(body["spec"]["pools"][0]))
    with pytest.raises(ValidationError, match="duplicate name: gb300"):
        KimiK3Deployment.model_validate(body)


def test_a_duplicate_name_is_reported_whatever_else_is_wrong_with_the_items() -> None:
    """The API server checks list-map keys before (and whatever) the items' own rules say; pydantic
    must refuse the same body for the same reason (found by the fuzzer: two pools named alike, each
    breaking a CEL rule, were a CEL refusal in pydantic and a duplicate key at the API server)."""
    body = base_deployment()
    body["spec"]["pools"][0].update(interconnect="xGMI", gpu={"product": "B300"})
    body["spec"]["pools"].append(copy.deepcopy(body["spec"]["pools"][0]))
    with pytest.raises(ValidationError) as info:
        KimiK3Deployment.model_validate(body)
    assert [e["msg"] for e in info.value.errors()] == ["Value error, duplicate name: gb300"]


def test_defaults_resolve_to_visible_values() -> None:
    spec = KimiK3Deployment.model_validate(base_deployment()).spec
    assert spec.engine.prefix_caching.enabled is True
    assert spec.engine.prefix_caching.retention.policy == "Selective"
    assert spec.engine.rust_frontend is True
    assert spec.pools[0].effective_mode == "Aggregated"
    assert spec.model.served_name == "kimi-k3"


def test_committed_crd_equals_generation() -> None:
    committed = (ROOT / "crds" / CRD_FILENAME).read_text()
    assert committed == crd_yaml(), "crds/ is stale: run `kimik3 crd`"


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key in ("properties",):
            for name, sub in (node.get(key) or {}).items():
                yield from _walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


def _schema() -> dict[str, Any]:
    return custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_crd_schema_is_structural() -> None:
    for path, node in _walk(_schema()):
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        assert "title" not in node, path
        for flag in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(flag, False), bool), f"{path}.{flag} must be a boolean in OpenAPI v3"


def test_crd_bounds_every_string_and_list_for_cel_cost() -> None:
    spec = _schema()["properties"]["spec"]
    for path, node in _walk(spec):
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, f"spec{path} has no maxLength"
        if node.get("type") == "array":
            assert "maxItems" in node, f"spec{path} has no maxItems"
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, f"spec{path} has no maxProperties"


def test_crd_documents_every_field_for_kubectl_explain() -> None:
    """Spec, status and the envelope: `kubectl explain kimik3deployment.status.pools.roles` and the
    like print a description for every field (attribute docstrings, api/spec.py and api/status.py)."""
    # List items and map values are documented by their list or map field.
    # metadata is the exception the API server makes: only name/generateName rules, no description
    # ("metadata is implicitly specified"); kubectl explain shows ObjectMeta's own for it.
    undocumented = [p for p, n in _walk(_schema()) if p and p != ".metadata" and "description" not in n
                    and not p.endswith("[]") and not p.endswith("{}")]
    assert undocumented == []
    assert {"spec", "status"} <= set(_schema()["properties"])


def test_crd_timestamps_are_date_time() -> None:
    stamps = {p: n.get("format") for p, n in _walk(_schema()["properties"]["status"])
              if p.endswith(("Time", "Since"))}
    assert stamps == {".conditions[].lastTransitionTime": "date-time",
                      ".pools[].roles[].autoscaling.lastScaleTime": "date-time",
                      ".pools[].roles[].autoscaling.breachSince": "date-time",
                      ".pools[].roles[].autoscaling.calmSince": "date-time"}


def test_status_spells_all2all_as_the_spec_does() -> None:
    roles = _schema()["properties"]["status"]["properties"]["pools"]["items"]["properties"]["roles"]
    spec_backends = _schema()["properties"]["spec"]["properties"]["pools"]["items"]["properties"]["backends"]
    assert "all2all" in spec_backends["properties"]
    assert "all2allBackend" in roles["items"]["properties"]


def test_crd_lists_of_named_things_are_list_maps() -> None:
    pools = _schema()["properties"]["spec"]["properties"]["pools"]
    assert pools["x-kubernetes-list-type"] == "map"
    assert pools["x-kubernetes-list-map-keys"] == ["name"]
    conditions = _schema()["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_crd_has_printer_columns_and_status_subresource() -> None:
    version = custom_resource_definition()["spec"]["versions"][0]
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Phase", "Reason", "Ready", "GPUs", "Endpoint", "Age"]
    assert version["subresources"] == {"status": {}}
    assert custom_resource_definition()["spec"]["names"]["shortNames"] == ["k3"]


def test_crd_is_valid_yaml_with_header() -> None:
    text = crd_yaml()
    assert text.startswith("# GENERATED")
    assert yaml.safe_load(text)["kind"] == "CustomResourceDefinition"


def test_committed_chart_crd_equals_generation() -> None:
    from kimik3_operator.api.crd import CHART_CRD_PATH, chart_crd_template

    committed = (ROOT / "charts" / "kimik3-operator" / CHART_CRD_PATH).read_text()
    assert committed == chart_crd_template(), "the chart's CRD is stale: run `kimik3 crd`"
    assert "{{- if .Values.crds.enabled }}" in committed and "helm.sh/resource-policy: keep" in committed


def test_chart_readme_documents_every_value() -> None:
    import re

    values = (ROOT / "charts" / "kimik3-operator" / "values.yaml").read_text()
    readme = (ROOT / "charts" / "kimik3-operator" / "README.md").read_text()
    keys = re.findall(r"^\s*# ([a-zA-Z0-9_.]+) -- ", values, re.M)
    assert keys and all(f"| `{k}` |" in readme for k in keys)


def test_quantities_compare_as_the_api_server_reads_them() -> None:
    from kimik3_operator.api.quantity import quantity

    assert quantity("1Gi") > quantity("1000Mi") > quantity("1G") > quantity("999M")
    assert quantity("1500m") == quantity("1.5") and quantity("2k") == quantity("2000")
    for bad in ("1K", "1e3", "-1", "1.", "Gi"):
        with pytest.raises(ValueError):
            quantity(bad)
