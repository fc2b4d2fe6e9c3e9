"""Denial of service against the webhook, replayed on 127.0.0.1: a caller that sends nothing,
too many callers, headers and bodies that trickle in, a body or headers too large. Each must cost
the server a bounded time and leave it answering others."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from .harness import HOST, RunningWebhook, closed_within, post, raw_answer, raw_tls, review_body

PROMPT = 1.0
"""What "at once" means here: far below every deadline under test, far above a loopback review."""


@contextmanager
def trickling(sock: ssl.SSLSocket, chunk: bytes, every: float) -> Iterator[None]:
    """Send `chunk` every `every` seconds (at most 50 times) while the block runs."""
    stop = threading.Event()

    def send() -> None:
        for _ in range(50):
            if stop.wait(every):
                return
            try:
                sock.sendall(chunk)
            except (OSError, ValueError):  # closed by the server, or by us
                return

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def port(server: RunningWebhook) -> int:
    return server.port


@contextmanager
def silent(server: RunningWebhook, count: int) -> Iterator[list[socket.socket]]:
    """`count` TCP connections that never say a word (not even a TLS hello)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.create_connection((HOST, port(server)), timeout=5))
                 for _ in range(count)]
        time.sleep(0.2)  # accepted, and their threads waiting in the handshake
        yield socks


def test_silent_connections_do_not_stall_another_callers_review(
        webhook: Callable[..., RunningWebhook], context: ssl.SSLContext) -> None:
    server = webhook()  # the production limits: a 5 s handshake deadline, 16 connections
    with silent(server, server.limits.connections - 1):
        answer = post(port(server), context, review_body(), timeout=server.limits.handshake_seconds)
        assert answer.status == 200 and answer.body["response"] == {"uid": "u-1", "allowed": True}
        assert answer.seconds < PROMPT, f"a review took {answer.seconds:.2f}s beside silent callers"
        assert server.alive()


def test_connections_over_the_cap_are_closed_at_once_and_their_slots_come_back(
        webhook: Callable[..., RunningWebhook], context: ssl.SSLContext) -> None:
    server = webhook(connections=4, handshake_seconds=1.0)
    with silent(server, 4):
        started = time.monotonic()
        try:
            answer = post(port(server), context, review_body(), timeout=5).status
        except (ssl.SSLError, ConnectionError) as exc:
            answer = type(exc).__name__  # refused during the handshake: what a refused caller sees
        refused_in = time.monotonic() - started
        assert answer != 200 and refused_in < PROMPT, (answer, refused_in)
        assert server.alive()
        time.sleep(server.limits.handshake_seconds + 0.5)  # the silent ones hit their deadline
        assert post(port(server), context, review_body(), timeout=5).status == 200


def test_headers_that_trickle_in_are_cut_at_their_deadline(
        webhook: Callable[..., RunningWebhook], context: ssl.SSLContext) -> None:
    server = webhook(header_seconds=1.0)
    with raw_tls(port(server), context) as sock:
        sock.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\n")
        started, closed = time.monotonic(), None
        while closed is None and time.monotonic() - started < 5:
            try:
                sock.sendall(b"X")  # a byte every 0.2 s: each read of the server gets one in time
            except OSError:
                closed = time.monotonic() - started
                break
            if (gone := closed_within(sock, 0.2)) is not None:
                closed = time.monotonic() - started - 0.2 + gone
    assert closed is not None and closed < server.limits.header_seconds + PROMPT, closed
    assert post(port(server), context, review_body()).status == 200


def test_a_body_that_trickles_in_gets_408_at_its_deadline(
        webhook: Callable[..., RunningWebhook], context: ssl.SSLContext) -> None:
    server = webhook(body_seconds=1.0)
    with raw_tls(port(server), context) as sock:
        sock.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        started = time.monotonic()
        with trickling(sock, b"{" * 10, every=0.2):
            status, body = raw_answer(sock)
        elapsed = time.monotonic() - started
    assert status == 408 and "error" in body
    assert elapsed < server.limits.body_seconds + PROMPT, elapsed
    assert post(port(server), context, review_body()).status == 200


def test_a_body_over_the_limit_is_refused_without_reading_it(
        webhook: Callable[..., RunningWebhook], context: ssl.SSLContext) -> None:
    server = webhook()
    for length in (server.limits.max_body + 1, 100 * 1024 * 1024, 10**12 - 1):
        with raw_tls(port(server), context) as sock:
            started = time.monotonic()
            sock.sendall(f"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode())
            status, body = raw_answer(sock)  # sent nothing of the body: the answer comes anyway
            assert (status, time.monotonic() - started < PROMPT) == (413, True), (length, body)
    assert post(port(server), context, review_body()).status == 200


def test_headers_over_the_limit_are_refused(webhook: Callable[..., RunningWebhook], context: ssl.SSLContext) -> None:
    server = webhook()
    big = "".join(f"X-Filler-{i}: {'y' * 1000}\r\n" for i in range(40))  # 40 KiB of headers
    with raw_tls(port(server), context) as sock:
        try:
            sock.sendall(f"POST /validate HTTP/1.1\r\nHost: x\r\n{big}Content-Length: 2\r\n\r\n{{}}".encode())
        except (ssl.SSLError, ConnectionError):
            pass  # the server answered and closed at its limit, before the rest was sent: the answer still waits
        status, body = raw_answer(sock)
    assert status == 431 and "error" in body
    assert post(port(server), context, review_body()).status == 200
