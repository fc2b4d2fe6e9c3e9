"""Loaded by the CLI subprocesses the stager tests start (PYTHONPATH): refuse any connection that is not
to loopback, so a mistake can never send test traffic off the machine."""

import socket

_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex


def _allowed(sock, address):
    if sock.family == socket.AF_INET:
        return str(address[0]).startswith("127.")
    if sock.family == socket.AF_INET6:
        return str(address[0]) in ("::1", "0:0:0:0:0:0:0:1")
    return True


def _guarded_connect(self, address):
    if not _allowed(self, address):
        raise ConnectionRefusedError(f"stager tests: refusing to connect to {address!r} (loopback only)")
    return _connect(self, address)


def _guarded_connect_ex(self, address):
    if not _allowed(self, address):
        raise ConnectionRefusedError(f"stager tests: refusing to connect to {address!r} (loopback only)")
    return _connect_ex(self, address)


socket.socket.connect = _guarded_connect
socket.socket.connect_ex = _guarded_connect_ex
