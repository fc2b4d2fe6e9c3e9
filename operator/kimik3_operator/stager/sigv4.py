"""AWS Signature Version 4 for the few S3 calls the stager makes, and where the credentials come from.

Why not boto3: botocore pins ``python-dateutil<3`` while the operator's pinned ``kubernetes`` requires
``python-dateutil>=3``; both cannot be installed in one environment. The stager needs four read-only
calls (ListObjectsV2, HeadObject, ranged GetObject, and STS for web identity), so it signs them itself.
The signer is checked against AWS's published example (tests/stager/test_sigv4.py).

Why not obstore (0.12.1, object_store 0.14.2; measured against tests/stager/fake_s3.py, 2026-12): its
listing, ranged and conditional GETs work, but (1) it follows a 307 to another origin and sends the session
token (``x-amz-security-token``) there: IRSA and Pod Identity credentials would leave the endpoint (attack
5 in tests/security/test_stager_token_origin.py); no client option turns redirects off; (2) ``head``/``get``
expose only size, ETag, Last-Modified and Content-* attributes, not ``x-amz-server-side-encryption`` nor
``x-amz-checksum-sha256``, and there is no ``partNumber``: SSE-KMS objects and multipart ETags could no
longer be checked (see s3.py); (3) its constructors read the process environment, ``AWS_ENDPOINT_URL`` and
``AWS_ALLOW_HTTP`` included, which attack 3 forbids; (4) its web identity exchange refuses a plain-http
STS endpoint even with ``allow_http`` (no loopback test of IRSA) and rejects the ``sts_endpoint`` key its
own stubs document.

Credentials, in the order boto3 uses for a pod: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
(+ ``AWS_SESSION_TOKEN``); web identity (IRSA: ``AWS_ROLE_ARN`` + ``AWS_WEB_IDENTITY_TOKEN_FILE``);
container credentials (EKS Pod Identity / ECS: ``AWS_CONTAINER_CREDENTIALS_FULL_URI`` or
``..._RELATIVE_URI`` with ``AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE)``); none -> unsigned (public bucket).
Temporary credentials are refreshed five minutes before they expire (a 1.6 TB copy outlives them).

The web identity token goes to STS in a POST body, never in a URL (URLs end up in error messages and
logs), and only to ``AWS_ENDPOINT_URL_STS`` or the regional STS endpoint: ``AWS_ENDPOINT_URL``, which
redirects every AWS service at once, is not read (a model endpoint set for S3 must never receive the
pod's identity). The tokens read from files count as secrets (``secrets()``), for the redactor.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from .errors import WeightsError

EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    token: str = ""
    expires_at: float | None = None  # epoch seconds

    def __repr__(self) -> str:  # never print a secret by accident
        return f"Credentials(access_key={self.access_key[:4]}..., expires_at={self.expires_at})"

    def secrets(self) -> list[str]:
        return [s for s in (self.secret_key, self.token) if s]


def uri_encode(s: str, *, keep_slash: bool) -> str:
    return quote(s, safe="-_.~/" if keep_slash else "-_.~")


def canonical_query(params: Mapping[str, str] | list[tuple[str, str]]) -> str:
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    enc = sorted((uri_encode(k, keep_slash=False), uri_encode(v, keep_slash=False)) for k, v in items)
    return "&".join(f"{k}={v}" for k, v in enc)


def canonical_request(method: str, path: str, query: str, headers: Mapping[str, str],
                      signed: list[str], payload_hash: str) -> str:
    lower = {k.lower(): " ".join(str(v).strip().split()) for k, v in headers.items()}
    canon_headers = "".join(f"{h}:{lower[h]}\n" for h in signed)
    return "\n".join([method, path, query, canon_headers, ";".join(signed), payload_hash])


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    k = _hmac(("AWS4" + secret).encode(), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def signature(creds: Credentials, amz_date: str, region: str, service: str, creq: str) -> str:
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(creq.encode()).hexdigest()])
    return hmac.new(signing_key(creds.secret_key, amz_date[:8], region, service), sts.encode(),
                    hashlib.sha256).hexdigest()


def sign(method: str, url: str, headers: dict[str, str], creds: Credentials | None, region: str,
         service: str = "s3", *, payload_hash: str = EMPTY_SHA256, now: datetime | None = None) -> dict[str, str]:
    """Headers to send for ``method url``: ``headers`` plus host, x-amz-date, x-amz-content-sha256,
    the session token and Authorization. The URL's path and query must already be URI-encoded the way
    S3 expects (see ``S3Client``); what is signed is exactly what is sent."""
    parts = urlsplit(url)
    now = now or datetime.now(UTC)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    out = dict(headers)
    out["host"] = parts.netloc
    out["x-amz-date"] = amz_date
    out["x-amz-content-sha256"] = payload_hash
    if creds is None:
        return out
    if creds.token:
        out["x-amz-security-token"] = creds.token
    signed = sorted(k.lower() for k in out)
    pairs = [p.partition("=") for p in parts.query.split("&")] if parts.query else []
    query = "&".join(f"{k}={v}" for k, _, v in sorted((k, s, v) for k, s, v in pairs))
    creq = canonical_request(method, parts.path or "/", query, out, signed, payload_hash)
    sig = signature(creds, amz_date, region, service, creq)
    out["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{amz_date[:8]}/{region}/{service}/"
                            f"aws4_request, SignedHeaders={';'.join(signed)}, Signature={sig}")
    return out


# ---------------------------------------------------------------- credentials


def _parse_time(s: str) -> float:
    s = s.strip().replace("Z", "+00:00")
    return datetime.fromisoformat(s).timestamp()


HttpCall = Callable[[str, str, dict[str, str], bytes | None], tuple[int, bytes]]
"""(method, url, headers, body) -> (status, body): raises WeightsError, whose message names no URL."""


class CredentialProvider:
    """Current credentials, refreshed when temporary ones near expiry. ``http`` is injected so this module
    stays free of an HTTP client."""

    REFRESH_MARGIN = 300.0

    def __init__(self, env: Mapping[str, str], http: HttpCall, *, clock: Callable[[], float] = time.time) -> None:
        self._env = env
        self._http = http
        self._clock = clock
        self._lock = threading.Lock()
        self._creds: Credentials | None = None
        self._tokens: list[str] = []  # read from files: the web identity token, the container token
        self._kind = self._detect()

    @property
    def kind(self) -> str:
        return self._kind

    def _detect(self) -> str:
        e = self._env
        if e.get("AWS_ACCESS_KEY_ID") and e.get("AWS_SECRET_ACCESS_KEY"):
            return "env"
        if e.get("AWS_ROLE_ARN") and e.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
            return "web-identity"
        if e.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") or e.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
            return "container"
        return "anonymous"

    def get(self) -> Credentials | None:
        with self._lock:
            c = self._creds
            if c is not None and (c.expires_at is None or c.expires_at - self._clock() > self.REFRESH_MARGIN):
                return c
            if self._kind == "anonymous":
                return None
            self._creds = self._load()
            return self._creds

    def secrets(self) -> list[str]:
        c = self._creds
        return (c.secrets() if c else []) + list(self._tokens)

    def _read_token_file(self, path: str, what: str) -> str:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise WeightsError("CredentialsUnavailable", f"cannot read {what}: {exc.strerror}") from exc
        if token and token not in self._tokens:
            self._tokens.append(token)
        return token

    def _load(self) -> Credentials:
        e = self._env
        if self._kind == "env":
            return Credentials(e["AWS_ACCESS_KEY_ID"], e["AWS_SECRET_ACCESS_KEY"], e.get("AWS_SESSION_TOKEN", ""))
        if self._kind == "web-identity":
            return self._web_identity()
        return self._container()

    def _web_identity(self) -> Credentials:
        e = self._env
        jwt = self._read_token_file(e["AWS_WEB_IDENTITY_TOKEN_FILE"], "AWS_WEB_IDENTITY_TOKEN_FILE")
        region = e.get("AWS_REGION") or e.get("AWS_DEFAULT_REGION") or "us-east-1"
        endpoint = (e.get("AWS_ENDPOINT_URL_STS") or f"https://sts.{region}.amazonaws.com").rstrip("/")
        form = {"Action": "AssumeRoleWithWebIdentity", "Version": "2011-06-15", "RoleArn": e["AWS_ROLE_ARN"],
                "RoleSessionName": e.get("AWS_ROLE_SESSION_NAME") or "kimik3-weights", "WebIdentityToken": jwt,
                "DurationSeconds": "3600"}
        status, body = self._http("POST", f"{endpoint}/",
                                  {"Accept": "application/xml",
                                   "Content-Type": "application/x-www-form-urlencoded; charset=utf-8"},
                                  urlencode(form).encode())
        if status != 200:
            raise WeightsError("CredentialsUnavailable", f"STS AssumeRoleWithWebIdentity answered HTTP {status}")
        try:
            root = ET.fromstring(body)
        except ET.ParseError as exc:
            raise WeightsError("CredentialsUnavailable", "STS answered something that is not XML") from exc
        found = {el.tag.rsplit("}", 1)[-1]: (el.text or "") for el in root.iter()}
        try:
            return Credentials(found["AccessKeyId"], found["SecretAccessKey"], found.get("SessionToken", ""),
                               _parse_time(found["Expiration"]) if found.get("Expiration") else None)
        except (KeyError, ValueError) as exc:
            raise WeightsError("CredentialsUnavailable", f"STS answer lacks or garbles {exc}") from exc

    def _container(self) -> Credentials:
        e = self._env
        url = e.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") or (
            "http://169.254.170.2" + e.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", ""))
        headers: dict[str, str] = {"Accept": "application/json"}
        token = e.get("AWS_CONTAINER_AUTHORIZATION_TOKEN", "")
        if e.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"):
            token = self._read_token_file(e["AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"], "the container token file")
        if token:
            headers["Authorization"] = token
        status, body = self._http("GET", url, headers, None)
        if status != 200:
            raise WeightsError("CredentialsUnavailable", f"container credentials endpoint answered HTTP {status}")
        try:
            d: dict[str, Any] = json.loads(body)
        except ValueError as exc:
            raise WeightsError("CredentialsUnavailable", "the container credentials endpoint answered no JSON") from exc
        try:
            return Credentials(d["AccessKeyId"], d["SecretAccessKey"], d.get("Token", ""),
                               _parse_time(d["Expiration"]) if d.get("Expiration") else None)
        except (KeyError, ValueError, TypeError) as exc:
            raise WeightsError("CredentialsUnavailable", f"container credentials lack or garble {exc}") from exc
