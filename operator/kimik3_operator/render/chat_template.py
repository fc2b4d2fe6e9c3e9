"""engine.chatTemplate: the ConfigMap key mounted read-only into leader pods, given to vLLM as
--chat-template (vllm/entrypoints/common/cli_args.py:86-88; the Rust frontend takes the same
setting, SharedRuntimeArgs.chat_template). Headless workers render no chat, so they get neither.
Whether the template compiles is planner/chat_template.py's question, asked before any engine
starts on it."""

from __future__ import annotations

from typing import Any

from ..planner import EngineSettings

VOLUME = "chat-template"
DIRECTORY = "/etc/kimik3/chat-template"
FILE = "chat_template.jinja"
PATH = f"{DIRECTORY}/{FILE}"


def args(engine: EngineSettings, *, worker: bool) -> list[str]:
    return ["--chat-template", PATH] if engine.chat_template and not worker else []


def volumes(engine: EngineSettings, *, worker: bool) -> list[dict[str, Any]]:
    if not engine.chat_template or worker:
        return []
    name, key = engine.chat_template
    return [{"name": VOLUME, "configMap": {"name": name, "items": [{"key": key, "path": FILE}]}}]


def mounts(engine: EngineSettings, *, worker: bool) -> list[dict[str, Any]]:
    return [{"name": VOLUME, "mountPath": DIRECTORY, "readOnly": True}] if volumes(engine, worker=worker) else []
