"""A Hugging Face Hub on loopback, implementing what huggingface_hub 2.x calls for a download:

- ``GET  /api/models/{org}/{name}/revision/{rev}``     model_info: ``{"id", "sha", "siblings"}``
- ``GET  /api/models/{org}/{name}/tree/{rev}[/{path}]`` list_repo_tree, paginated with a ``Link: rel="next"``
  header; LFS files carry ``lfs: {oid: sha256, size, pointerSize}``
- ``POST /api/models/{org}/{name}/paths-info/{rev}``    get_paths_info
- ``HEAD|GET /{org}/{name}/resolve/{rev}/{path}``      regular files: 200 with ``ETag`` (git blob id),
  ``X-Repo-Commit``; LFS files: 302 to the "CDN" with ``X-Linked-Etag`` (sha256), ``X-Linked-Size``,
  ``X-Repo-Commit``
- ``HEAD|GET /cdn/{sha256}``                           the LFS bytes, with ``Range`` (206 +
  ``Content-Range``); served by a second listener on 127.0.0.2, another origin, as a real CDN is, so the
  client must not send it the token

Errors carry ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound) as the Hub does. Every
request is logged (method, path, Range, whether it carried the token) for the tests to count.
Knobs: ``slow`` (serve a file's first bytes at full speed, then trickle, bounded), ``corrupt`` (flip a byte
of what is served), ``ignore_range`` (answer 200 to a Range request), ``page_size``; and for the security
tests, what a hostile or misconfigured Hub does: ``oversize`` (per path: append this many bytes to what a
GET sends), ``listed_size`` (per path: the size the tree lists, any JSON value), ``foreign`` (which of
``pages``, ``model_info``, ``tree``, ``resolve`` send the client to another origin by a ``Link`` or a 302:
``foreign_base``, by default the second listener, which serves the same API).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


@dataclass
class Logged:
    host: str
    method: str
    path: str
    range: str | None
    authorized: bool
    status: int = 0
    sent: int = 0  # body bytes sent


@dataclass
class Repo:
    refs: dict[str, str]  # branch/tag -> commit
    commits: dict[str, dict[str, bytes]]  # commit -> path -> content
    token: str | None = None  # required bearer token (private repo)


def send(handler: BaseHTTPRequestHandler, entry: Any, status: int, body: bytes,
         headers: dict[str, str] | None, content_type: str) -> None:
    """Send a whole small response (JSON, XML, an error) and log it on `entry`."""
    entry.status = status
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.end_headers()
    if handler.command != "HEAD" and body:
        handler.wfile.write(body)
        entry.sent += len(body)


def write_body(handler: BaseHTTPRequestHandler, entry: Any, status: int, data: bytes,
               headers: dict[str, str], slow: Slow | None, start: int) -> None:
    """Send a (possibly partial) body, optionally trickled and cut at a bound to simulate a kill."""
    entry.status = status
    handler.send_response(status)
    handler.send_header("Content-Length", str(len(data)))
    handler.send_header("Content-Type", "application/octet-stream")
    for k, v in headers.items():
        handler.send_header(k, v)
    handler.end_headers()
    if handler.command == "HEAD":
        return
    if slow is None:
        handler.wfile.write(data)
        entry.sent += len(data)
        return
    fast = max(0, slow.fast_bytes - start)
    handler.wfile.write(data[:fast])
    entry.sent += len(data[:fast])
    handler.wfile.flush()
    deadline = time.monotonic() + slow.max_seconds
    pos = fast
    while pos < len(data) and time.monotonic() < deadline:
        handler.wfile.write(data[pos:pos + slow.chunk])
        handler.wfile.flush()
        entry.sent += len(data[pos:pos + slow.chunk])
        pos += slow.chunk
        time.sleep(slow.delay)
    if pos < len(data):  # bound reached: cut the connection mid-body
        handler.close_connection = True


@dataclass
class Slow:
    fast_bytes: int  # served at full speed
    chunk: int = 64 * 1024
    delay: float = 0.05  # between trickled chunks
    max_seconds: float = 20.0  # bound: after this the response is cut


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    page_size: int = 1000
    slow: dict[str, Slow] = field(default_factory=dict)  # sha256 or path -> Slow
    corrupt: set[str] = field(default_factory=set)  # paths served with a flipped byte
    ignore_range: bool = False
    oversize: dict[str, int] = field(default_factory=dict)
    listed_size: dict[str, Any] = field(default_factory=dict)
    foreign: set[str] = field(default_factory=set)
    foreign_base: str = ""
    log: list[Logged] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---------------------------------------------------------- setup
    def add_repo(self, repo_id: str, files: dict[str, bytes], *, branch: str = "main", token: str | None = None,
                 commit: str | None = None) -> str:
        commit = commit or hashlib.sha1(repr(sorted((k, hashlib.sha256(v).hexdigest())
                                                    for k, v in files.items())).encode()).hexdigest()
        repo = self.repos.setdefault(repo_id, Repo(refs={}, commits={}, token=token))
        repo.commits[commit] = dict(files)
        repo.refs[branch] = commit
        return commit

    @staticmethod
    def is_lfs(path: str) -> bool:
        return path.endswith(LFS_SUFFIXES)

    def start(self) -> FakeHub:
        self.api = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "hub"))
        self.cdn = ThreadingHTTPServer(("127.0.0.2", 0), _handler(self, "cdn"))
        self.api.daemon_threads = self.cdn.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.api.server_address[1]}"
        self.cdn_base = f"http://127.0.0.2:{self.cdn.server_address[1]}"
        self._threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
                         for s in (self.api, self.cdn)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        for s in (self.api, self.cdn):
            s.shutdown()
            s.server_close()

    # ---------------------------------------------------------- queries for tests
    def reset_log(self) -> None:
        with self._lock:
            self.log.clear()

    def requests(self, *, host: str | None = None, method: str | None = None, path_contains: str = "") -> list[Logged]:
        with self._lock:
            return [r for r in self.log if (host is None or r.host == host) and (method is None or r.method == method)
                    and path_contains in r.path]

    def file_downloads(self) -> list[Logged]:
        """GETs that carry file bytes (resolve of regular files, CDN of LFS files)."""
        return [r for r in self.requests(method="GET") if r.host == "cdn" or "/resolve/" in r.path]

    # ---------------------------------------------------------- lookups
    def resolve(self, repo_id: str, rev: str) -> tuple[Repo, str] | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            return None
        commit = repo.refs.get(rev, rev if rev in repo.commits else None)
        return (repo, commit) if commit else None

    def blob(self, sha256: str) -> tuple[str, bytes] | None:
        for repo in self.repos.values():
            for files in repo.commits.values():
                for path, data in files.items():
                    if hashlib.sha256(data).hexdigest() == sha256:
                        return path, data
        return None

    def tree_entry(self, path: str, data: bytes) -> dict[str, Any]:
        size = self.listed_size.get(path, len(data))
        e: dict[str, Any] = {"type": "file", "oid": git_blob_sha1(data), "size": size, "path": path}
        if self.is_lfs(path):
            e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134}
        return e


def _handler(hub: FakeHub, host: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        # ------------------------------------------------------ plumbing
        def _record(self) -> Logged:
            entry = Logged(host=host, method=self.command, path=self.path, range=self.headers.get("Range"),
                           authorized=self.headers.get("Authorization") is not None)
            with hub._lock:
                hub.log.append(entry)
            return entry

        def _send(self, entry: Logged, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  content_type: str = "application/json") -> None:
            send(self, entry, status, body, headers, content_type)

        def _error(self, entry: Logged, status: int, code: str) -> None:
            self._send(entry, status, json.dumps({"error": code}).encode(), {"X-Error-Code": code,
                                                                            "X-Error-Message": code})

        def _authorized(self, repo: Repo) -> bool:
            return repo.token is None or self.headers.get("Authorization") == f"Bearer {repo.token}"

        def _body_read(self) -> bytes:
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        # ------------------------------------------------------ routes
        def do_HEAD(self) -> None:
            self._route()

        def do_GET(self) -> None:
            self._route()

        def do_POST(self) -> None:
            self._route()

        def _route(self) -> None:
            entry = self._record()
            url = urlsplit(self.path)
            path = unquote(url.path)
            query = parse_qs(url.query)
            try:
                if host == "cdn" and url.path.startswith("/cdn/"):
                    m = re.fullmatch(r"/cdn/([0-9a-f]{64})", url.path)
                    found = hub.blob(m.group(1)) if m else None
                    if m is None or found is None:
                        return self._error(entry, 404, "EntryNotFound")
                    return self._serve_bytes(entry, found[0], found[1], {"ETag": f'"{m.group(1)}"'})
                if host == "hub" and (hop := self._foreign_hop(path)):
                    return self._send(entry, 302, b"", {"Location": f"{hub.foreign_base or hub.cdn_base}{self.path}",
                                                        "X-Foreign-Hop": hop})
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/(.+)", path):
                    return self._model_info(entry, m.group(1), m.group(2))
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path):
                    return self._tree(entry, m.group(1), m.group(2), m.group(3) or "", query)
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/paths-info/([^/]+)", path):
                    return self._paths_info(entry, m.group(1), m.group(2))
                if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                    return self._resolve(entry, m.group(1), m.group(2), m.group(3))
                return self._error(entry, 404, "NotFound")
            except (BrokenPipeError, ConnectionResetError):
                return None

        def _foreign_hop(self, path: str) -> str:
            """The ``foreign`` knob this request falls under ("" when it is served here)."""
            kinds = {"model_info": "/revision/", "tree": "/tree/", "resolve": "/resolve/"}
            return next((k for k, part in kinds.items() if k in hub.foreign and part in path
                         and (k != "resolve" or not hub.is_lfs(path))), "")

        def _repo(self, entry: Logged, repo_id: str, rev: str) -> tuple[Repo, str] | None:
            repo = hub.repos.get(repo_id)
            if repo is None or not self._authorized(repo):
                # the Hub answers 401 for private repos without a valid token, 404 for missing ones
                self._error(entry, 401 if repo is not None else 404, "RepoNotFound")
                return None
            found = hub.resolve(repo_id, rev)
            if found is None:
                self._error(entry, 404, "RevisionNotFound")
                return None
            return found

        def _model_info(self, entry: Logged, repo_id: str, rev: str) -> None:
            found = self._repo(entry, repo_id, rev)
            if found is None:
                return
            repo, commit = found
            body = {"id": repo_id, "modelId": repo_id, "sha": commit, "private": repo.token is not None,
                    "siblings": [{"rfilename": p} for p in sorted(repo.commits[commit])]}
            self._send(entry, 200, json.dumps(body).encode())

        def _tree(self, entry: Logged, repo_id: str, rev: str, sub: str, query: dict[str, list[str]]) -> None:
            found = self._repo(entry, repo_id, rev)
            if found is None:
                return
            repo, commit = found
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            files = repo.commits[commit]
            prefix = f"{sub.rstrip('/')}/" if sub else ""
            entries: list[dict[str, Any]] = []
            dirs: set[str] = set()
            for p in sorted(files):
                if not p.startswith(prefix):
                    continue
                rest = p[len(prefix):]
                parts = rest.split("/")
                for i in range(1, len(parts)):
                    d = prefix + "/".join(parts[:i])
                    if (recursive or i == 1) and d not in dirs:
                        dirs.add(d)
                        entries.append({"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(),
                                        "size": 0, "path": d})
                if recursive or len(parts) == 1:
                    entries.append(hub.tree_entry(p, files[p]))
            cursor = int(query.get("cursor", ["0"])[0])
            page = entries[cursor:cursor + hub.page_size]
            headers = {}
            if cursor + hub.page_size < len(entries):
                base = (hub.foreign_base or hub.cdn_base) if "pages" in hub.foreign else hub.endpoint
                nxt = (f"{base}/api/models/{repo_id}/tree/{quote(rev, safe='')}"
                       f"{'/' + quote(sub, safe='') if sub else ''}?recursive={str(recursive)}"
                       f"&expand=False&cursor={cursor + hub.page_size}")
                headers["Link"] = f'<{nxt}>; rel="next"'
            self._send(entry, 200, json.dumps(page).encode(), headers)

        def _paths_info(self, entry: Logged, repo_id: str, rev: str) -> None:
            form = parse_qs(self._body_read().decode())
            found = self._repo(entry, repo_id, rev)
            if found is None:
                return
            repo, commit = found
            files = repo.commits[commit]
            out = [hub.tree_entry(p, files[p]) for p in form.get("paths", []) if p in files]
            self._send(entry, 200, json.dumps(out).encode())

        def _resolve(self, entry: Logged, repo_id: str, rev: str, path: str) -> None:
            found = self._repo(entry, repo_id, rev)
            if found is None:
                return
            repo, commit = found
            data = repo.commits[commit].get(path)
            if data is None:
                return self._send(entry, 404, b"{}", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit})
            if hub.is_lfs(path):
                sha = hashlib.sha256(data).hexdigest()
                headers = {"Location": f"{hub.cdn_base}/cdn/{sha}?expires=1", "X-Repo-Commit": commit,
                           "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                           "ETag": f'"{git_blob_sha1(data)}"'}
                return self._send(entry, 302, b"", headers)
            headers = {"X-Repo-Commit": commit, "ETag": f'"{git_blob_sha1(data)}"'}
            return self._serve_bytes(entry, path, data, headers)

        def _serve_bytes(self, entry: Logged, path: str, data: bytes, headers: dict[str, str]) -> None:
            if path in hub.corrupt and data:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            headers = {**headers, "Accept-Ranges": "bytes"}
            rng = self.headers.get("Range")
            start = 0
            status = 200
            if rng and not hub.ignore_range:
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
                if m is None or int(m.group(1)) >= max(len(data), 1):
                    return self._send(entry, 416, b"", {"Content-Range": f"bytes */{len(data)}"})
                start = int(m.group(1))
                end = int(m.group(2)) + 1 if m.group(2) else len(data)
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
                data = data[start:end]
                status = 206
            if self.command == "GET" and path in hub.oversize:
                data += b"\0" * hub.oversize[path]
            write_body(self, entry, status, data, headers, hub.slow.get(path), start)

    return Handler
