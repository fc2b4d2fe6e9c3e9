"""``s3://bucket/prefix``: ListObjectsV2, HeadObject and ranged GetObject, signed with SigV4 (sigv4.py).

- The "commit" of an S3 prefix is the sha256 of its sorted ``path<TAB>etag<TAB>size`` lines: any upload,
  delete or overwrite under the prefix changes it. A 64-hex ``revision`` must equal it (a pin); any other
  revision (``main``, empty) is recorded but not checked.
- Checks per object, strongest first: a ``SHA256SUMS`` file at the prefix root (``sha256sum`` format);
  the object's full-object ``x-amz-checksum-sha256``; the ETag: the MD5 of a single-part upload, or the
  MD5 of the part MD5s for a multipart upload (part size from ``HeadObject?partNumber=1``). An object
  encrypted with SSE-KMS/SSE-C has an ETag that is no MD5: it is staged with ``verifiedBy: none`` and named
  in the result's ``unverifiedFiles``.
- Resume: ``Range: bytes=<partial size>-`` with ``If-Match: <etag>``; an object changed since the listing
  answers 412 and the run fails with SourceChanged (run it again for the new commit).

Endpoint and addressing: ``AWS_ENDPOINT_URL_S3`` (path-style, for MinIO, Ceph, R2...) or virtual-hosted
``https://<bucket>.s3.<region>.amazonaws.com``; region from ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` (default
us-east-1). ``KIMIK3_S3_ADDRESSING=path|virtual`` overrides. ``AWS_ENDPOINT_URL`` is not read: it redirects
every AWS service, the credential exchange included (sigv4.py).

What a server says is bounded: response bodies read into memory (listings, errors, ``SHA256SUMS``) have a
size limit, sizes must be numbers, and a multipart ETag's part count must agree with the object's size and
first part (a one-byte "part" of a huge object would mean an md5 per byte).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import requests

from ..contract.stager import CONTENT_COMMIT
from .digests import SUMS_NAMES, parse_sha256sums
from .errors import WeightsError
from .listing import parse_size
from .manifest import FileEntry, Manifest
from .sigv4 import CredentialProvider, canonical_query, sign, uri_encode
from .source import PartialWriter, RemoteFile

log = logging.getLogger(__name__)

_MD5 = re.compile(r"^[0-9a-f]{32}$")
_MULTIPART = re.compile(r"^([0-9a-f]{32})-(\d+)$")
RETRIES = 5
CHUNK = 1024 * 1024
TIMEOUT = (10.0, 120.0)
MAX_BODY = 64 * 1024 * 1024
"""Largest response body read into memory: a listing page, an error, a SHA256SUMS file."""
MAX_PARTS = 10_000
"""S3's own limit on the parts of a multipart upload."""


def read_body(r: requests.Response, what: str, limit: int = MAX_BODY) -> bytes:
    """The body of a streamed response, at most ``limit`` bytes (a server cannot make the stager hold more)."""
    out = bytearray()
    try:
        for chunk in r.iter_content(CHUNK):
            out += chunk
            if len(out) > limit:
                raise WeightsError("S3Error", f"{what}: the answer is larger than {limit} bytes")
    except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
        raise WeightsError("S3Unreachable", f"{what}: {type(exc).__name__} while reading the answer") from exc
    finally:
        r.close()
    return bytes(out)


def _strip_etag(etag: str) -> str:
    return etag.strip().removeprefix("W/").strip('"').lower()


def _xml_children(root: ET.Element, name: str) -> Iterator[ET.Element]:
    for el in root:
        if el.tag.rsplit("}", 1)[-1] == name:
            yield el


def _xml_text(el: ET.Element, name: str, default: str = "") -> str:
    for child in el:
        if child.tag.rsplit("}", 1)[-1] == name:
            return child.text or ""
    return default


