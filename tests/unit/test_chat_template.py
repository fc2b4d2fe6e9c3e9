"""engine.chatTemplate: compiled as vLLM compiles it before any engine starts on it, mounted into
leader pods only, and a missing key or a broken template said precisely."""

from __future__ import annotations

import pytest

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.render import Owner, render_children
from tests.fuzz.checks import pod_specs
from tests.support.cases import base_deployment
from tests.support.nodes import gb300_rack

jinja = pytest.importorskip("jinja2", reason="jinja2 is an operator dependency now: rebuild the venv (scripts/venv.sh)")
from kimik3_operator.planner.chat_template import problem, template_error  # noqa: E402

VALID = [
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}",
    "{%- for m in messages -%}\n  {%- if m.role == 'assistant' -%}{% generation %}{{ m.content }}{% endgeneration %}"
    "{%- else -%}{{ m.content | tojson }}{%- endif -%}\n{%- endfor -%}",
    "{% for m in messages %}{% if loop.index > 3 %}{% break %}{% endif %}{{ m.content }}{% continue %}{% endfor %}",
    "{{ raise_exception('no system role') if messages[0].role == 'system' }}",
]
BROKEN = [
    ("{% for m in messages %}{{ m.content }}", 1, "endfor"),
    ("{% for m in messages %}\n{{ m.content }}\n{% endfo %}", 3, "endfo"),
    ("line one\n{{ messages | no_such_filter }}", 2, "no_such_filter"),
    ("{% if x %}\n\n\n{% else %}{% else %}{% endif %}", 4, ""),
    ("{{ x.", 1, ""),
    ("{% generation %}unclosed", 1, "endgeneration"),
]


@pytest.mark.parametrize("text", VALID)
def test_templates_vllm_compiles_pass(text: str) -> None:
    assert template_error(text) is None


@pytest.mark.parametrize(("text", "line", "word"), BROKEN)
def test_broken_templates_are_refused_with_jinjas_message_and_line(text: str, line: int, word: str) -> None:
    error = template_error(text)
    assert error is not None and error.startswith(f"line {line}: ") and word in error


def test_the_condition_message_names_what_is_missing_or_broken() -> None:
    ref = ("chat", "template.jinja")
    assert problem(ref, None, "ConfigMap chat") == "engine.chatTemplate: ConfigMap chat not found"
    assert "key template.jinja in ConfigMap chat" in (problem(ref, None) or "")
    message = problem(ref, "{% if %}")
    assert message is not None and message.startswith(
        "engine.chatTemplate (ConfigMap chat, key template.jinja) does not compile: line 1: ")
    assert problem(ref, VALID[0]) is None
    assert template_error("  \n") == "the chat template is empty"


def test_leaders_get_the_flag_and_the_read_only_key_workers_neither() -> None:
    body = base_deployment()
    body["spec"]["engine"] = {"chatTemplate": {"name": "chat", "key": "k3.jinja"}}
    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, gb300_rack()) for p in spec.pools})
    seen = set()
    for child in render_children(Owner(name="k3", namespace="ns", uid="u"), plan):
        if child["kind"] != "LeaderWorkerSet":
            continue
        multi = "leaderTemplate" in child["spec"]["leaderWorkerTemplate"]
        for template, pod in pod_specs(child):
            leader = template == "leaderTemplate" or not multi
            (c,) = pod["containers"]
            volumes = [v for v in pod["volumes"] if v["name"] == "chat-template"]
            assert ("--chat-template" in c["command"]) == leader == bool(volumes)
            if leader:
                path = c["command"][c["command"].index("--chat-template") + 1]
                (mount,) = [m for m in c["volumeMounts"] if m["name"] == "chat-template"]
                assert mount["readOnly"] and path.startswith(mount["mountPath"] + "/")
                assert volumes[0]["configMap"] == {"name": "chat", "items": [{"key": "k3.jinja",
                                                                              "path": path.rsplit("/", 1)[1]}]}
            seen.add(leader)
    assert seen == {True, False}  # a two-tray replica: a leader and a worker template
