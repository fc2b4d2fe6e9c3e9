"""Is a chat template one vLLM 0.33.0 can compile? Checked before 1.5 TB engines crash-loop on it.

vLLM renders chat templates through transformers' apply_chat_template, which compiles them in a
`jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[AssistantTracker, jinja2.ext.loopcontrols])` (transformers 5.20.2, the version vLLM
0.33.0's image carries: utils/chat_template_utils.py:528-602); vLLM parses templates in the same
environment to find their variables (vllm/renderers/hf.py:757-775). AssistantTracker adds one tag,
`{% generation %}...{% endgeneration %}`, so a template using it must compile here too. Only
compiling is checked: what a template does with a conversation shows when it is rendered. With
the Rust frontend (engine.rustFrontend, on by default) the leader renders with minijinja inside
vllm-rs, which reads Jinja2's syntax; a template that leans on Python string methods compiles here
and may still fail there, per request, not at start-up.
"""

from __future__ import annotations

from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox

MAX_BYTES = 1 << 20
"""A ConfigMap holds at most 1 MiB."""


class _GenerationTag(jinja2.ext.Extension):
    """Parses `{% generation %}` blocks the way transformers' AssistantTracker does (its body is
    rendered as is); compiling never calls it."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    return jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])


def template_error(text: str) -> str | None:
    """Why vLLM could not compile `text` (jinja's message and line), or None when it can."""
    if not text.strip():
        return "the chat template is empty"
    if len(text.encode()) > MAX_BYTES:
        return f"the chat template is larger than {MAX_BYTES} bytes"
    try:
        _environment().from_string(text)
    except jinja2.TemplateSyntaxError as exc:
        return f"line {exc.lineno}: {exc.message}"
    except jinja2.TemplateError as exc:
        return str(exc)
    return None


def problem(ref: tuple[str, str], text: str | None, missing: str | None = None) -> str | None:
    """The ChatTemplateInvalid message for engine.chatTemplate `ref` (ConfigMap, key) whose value
    is `text` (None: `missing` says what is not there), or None when engines may start on it."""
    name, key = ref
    if text is None:
        return f"engine.chatTemplate: {missing or f'key {key} in ConfigMap {name}'} not found"
    error = template_error(text)
    return f"engine.chatTemplate (ConfigMap {name}, key {key}) does not compile: {error}" if error else None
