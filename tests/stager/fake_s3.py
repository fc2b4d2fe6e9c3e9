"""An S3 endpoint on loopback with what the loader calls: ListObjectsV2 (paginated), HeadObject (with
``partNumber`` and ``x-amz-checksum-mode``), GetObject (``Range``, ``If-Match``), path-style addressing.

Unlike moto, it checks every SigV4 signature: it rebuilds the canonical request from the request it
*received* and signs it with the known secret, so a client that signs one URL and sends another fails
here. It also answers the two credential endpoints the loader can use: STS AssumeRoleWithWebIdentity
(``POST /sts/`` with the form in the body, as AWS takes it; the same call with the token in the URL is
answered 400) and container credentials (``GET /creds``).

Knobs: ``slow`` (per key: serve the first bytes fast, then trickle, bounded), ``corrupt`` (per key: flip a
byte), ``page_size`` (keys per listing page); and for the security tests, what a hostile server does:
``oversize`` (per key: append this many bytes to what GetObject sends), ``listed_size`` (per key: the
``<Size>`` text of the listing), ``part1_size`` (per key: the Content-Length of ``HEAD ?partNumber=1``),
``redirect_to`` (answer every object request with a 307 to this base URL).

What S3 sends that a client may rely on, it sends too (obstore, for one, refuses a listing without
``LastModified``): ``LastModified`` and quoted ``ETag`` in listings, ``Last-Modified`` and ``ETag`` on
objects, ``Content-Range`` on a 206 and ``bytes */<size>`` on a 416, an ``x-amz-request-id`` on every
answer and a ``RequestId`` in every error body.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import re
import threading
import time
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

from kimik3_operator.stager.sigv4 import Credentials, canonical_request, signature

from .fake_hub import Slow, send, write_body

ACCESS_KEY = "AKIDLOOPBACKTEST0001"
SECRET_KEY = "loopback/secret+key/for-tests-only-0001"


@dataclass
class Obj:
    data: bytes
    etag: str
    part_size: int = 0  # multipart upload with this part size
    sse: str = ""  # "aws:kms": ETag is not an MD5
    checksum_sha256: str = ""  # base64, full object
    modified: int = field(default_factory=lambda: int(time.time()))  # epoch seconds (S3 keeps no finer)

    @property
    def last_modified_iso(self) -> str:
        """As ListObjectsV2 spells it: ``2026-12-01T15:50:28.000Z``."""
        return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(self.modified))

    @property
    def last_modified_http(self) -> str:
        """As the ``Last-Modified`` header spells it (RFC 9110 IMF-fixdate)."""
        return formatdate(self.modified, usegmt=True)


@dataclass
class Logged:
    method: str
    path: str
    range: str | None
    signed: bool
    status: int = 0
    sent: int = 0


def multipart_etag(data: bytes, part_size: int) -> str:
    md5s = [hashlib.md5(data[i:i + part_size]).digest() for i in range(0, len(data), part_size)] or [
        hashlib.md5(b"").digest()]
    return f"{hashlib.md5(b''.join(md5s)).hexdigest()}-{len(md5s)}"


@dataclass
class FakeS3:
    buckets: dict[str, dict[str, Obj]] = field(default_factory=dict)
    page_size: int = 1000
    slow: dict[str, Slow] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)
    require_auth: bool = True
    secrets: dict[str, str] = field(default_factory=lambda: {ACCESS_KEY: SECRET_KEY})
    oversize: dict[str, int] = field(default_factory=dict)
    listed_size: dict[str, str] = field(default_factory=dict)
    part1_size: dict[str, int] = field(default_factory=dict)
    redirect_to: str = ""
    bodies: list[bytes] = field(default_factory=list)  # request bodies received (POST)
    _request_ids: itertools.count[int] = field(default_factory=itertools.count)
    log: list[Logged] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, bucket: str, key: str, data: bytes, *, part_size: int = 0, sse: str = "",
            checksum: bool = False) -> Obj:
        if sse:
            etag = hashlib.sha1(data).hexdigest()[:32]  # opaque, like SSE-KMS
        elif part_size:
            etag = multipart_etag(data, part_size)
        else:
            etag = hashlib.md5(data).hexdigest()
        obj = Obj(data, etag, part_size, sse,
                  base64.b64encode(hashlib.sha256(data).digest()).decode() if checksum else "")
        self.buckets.setdefault(bucket, {})[key] = obj
        return obj

    def start(self) -> FakeS3:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def env(self, **extra: str) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1", **extra}

    def reset_log(self) -> None:
        with self._lock:
            self.log.clear()

    def gets(self) -> list[Logged]:
        with self._lock:
            return [r for r in self.log if r.method == "GET" and "list-type" not in r.path]


def _handler(s3: FakeS3) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, entry: Logged, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  ctype: str = "application/xml") -> None:
            headers = headers or {}
            if "x-amz-request-id" not in headers:
                headers = {**self._request_id(), **headers}
            send(self, entry, status, body, headers, ctype)

        def _request_id(self) -> dict[str, str]:
            return {"x-amz-request-id": f"{next(s3._request_ids):016X}"}

        def _err(self, entry: Logged, status: int, code: str, headers: dict[str, str] | None = None) -> None:
            rid = self._request_id()
            body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{code}</Message>'
                    f"<RequestId>{rid['x-amz-request-id']}</RequestId></Error>")
            self._send(entry, status, body.encode(), {**rid, **(headers or {})})

        def _check_sig(self) -> str:
            """'' when the request is signed correctly (or anonymous allowed), else the S3 error code."""
            auth = self.headers.get("Authorization")
            if not auth:
                return "AccessDenied" if s3.require_auth else ""
            m = re.fullmatch(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, "
                             r"SignedHeaders=([^,]+), Signature=([0-9a-f]{64})", auth)
            if m is None:
                return "AuthorizationHeaderMalformed"
            access, _date, region, signed_headers, sig = m.groups()
            secret = s3.secrets.get(access)
            if secret is None:
                return "InvalidAccessKeyId"
            url = urlsplit(self.path)
            signed = signed_headers.split(";")
            headers = {h: self.headers.get(h, "") for h in signed}
            pairs = [p.partition("=") for p in url.query.split("&")] if url.query else []
            query = "&".join(f"{k}={v}" for k, _, v in sorted(pairs))
            creq = canonical_request(self.command, url.path, query, headers, signed,
                                     self.headers.get("x-amz-content-sha256", ""))
            want = signature(Credentials(access, secret), self.headers.get("x-amz-date", ""), region, "s3", creq)
            return "" if want == sig else "SignatureDoesNotMatch"

        def do_GET(self) -> None:
            self._route()

        def do_HEAD(self) -> None:
            self._route()

        def do_POST(self) -> None:
            self._route()

        def _route(self) -> None:
            url = urlsplit(self.path)
            entry = Logged(self.command, self.path, self.headers.get("Range"),
                           self.headers.get("Authorization") is not None)
            with s3._lock:
                s3.log.append(entry)
            query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            form: dict[str, str] = {}
            if self.command == "POST":
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with s3._lock:
                    s3.bodies.append(body)
                form = {k: v[0] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()}
            try:
                if url.path == "/creds":
                    return self._send(entry, 200, (
                        f'{{"AccessKeyId": "{ACCESS_KEY}", "SecretAccessKey": "{SECRET_KEY}",'
                        ' "Token": "container-session-token", "Expiration": "2999-01-01T00:00:00Z"}').encode(),
                        ctype="application/json")
                if url.path == "/sts/" and "WebIdentityToken" in query:
                    return self._err(entry, 400, "TokenInTheUrl")
                if url.path == "/sts/" and form.get("Action") == "AssumeRoleWithWebIdentity":
                    if not form.get("WebIdentityToken"):
                        return self._err(entry, 400, "InvalidIdentityToken")
                    return self._send(entry, 200, (
                        "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
                        "<AssumeRoleWithWebIdentityResult><Credentials>"
                        f"<AccessKeyId>{ACCESS_KEY}</AccessKeyId><SecretAccessKey>{SECRET_KEY}</SecretAccessKey>"
                        "<SessionToken>web-identity-session-token</SessionToken>"
                        "<Expiration>2999-01-01T00:00:00Z</Expiration>"
                        "</Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>"
                    ).encode())
                err = self._check_sig()
                if err:
                    return self._err(entry, 403, err)
                bucket, _, key = unquote(url.path).lstrip("/").partition("/")
                objs = s3.buckets.get(bucket)
                if objs is None:
                    return self._err(entry, 404, "NoSuchBucket")
                if not key and self.command == "GET" and query.get("list-type") == "2":
                    return self._list(entry, bucket, objs, query)
                if key and s3.redirect_to:
                    return self._send(entry, 307, b"", {"Location": s3.redirect_to + self.path})
                obj = objs.get(key)
                if obj is None:
                    return self._err(entry, 404, "NoSuchKey")
                return self._object(entry, key, obj, query)
            except (BrokenPipeError, ConnectionResetError):
                return None

        def _list(self, entry: Logged, bucket: str, objs: dict[str, Obj], query: dict[str, str]) -> None:
            prefix = query.get("prefix", "")
            keys = sorted(k for k in objs if k.startswith(prefix))
            start = int(base64.urlsafe_b64decode(query["continuation-token"]).decode()) if query.get(
                "continuation-token") else 0
            page = keys[start:start + s3.page_size]
            truncated = start + s3.page_size < len(keys)
            items = "".join(f"<Contents><Key>{escape(k)}</Key><LastModified>{objs[k].last_modified_iso}</LastModified>"
                            f"<Size>{s3.listed_size.get(k, len(objs[k].data))}</Size>"
                            f"<ETag>&quot;{objs[k].etag}&quot;</ETag><StorageClass>STANDARD</StorageClass></Contents>"
                            for k in page)
            nxt = ""
            if truncated:
                # a token with characters that need encoding, as real S3 tokens have
                token = base64.urlsafe_b64encode(str(start + s3.page_size).encode()).decode()
                nxt = f"<NextContinuationToken>{token}=+/</NextContinuationToken>"
            body = ('<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                    f"<Name>{bucket}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(page)}</KeyCount>"
                    f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{nxt}{items}</ListBucketResult>")
            self._send(entry, 200, body.encode())

        def _object(self, entry: Logged, key: str, obj: Obj, query: dict[str, str]) -> None:
            data = obj.data
            if key in s3.corrupt and data:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            headers = {"ETag": f'"{obj.etag}"', "Last-Modified": obj.last_modified_http, "Accept-Ranges": "bytes",
                       **self._request_id()}
            if obj.sse:
                headers["x-amz-server-side-encryption"] = obj.sse
            if obj.checksum_sha256 and self.headers.get("x-amz-checksum-mode") == "ENABLED":
                headers["x-amz-checksum-sha256"] = obj.checksum_sha256
                headers["x-amz-checksum-type"] = "FULL_OBJECT"
            im = self.headers.get("If-Match")
            if im is not None and im.strip() != "*" and obj.etag not in {t.strip().strip('"') for t in im.split(",")}:
                return self._err(entry, 412, "PreconditionFailed")
            status = 200
            start = 0
            if "partNumber" in query:
                n = int(query["partNumber"])
                ps = obj.part_size or len(data)
                start, end = (n - 1) * ps, min(n * ps, len(data))
                if start >= len(data):
                    return self._err(entry, 416, "InvalidPartNumber")
                headers["x-amz-mp-parts-count"] = str(max(1, -(-len(data) // ps)))
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
                data = data[start:end]
                status = 206
                if key in s3.part1_size and n == 1:
                    data = b"\0" * s3.part1_size[key]
            elif rng := self.headers.get("Range"):
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng)
                if m is None or int(m.group(1)) >= len(data):
                    return self._err(entry, 416, "InvalidRange", {"Content-Range": f"bytes */{len(obj.data)}"})
                start = int(m.group(1))
                end = min(int(m.group(2)) + 1, len(data)) if m.group(2) else len(data)
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(obj.data)}"
                data = data[start:end]
                status = 206
            if self.command == "GET" and key in s3.oversize:
                data += b"\0" * s3.oversize[key]
            write_body(self, entry, status, data, headers, s3.slow.get(key), start)

    return Handler
