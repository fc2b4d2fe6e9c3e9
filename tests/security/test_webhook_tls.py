"""The webhook's certificate on rotation (a mounted Secret that cert-manager or the operator's
keeper renewed): new connections get the new certificate within a reload period, open ones go on
with theirs, a certificate and key that do not match yet are not loaded, and a server started
before its files exist listens once they appear. And keep-alive: several reviews on one
connection, an idle connection closed after the header deadline."""

from __future__ import annotations

import http.client
import os
import shutil
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kimik3_operator.webhook import Limits

from .harness import HOST, RunningWebhook, closed_within, make_certificate, raw_tls, review_body

RELOAD = 0.2


@pytest.fixture
def two(tmp_path: Path) -> tuple[tuple[Path, Path], tuple[Path, Path]]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    return make_certificate(tmp_path / "a"), make_certificate(tmp_path / "b")


@pytest.fixture
def served(tmp_path: Path) -> tuple[Path, Path]:
    """Where the server reads its certificate (empty until a test puts one there)."""
    (tmp_path / "served").mkdir()
    return tmp_path / "served" / "tls.crt", tmp_path / "served" / "tls.key"


@pytest.fixture
def running() -> Iterator[Callable[..., RunningWebhook]]:
    started: list[RunningWebhook] = []

    def start(cert: Path, key: Path, **limits: float) -> RunningWebhook:
        started.append(RunningWebhook(cert, key, Limits(reload_seconds=RELOAD, **limits)))  # type: ignore[arg-type]
        return started[-1]

    yield start
    for server in started:
        server.shutdown()


def put(pair: tuple[Path, Path], served: tuple[Path, Path], which: tuple[bool, bool] = (True, True)) -> None:
    """Replace the served files (whole, as a Secret volume's link swap or the keeper does)."""
    for source, target, wanted in zip(pair, served, which, strict=True):
        if wanted:
            partial = target.with_name(f".{target.name}.partial")
            shutil.copyfile(source, partial)
            os.replace(partial, target)


def trusting(*certs: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs[0]))
    for cert in certs[1:]:
        context.load_verify_locations(cafile=str(cert))
    return context


def served_cert(port: int, context: ssl.SSLContext) -> bytes:
    with raw_tls(port, context) as sock:
        der = sock.getpeercert(binary_form=True)
    assert der is not None
    return der


def der(cert: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


def review_on(conn: http.client.HTTPSConnection) -> int:
    conn.request("POST", "/validate", body=review_body(), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    return response.status


def wait_for(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def test_a_rotated_certificate_is_served_to_new_connections_and_open_ones_go_on(
        two: tuple[tuple[Path, Path], tuple[Path, Path]], served: tuple[Path, Path],
        running: Callable[..., RunningWebhook]) -> None:
    (a, b), context = two, trusting(two[0][0], two[1][0])
    put(a, served)
    server = running(*served)
    assert served_cert(server.port, context) == der(a[0])
    conn = http.client.HTTPSConnection(HOST, server.port, context=context, timeout=5)
    try:
        assert review_on(conn) == 200
        put(b, served)
        assert wait_for(lambda: served_cert(server.port, context) == der(b[0]), 20 * RELOAD), "not reloaded"
        assert conn.sock is not None and conn.sock.getpeercert(binary_form=True) == der(a[0])
        assert review_on(conn) == 200, "the open connection, on the old certificate, goes on"
    finally:
        conn.close()


def test_a_certificate_without_its_key_yet_is_not_loaded(
        two: tuple[tuple[Path, Path], tuple[Path, Path]], served: tuple[Path, Path],
        running: Callable[..., RunningWebhook]) -> None:
    (a, b), context = two, trusting(two[0][0], two[1][0])
    put(a, served)
    server = running(*served)
    put(b, served, which=(True, False))  # the new certificate, the old key
    time.sleep(5 * RELOAD)
    assert served_cert(server.port, context) == der(a[0]), "a mismatched pair replaced a working one"
    put(b, served, which=(False, True))
    assert wait_for(lambda: served_cert(server.port, context) == der(b[0]), 20 * RELOAD)


def test_the_server_listens_once_its_certificate_appears(
        two: tuple[tuple[Path, Path], tuple[Path, Path]], served: tuple[Path, Path],
        running: Callable[..., RunningWebhook]) -> None:
    late = threading.Timer(1.0, put, (two[0], served))
    late.start()
    started = time.monotonic()
    try:
        server = running(*served)  # returns once listening
    finally:
        late.join()
    assert time.monotonic() - started >= 1.0
    assert served_cert(server.port, trusting(two[0][0])) == der(two[0][0])


def test_reviews_share_a_kept_alive_connection_until_it_idles_past_the_header_deadline(
        certificate: tuple[Path, Path], context: ssl.SSLContext, running: Callable[..., RunningWebhook]) -> None:
    server = running(*certificate, header_seconds=1.0)
    conn = http.client.HTTPSConnection(HOST, server.port, context=context, timeout=5)
    try:
        assert review_on(conn) == 200
        sock = conn.sock
        assert sock is not None
        assert [review_on(conn) for _ in range(2)] == [200, 200]
        assert conn.sock is sock, "the connection was not kept alive"
        closed = closed_within(sock, 5.0)
        assert closed is not None and closed < 1.0 + 1.0, closed
    finally:
        conn.close()