class S3Client:
    def __init__(self, env: Mapping[str, str], session: requests.Session | None = None) -> None:
        self.region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.endpoint = (env.get("AWS_ENDPOINT_URL_S3") or "").rstrip("/")
        addressing = env.get("KIMIK3_S3_ADDRESSING", "")
        self.path_style = addressing == "path" or (addressing != "virtual" and bool(self.endpoint))
        self.session = session or requests.Session()
        self.creds = CredentialProvider(env, self._plain)

    def _plain(self, method: str, url: str, headers: dict[str, str], body: bytes | None) -> tuple[int, bytes]:
        """An unsigned call to a credentials endpoint. Its failure names neither the URL nor the exception's
        text (both can carry what was sent)."""
        what = f"{method} to the credentials endpoint"
        try:
            r = self.session.request(method, url, headers=headers, data=body, timeout=TIMEOUT, stream=True,
                                     allow_redirects=False)
        except requests.RequestException as exc:
            raise WeightsError("CredentialsUnavailable", f"{what} failed: {type(exc).__name__}") from None
        return r.status_code, read_body(r, what)

    def url(self, bucket: str, key: str = "", query: Mapping[str, str] | None = None) -> str:
        path = "/" + uri_encode(key, keep_slash=True) if key else "/"
        if self.path_style:
            base = self.endpoint or f"https://s3.{self.region}.amazonaws.com"
            path = f"/{bucket}" + (path if key else "")
        elif self.endpoint:
            scheme, _, host = self.endpoint.partition("://")
            base = f"{scheme}://{bucket}.{host}"
        else:
            base = f"https://{bucket}.s3.{self.region}.amazonaws.com"
        q = canonical_query(query) if query else ""
        return base + path + (f"?{q}" if q else "")

    def request(self, method: str, bucket: str, key: str = "", *, query: Mapping[str, str] | None = None,
                headers: Mapping[str, str] | None = None,
                ok: Sequence[int] = (200,)) -> requests.Response:
        """The response, streamed: read its body with ``read_body`` (bounded) or ``iter_content``."""
        url = self.url(bucket, key, query)
        delay = 1.0
        for attempt in range(1, RETRIES + 1):
            signed = sign(method, url, dict(headers or {}), self.creds.get(), self.region)
            try:
                r = self.session.request(method, url, headers=signed, stream=True, timeout=TIMEOUT,
                                         allow_redirects=False)
            except (requests.ConnectionError, requests.Timeout) as exc:
                if attempt == RETRIES:
                    raise WeightsError("S3Unreachable", f"{method} s3://{bucket}/{key}: {type(exc).__name__}") from exc
            else:
                if r.status_code in ok:
                    return r
                if r.status_code not in (429, 500, 502, 503, 504) or attempt == RETRIES:
                    raise _s3_error(r, method, bucket, key)
                r.close()
            time.sleep(delay)
            delay = min(delay * 2, 16.0)
        raise AssertionError("unreachable")

    def list_objects(self, bucket: str, prefix: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        token = ""
        for _ in range(100_000):  # bounded: 1000 keys per page
            q = {"list-type": "2", "prefix": prefix}
            if token:
                q["continuation-token"] = token
            body = read_body(self.request("GET", bucket, query=q), f"listing s3://{bucket}/{prefix}")
            try:
                root = ET.fromstring(body)
            except ET.ParseError as exc:
                raise WeightsError("S3Error", f"s3://{bucket}/{prefix}: the listing is not XML") from exc
            for c in _xml_children(root, "Contents"):
                key = _xml_text(c, "Key")
                out.append({"key": key, "size": parse_size(_xml_text(c, "Size", "0"), key),
                            "etag": _strip_etag(_xml_text(c, "ETag"))})
            if _xml_text(root, "IsTruncated").lower() != "true":
                return out
            token = _xml_text(root, "NextContinuationToken")
            if not token:
                raise WeightsError("S3Error", f"s3://{bucket}/{prefix}: truncated listing without a continuation token")
        raise WeightsError("S3Error", f"s3://{bucket}/{prefix}: listing does not end")


def _s3_error(r: requests.Response, method: str, bucket: str, key: str) -> WeightsError:
    where = f"{method} s3://{bucket}/{key}".rstrip("/")
    code = ""
    try:
        body = read_body(r, where, limit=64 * 1024)
        code = _xml_text(ET.fromstring(body), "Code") if body else ""  # not cut: masked whole, later
    except (ET.ParseError, WeightsError):
        pass
    if r.status_code in (401, 403):
        return WeightsError("Unauthorized", f"{where}: HTTP {r.status_code} {code}".strip())
    if r.status_code == 404:
        return WeightsError("NotFound", f"{where}: {code or 'not found'}")
    if r.status_code == 412:
        return WeightsError("SourceChanged", f"{where}: the object changed since it was listed; stage again")
    return WeightsError("S3Error", f"{where}: HTTP {r.status_code} {code}".strip())


def multipart_part_size(rf: RemoteFile, parts: int, part: int) -> int:
    """``part`` (the size of part 1) when ``parts`` parts of it make ``rf``; else InvalidSource."""
    if parts > MAX_PARTS:
        raise WeightsError("InvalidSource", f"{rf.path}: the ETag claims {parts} parts; S3 allows {MAX_PARTS}")
    if -(-rf.size // part) != parts:
        raise WeightsError("InvalidSource", f"{rf.path}: {rf.size} bytes in parts of {part} bytes make "
                                            f"{-(-rf.size // part)} parts, the ETag says {parts}")
    return part


class S3Source:
    fetches = True

    def __init__(self, bucket: str, prefix: str, *, env: Mapping[str, str],
                 session: requests.Session | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = S3Client(env, session)
        self._objects: list[dict[str, Any]] | None = None
        self._sums: dict[str, str] = {}
        self.commit = ""

    def secrets(self) -> list[str]:
        return self.client.creds.secrets()

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def resolve(self, revision: str, previous: Manifest | None) -> str:
        list_prefix = f"{self.prefix}/" if self.prefix else ""
        objs = []
        for o in self.client.list_objects(self.bucket, list_prefix):
            rel = o["key"][len(list_prefix):]
            if not rel or rel.endswith("/"):
                continue  # "folder" placeholder objects
            objs.append({**o, "path": rel})
        objs.sort(key=lambda o: o["path"])
        if not objs:
            raise WeightsError("NoFiles", f"s3://{self.bucket}/{self.prefix} has no objects")
        lines = "".join(f"{o['path']}\t{o['etag']}\t{o['size']}\n" for o in objs)
        self.commit = hashlib.sha256(lines.encode()).hexdigest()
        if revision and CONTENT_COMMIT.match(revision) and revision != self.commit:
            raise WeightsError("RevisionMismatch", f"s3://{self.bucket}/{self.prefix} now hashes to {self.commit}, "
                                                   f"not the pinned {revision}: its objects changed")
        self._objects = objs
        return self.commit

    def _load_sums(self) -> dict[str, str]:
        assert self._objects is not None
        for o in self._objects:
            if o["path"] in SUMS_NAMES:
                r = self.client.request("GET", self.bucket, self._key(o["path"]))
                return parse_sha256sums(read_body(r, f"s3://{self.bucket}/{self._key(o['path'])}").decode(
                    errors="replace"))
        return {}

    def list_files(self, commit: str | None) -> list[RemoteFile]:
        assert self._objects is not None
        self._sums = self._load_sums()
        out = []
        for o in self._objects:
            expected: dict[str, str] = {}
            if o["path"] in self._sums:
                expected["sha256"] = self._sums[o["path"]]
            out.append(RemoteFile(o["path"], o["size"], o["etag"], expected))
        return out

    def prepare(self, rf: RemoteFile) -> RemoteFile:
        """One HEAD per object that is hashed or fetched: encryption (is the ETag an MD5?), a full-object
        sha256 checksum if the uploader stored one, and the part size of a multipart upload."""
        if "sha256" in rf.expected:
            return rf
        expected = dict(rf.expected)
        head = self.client.request("HEAD", self.bucket, self._key(rf.path), headers={"x-amz-checksum-mode": "ENABLED"})
        head.close()
        h = head.headers
        sse = h.get("x-amz-server-side-encryption", "").lower()
        sse_c = h.get("x-amz-server-side-encryption-customer-algorithm")
        checksum = h.get("x-amz-checksum-sha256", "")
        if checksum and "-" not in checksum and h.get("x-amz-checksum-type", "FULL_OBJECT") == "FULL_OBJECT":
            try:
                expected["sha256"] = base64.b64decode(checksum).hex()
            except ValueError:
                pass
        if sse in ("aws:kms", "aws:kms:dsse") or sse_c:
            pass  # ETag is no MD5 of the content
        elif _MD5.match(rf.identity):
            expected["md5"] = rf.identity
        elif (m := _MULTIPART.match(rf.identity)) and int(m.group(2)) > 1:
            p1 = self.client.request("HEAD", self.bucket, self._key(rf.path), query={"partNumber": "1"},
                                     ok=(200, 206))
            p1.close()
            part = parse_size(p1.headers.get("Content-Length", "0") or "0", rf.path)
            if 0 < part < rf.size:
                expected["s3-multipart"] = f"{rf.identity}/{multipart_part_size(rf, int(m.group(2)), part)}"
        elif (m := _MULTIPART.match(rf.identity)):  # one-part multipart upload: md5 of the single part md5
            expected["s3-multipart"] = f"{rf.identity}/{max(rf.size, 1)}"
        if not expected:
            log.warning("%s: no checksum to verify against (ETag %s, encryption %s)", rf.path, rf.identity,
                        sse or sse_c or "none")
        return RemoteFile(rf.path, rf.size, rf.identity, expected)

    def fetch(self, rf: RemoteFile, out: PartialWriter) -> None:
        stalls = 0
        while out.offset < rf.size or rf.size == 0:
            start = out.offset
            headers = {"If-Match": f'"{rf.identity}"'}
            if start:
                headers["Range"] = f"bytes={start}-"
            r = self.client.request("GET", self.bucket, self._key(rf.path), headers=headers, ok=(200, 206))
            try:
                if start and r.status_code == 200:
                    out.restart()  # Range ignored: the body is the whole object
                for chunk in r.iter_content(CHUNK):
                    if chunk:
                        out.write(chunk)
                if rf.size == 0:
                    return
                if out.offset >= rf.size:
                    return
                raise requests.ConnectionError("response ended early")
            except (requests.ConnectionError, requests.Timeout,
                    requests.exceptions.ChunkedEncodingError) as exc:
                stalls = 0 if out.offset > start else stalls + 1
                if stalls >= RETRIES:
                    raise WeightsError("DownloadFailed", f"{rf.path}: {type(exc).__name__} at byte {out.offset}"
                                       ) from exc
                log.warning("%s: %s at byte %d, resuming", rf.path, type(exc).__name__, out.offset)
                time.sleep(min(2.0 ** stalls, 16.0))
            finally:
                r.close()

    def final_commit(self, entries: Sequence[FileEntry]) -> str:
        return self.commit
