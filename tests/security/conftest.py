"""A webhook server on 127.0.0.1 per test, with the limits the test names."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kimik3_operator.webhook import Limits

from .harness import RunningWebhook, client_context, make_certificate


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_certificate(tmp_path_factory.mktemp("webhook-tls"))


@pytest.fixture(scope="session")
def context(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    return client_context(certificate[0])


@pytest.fixture
def webhook(certificate: tuple[Path, Path]) -> Iterator[Callable[..., RunningWebhook]]:
    """Start a server: webhook(**limits) -> the running server (stopped after the test)."""
    started: list[RunningWebhook] = []

    def start(**limits: Any) -> RunningWebhook:
        server = RunningWebhook(certificate[0], certificate[1], Limits(**limits))
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
