"""The webhook server on 127.0.0.1 with a certificate made for the test, and the clients that
attack it: a well-behaved review, and raw connections that send what an attacker would."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimik3_operator.webhook import CertificateFiles, Limits, WebhookServer

HOST = "127.0.0.1"


class RunningWebhook:
    """A WebhookServer on an event loop of its own thread (the operator runs it on kopf's loop),
    for tests that call it from plain threads."""

    def __init__(self, cert: Path, key: Path, limits: Limits | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-webhook", daemon=True)
        self._thread.start()
        self.server = WebhookServer(HOST, 0, CertificateFiles(cert, key), limits)
        self._call(self._start())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    async def _start(self) -> None:
        await self.server.start()
        assert self.server.listening is not None
        await asyncio.wait_for(self.server.listening.wait(), 10)

    @property
    def limits(self) -> Limits:
        return self.server.limits

    @property
    def port(self) -> int:
        return self.server.port

    def alive(self) -> bool:
        return self.server.alive()

    def shutdown(self) -> None:
        """Stop serving and the loop (idempotent)."""
        if self.loop.is_running():
            self._call(self.server.stop())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (cryptography if installed, else openssl)."""
    cert, key = directory / "tls.crt", directory / "tls.key"
    try:
        _with_cryptography(cert, key)
    except ImportError:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "1", "-subj", f"/CN={HOST}", "-addext", f"subjectAltName=IP:{HOST}",
                        "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def _with_cryptography(cert_path: Path, key_path: Path) -> None:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))


def client_context(cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert))


def review_body(uid: str = "u-1") -> bytes:
    """What the API server sends on a DELETE (the answer needs no planning: allowed)."""
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": uid, "operation": "DELETE", "object": None}}).encode()


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    seconds: float


def post(port: int, context: ssl.SSLContext, body: bytes, headers: dict[str, str] | None = None,
         timeout: float = 10.0, path: str = "/validate") -> Answer:
    """One POST the way the API server makes it (http.client sets the Content-Length)."""
    started = time.monotonic()
    conn = http.client.HTTPSConnection(HOST, port, context=context, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    return Answer(response.status, json.loads(data), time.monotonic() - started)


def raw_tls(port: int, context: ssl.SSLContext, timeout: float = 10.0) -> ssl.SSLSocket:
    """A TLS connection to write whatever we like on."""
    sock = socket.create_connection((HOST, port), timeout=timeout)
    return context.wrap_socket(sock, server_hostname=HOST)


def raw_answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of the answer on `sock`, read to the end (we answer HTTP/1.0)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed `sock` (reading and dropping what it sends), or None."""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - started < seconds:
        try:
            if not sock.recv(65536):
                return time.monotonic() - started
        except (TimeoutError, ssl.SSLWantReadError):
            continue
        except OSError:  # reset, or TLS torn down
            return time.monotonic() - started
    return None
