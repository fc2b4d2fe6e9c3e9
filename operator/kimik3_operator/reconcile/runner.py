"""Run the operator: kopf's loop with our handlers registered."""

from __future__ import annotations

import logging

import kopf

from . import handlers  # noqa: F401 - registers the handlers with kopf's default registry


def run_operator(*, namespace: str | None, liveness: str | None, standalone: bool = True) -> None:
    kopf.configure(verbose=False)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # liveness probes every few seconds
    kopf.run(
        standalone=standalone,
        clusterwide=namespace is None,
        namespaces=[namespace] if namespace else (),
        liveness_endpoint=liveness,
    )
