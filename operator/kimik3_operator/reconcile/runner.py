"""Run the operator: kopf's loop with our handlers registered."""

from __future__ import annotations

import logging

import kopf

from . import handlers  # noqa: F401 - registers the handlers with kopf's default registry
from .settings import OperatorConfig


def run_operator(config: OperatorConfig, *, liveness: str | None, log_level: str = "INFO",
                 standalone: bool = True) -> None:
    kopf.configure(verbose=log_level == "DEBUG")
    logging.getLogger().setLevel(log_level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # liveness probes every few seconds
    kopf.run(
        standalone=standalone,
        clusterwide=not config.namespaces,
        namespaces=config.namespaces,
        liveness_endpoint=liveness,
        memo=kopf.Memo(config=config),
    )
