"""The webhook's own CA and serving certificate, when no cert-manager makes them: what to do with
the ones a Secret holds (keep, renew the serving certificate, or start a new CA), and making them.

The decision is pure (`decide`). Making and reading certificates uses the `openssl` command: the
operator image has it (Debian's ca-certificates depends on it) and the Python environment has no
`cryptography`; nothing here writes cryptography of its own. Keys are ECDSA P-256, which the API
server accepts. Renewal follows cert-manager's defaults in spirit: a serving certificate lives a
year and is renewed with a month left; the CA lives ten years and is replaced with a year left,
the old one staying in the bundle the API server trusts until it expires, so that a replica still
serving a certificate of the old CA is trusted while it picks up the new one.
"""

from __future__ import annotations

import base64
import ipaddress
import secrets
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from pathlib import Path

PEM_END = b"-----END CERTIFICATE-----"
SECRET_KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key")


@dataclass(frozen=True)
class Policy:
    ca_lifetime: timedelta = timedelta(days=3650)
    ca_renew_before: timedelta = timedelta(days=365)
    cert_lifetime: timedelta = timedelta(days=365)
    cert_renew_before: timedelta = timedelta(days=30)


DEFAULT_POLICY = Policy()


@dataclass(frozen=True)
class Material:
    """What the Secret holds, PEM: `ca_bundle` is the current CA first, then the previous one
    while it is still valid; `ca_key` is the current CA's key."""

    ca_bundle: bytes
    ca_key: bytes
    cert: bytes
    key: bytes

    def secret_data(self) -> dict[str, str]:
        values = (self.ca_bundle, self.ca_key, self.cert, self.key)
        return {name: base64.b64encode(value).decode() for name, value in zip(SECRET_KEYS, values, strict=True)}

    @classmethod
    def from_secret_data(cls, data: dict[str, str] | None) -> Material | None:
        """The material in a Secret's data, or None when a key is missing or not base64."""
        try:
            return cls(*(base64.b64decode((data or {})[name], validate=True) for name in SECRET_KEYS))
        except (KeyError, ValueError, TypeError):
            return None

    @property
    def ca_cert(self) -> bytes:
        """The current CA alone (the bundle's first certificate)."""
        head, sep, _ = self.ca_bundle.partition(PEM_END)
        return head + sep + b"\n"


@dataclass(frozen=True)
class Facts:
    """What `decide` needs to know of the material a Secret holds."""

    ca_not_after: datetime
    cert_not_after: datetime
    hosts: frozenset[str]
    """DNS names and IP addresses the serving certificate is valid for."""
    ca_sound: bool
    """The CA key is the current CA's."""
    cert_sound: bool
    """The serving certificate is signed by the current CA and its key is the certificate's."""


class Action(Enum):
    KEEP = "keep"
    RENEW = "renew"
    """A new serving certificate from the same CA: the API server's trust is unchanged."""
    NEW_CA = "new CA"
    """A new CA and serving certificate; the old CA stays in the bundle while valid."""


def decide(facts: Facts | None, hosts: frozenset[str], now: datetime, policy: Policy) -> Action:
    if facts is None or not facts.ca_sound or facts.ca_not_after - now < policy.ca_renew_before:
        return Action.NEW_CA
    if not facts.cert_sound or not hosts <= facts.hosts or facts.cert_not_after - now < policy.cert_renew_before:
        return Action.RENEW
    return Action.KEEP


def bundle(new_ca: bytes, previous: Material | None, previous_ca_not_after: datetime | None, now: datetime) -> bytes:
    """The CA bundle after a new CA: the new one, then the previous CA while it is still valid."""
    if previous is None or previous_ca_not_after is None or previous_ca_not_after <= now:
        return new_ca
    return new_ca + previous.ca_cert


# ---- openssl ------------------------------------------------------------------------------------

_REQ_CONFIG = "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\n"
"""A configuration of our own, so that no extension comes from the system's openssl.cnf."""


class CertificateError(RuntimeError):
    """openssl failed, or is missing."""


