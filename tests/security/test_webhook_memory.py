"""Memory under attack, measured on a server in a process of its own (its peak resident set,
VmHWM): bodies held open just short of their end on four times as many connections as the cap,
and bodies that decode to twenty times their size, all at once. What the server holds is bounded
by its Limits (connections x max_body, one decode at a time), whatever the number of callers."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .harness import HOST, post, raw_tls, review_body

MiB = 1024 * 1024
CONNECTIONS, MAX_BODY = 8, 1 * MiB
SERVE = f"""
import asyncio, sys
from kimik3_operator.webhook import CertificateFiles, Limits, WebhookServer

async def main():
    server = WebhookServer("{HOST}", 0, CertificateFiles(sys.argv[1], sys.argv[2]),
                           Limits(connections={CONNECTIONS}, max_body={MAX_BODY}, body_seconds=20))
    await server.start()
    await server.listening.wait()
    print(server.port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes our stdin

asyncio.run(main())
"""


@pytest.fixture
def server_process(certificate: tuple[Path, Path]) -> Iterator[tuple[int, int]]:
    """(pid, port) of a webhook server in a child process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(certificate[0]), str(certificate[1])],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        yield proc.pid, int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(timeout=10)


def peak_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024


def hold_body_open(port: int, context: ssl.SSLContext, held: list[ssl.SSLSocket]) -> None:
    """Send all of a max-size body but its last byte, and keep the connection."""
    try:
        sock = raw_tls(port, context, timeout=5)
        sock.sendall(f"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY}\r\n\r\n".encode())
        sock.sendall(b" " * (MAX_BODY - 1))
        held.append(sock)
    except (OSError, ssl.SSLError):
        pass  # over the cap: closed by the server


def decode_bomb(port: int, context: ssl.SSLContext, answers: list[Any]) -> None:
    """A body just under the limit that decodes to ~70 bytes of Python objects per 3 of text."""
    body = b"[" + b"{}," * ((MAX_BODY - 3) // 3) + b"{}]"
    try:
        answers.append(post(port, context, body, timeout=30).status)
    except (OSError, ssl.SSLError) as exc:
        answers.append(type(exc).__name__)


def run_all(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)


def test_memory_stays_bounded_by_the_limits(server_process: tuple[int, int], context: ssl.SSLContext) -> None:
    pid, port = server_process
    assert post(port, context, review_body()).status == 200
    before = peak_mib(pid)
    held: list[ssl.SSLSocket] = []
    try:
        run_all([threading.Thread(target=hold_body_open, args=(port, context, held)) for _ in range(4 * CONNECTIONS)])
        time.sleep(0.5)
        holding = peak_mib(pid) - before
    finally:
        for sock in held:
            sock.close()
    answers: list[Any] = []
    time.sleep(0.5)  # the held connections' slots come back
    run_all([threading.Thread(target=decode_bomb, args=(port, context, answers)) for _ in range(2 * CONNECTIONS)])
    grown = peak_mib(pid) - before
    # Held bodies: at most CONNECTIONS x MAX_BODY; one decode at a time: ~25 x MAX_BODY; plus the
    # copies a request makes on its way (read, decoded to text) and TLS buffers. Unbounded, the
    # same attacks hold 32 bodies, then decode 16 at once: some 400 MiB.
    bound = CONNECTIONS * MAX_BODY / MiB + 25 * MAX_BODY / MiB + 32
    print(f"\npeak resident set: +{holding:.1f} MiB with {len(held)} of {4 * CONNECTIONS} max-size bodies held "
          f"open, +{grown:.1f} MiB after {2 * CONNECTIONS} concurrent decode bombs "
          f"(answers {sorted(map(str, answers))}); bound {bound:.0f} MiB")
    assert len(held) <= CONNECTIONS
    assert grown < bound
    assert answers.count(400) >= CONNECTIONS // 2, answers  # those that got a slot were decoded and refused
    assert post(port, context, review_body()).status == 200


def test_a_body_declared_at_the_limit_is_read_and_judged(server_process: tuple[int, int],
                                                          context: ssl.SSLContext) -> None:
    _, port = server_process
    review = json.loads(review_body())
    padding = MAX_BODY - len(json.dumps(review)) - len(', "padding": ""')
    review["padding"] = "x" * padding
    body = json.dumps(review).encode()
    assert len(body) == MAX_BODY
    assert post(port, context, body).status == 200


def test_connections_are_answered_after_an_attack(server_process: tuple[int, int], context: ssl.SSLContext) -> None:
    _, port = server_process
    socks = [socket.create_connection((HOST, port), timeout=5) for _ in range(4 * CONNECTIONS)]
    for sock in socks:
        sock.close()
    deadline = time.monotonic() + 10
    while True:  # the closed ones free their slots as their handshakes fail
        try:
            assert post(port, context, review_body()).status == 200
            break
        except (OSError, ssl.SSLError):
            assert time.monotonic() < deadline
            time.sleep(0.1)