def _openssl(*args: str | Path, cwd: Path) -> str:
    try:
        done = subprocess.run(["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CertificateError(f"openssl: {exc}") from exc
    if done.returncode != 0:
        raise CertificateError(f"openssl {args[0]}: {done.stderr.strip()[-500:]}")
    return done.stdout


def _san(host: str) -> str:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"DNS:{host}"
    return f"IP:{host}"


def _new_key_args(key: str) -> tuple[str, ...]:
    return ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key)


Issued = tuple[bytes, bytes, bytes, bytes]
"""CA certificate, CA key, serving certificate, its key (PEM)."""


def issue(hosts: frozenset[str], policy: Policy, ca: tuple[bytes, bytes] | None = None) -> Issued:
    """(CA certificate, CA key, serving certificate, its key): a new CA unless `ca` (certificate,
    key) is given, and a serving certificate it signs for `hosts`."""
    if not hosts:
        raise ValueError("a serving certificate needs at least one host")
    with tempfile.TemporaryDirectory(prefix="kimik3-cert-") as tmp:
        work = Path(tmp)
        (work / "req.cnf").write_text(_REQ_CONFIG)
        if ca is None:
            _openssl("req", "-x509", "-new", "-config", "req.cnf", *_new_key_args("ca.key"),
                     "-days", str(policy.ca_lifetime.days), "-subj", "/CN=kimik3-operator-webhook-ca",
                     "-addext", "basicConstraints=critical,CA:TRUE",
                     "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", "ca.crt", cwd=work)
        else:
            (work / "ca.crt").write_bytes(ca[0])
            (work / "ca.key").touch(mode=0o600)
            (work / "ca.key").write_bytes(ca[1])
        first = sorted(hosts)[0]
        _openssl("req", "-new", "-config", "req.cnf", *_new_key_args("tls.key"), "-subj", f"/CN={first}",
                 "-out", "tls.csr", cwd=work)
        (work / "ext.cnf").write_text(f"subjectAltName = {', '.join(_san(h) for h in sorted(hosts))}\n"
                                      "extendedKeyUsage = serverAuth\n"
                                      "basicConstraints = critical,CA:FALSE\n"
                                      "keyUsage = critical,digitalSignature\n")
        _openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-set_serial", hex(secrets.randbits(127) | 1), "-days", str(policy.cert_lifetime.days),
                 "-extfile", "ext.cnf", "-out", "tls.crt", cwd=work)
        ca_cert, ca_key, cert, key = ((work / name).read_bytes() for name in ("ca.crt", "ca.key", "tls.crt", "tls.key"))
        return ca_cert, ca_key, cert, key


def _not_after(pem: Path, cwd: Path) -> datetime:
    out = _openssl("x509", "-noout", "-enddate", "-in", pem, cwd=cwd).strip()
    return datetime.fromtimestamp(ssl.cert_time_to_seconds(out.removeprefix("notAfter=")), UTC)


def _hosts(pem: Path, cwd: Path) -> frozenset[str]:
    out = _openssl("x509", "-noout", "-ext", "subjectAltName", "-in", pem, cwd=cwd)
    names = out.partition("\n")[2].replace("\n", ",").split(",")
    return frozenset(name.strip().partition(":")[2] for name in names if ":" in name)


def _matches(cert: Path, key: Path) -> bool:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError):
        return False
    return True


def inspect(material: Material) -> Facts | None:
    """The facts of `material`, or None when it is not certificates at all."""
    with tempfile.TemporaryDirectory(prefix="kimik3-cert-") as tmp:
        work = Path(tmp)
        for name, value in (("ca.crt", material.ca_cert), ("ca.key", material.ca_key), ("tls.crt", material.cert),
                            ("tls.key", material.key)):
            (work / name).touch(mode=0o600)
            (work / name).write_bytes(value)
        try:
            ca_not_after, cert_not_after = _not_after(work / "ca.crt", work), _not_after(work / "tls.crt", work)
            hosts = _hosts(work / "tls.crt", work)
        except CertificateError:
            return None
        try:
            _openssl("verify", "-CAfile", "ca.crt", "tls.crt", cwd=work)
            signed = True
        except CertificateError:  # another CA, or expired
            signed = False
        return Facts(ca_not_after, cert_not_after, hosts, ca_sound=_matches(work / "ca.crt", work / "ca.key"),
                     cert_sound=signed and _matches(work / "tls.crt", work / "tls.key"))


def renewed(previous: Material | None, hosts: frozenset[str], now: datetime,
            policy: Policy = DEFAULT_POLICY) -> tuple[Action, Material | None]:
    """What to do with `previous` (a Secret's material, or None), and the material to write
    instead (None to keep it)."""
    facts = inspect(previous) if previous is not None else None
    action = decide(facts, hosts, now, policy)
    if action is Action.KEEP:
        return action, None
    if action is Action.RENEW:
        assert previous is not None
        _, _, cert, key = issue(hosts, policy, (previous.ca_cert, previous.ca_key))
        return action, Material(previous.ca_bundle, previous.ca_key, cert, key)
    ca_cert, ca_key, cert, key = issue(hosts, policy)
    return action, Material(bundle(ca_cert, previous, facts.ca_not_after if facts else None, now), ca_key, cert, key)
