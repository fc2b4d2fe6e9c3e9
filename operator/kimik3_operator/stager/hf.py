"""``hf://org/name`` through huggingface_hub (the only module that imports it).

What is used from huggingface_hub, and why not ``snapshot_download``/``hf_hub_download``:

- ``HfApi.model_info(repo, revision=...)`` resolves ``main`` (or a tag) to the commit sha.
- ``HfApi.list_repo_tree(repo, recursive=True, revision=<commit>)`` lists every file with its size, git blob
  id and, for LFS files, ``lfs.sha256``: the checksums the downloads are verified against.
- ``get_hf_file_metadata(hf_hub_url(...))`` is the Hub's HEAD on ``/resolve/<commit>/<path>``: where the
  bytes are (a CDN redirect for LFS files), the ETag and the size.
- ``http_get(url, file, resume_size=N)`` transfers the bytes with the Hub's retry logic, sending
  ``Range: bytes=N-`` when resuming.

``hf_hub_download(local_dir=...)`` in huggingface_hub 2.x writes to a process-unique ``*.incomplete`` file
and deletes it when the download fails (``_download_to_tmp_and_move``), so a killed Job restarts every
file from zero; on a 1.6 TB checkpoint that is hours lost per preemption. The stager keeps its own partial
file per file and resumes it with ``http_get(resume_size=...)``.

Xet: files served from Xet storage are fetched over the Hub's plain HTTP bridge (the ``/resolve``
redirect), which supports Range; the hf_xet client is not used, so Xet's chunk deduplication is not used
either.

The token goes to the configured endpoint's origin (scheme, host, port) and nowhere else, whatever asks
for another: a pagination ``Link``, a redirect, a CDN location. huggingface_hub would follow a next-page
link anywhere with the same headers and forward the token to any "Hub host" on a redirect; every request it
makes goes through one httpx client, whose request hook here drops the ``Authorization`` header of any
request to another origin (``_token_stays_home``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

# Before huggingface_hub reads its settings: a staging Job sends no telemetry and fetches no agent registry
# (huggingface_hub 2.x calls {endpoint}/api/agent-harnesses to build its user agent unless this is set).
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import httpx2
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url, set_client_factory
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # a lazy export mypy cannot see
from huggingface_hub.utils._http import default_client_factory

from ..contract.stager import HUB_COMMIT
from .errors import WeightsError
from .listing import parse_size
from .manifest import FileEntry, Manifest
from .source import PartialWriter, RemoteFile

log = logging.getLogger(__name__)


class _Silent:
    """A tqdm stand-in: the stager reports progress from the bytes written, not from bars on stderr."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def update(self, n: float | None = 1) -> None:
        pass

    def close(self) -> None:
        pass


Origin = tuple[str, str, int | None]


def _origin(url: str) -> Origin:
    p = urlsplit(url)
    return p.scheme.lower(), (p.hostname or "").lower(), p.port or {"http": 80, "https": 443}.get(p.scheme.lower())


_HOMES: dict[str, Origin] = {}
"""Each token the stager was given -> the one origin it may be sent to (tests run several sources at once)."""


def _token_stays_home(request: httpx2.Request) -> None:
    auth = request.headers.get("authorization")
    if auth is None:
        return
    token = auth.partition(" ")[2]
    if _HOMES.get(token) != _origin(str(request.url)):
        del request.headers["authorization"]


def _guarded_client() -> httpx2.Client:
    client = default_client_factory()
    client.event_hooks = {**client.event_hooks, "request": [*client.event_hooks["request"], _token_stays_home]}
    return client


set_client_factory(_guarded_client)


def _hub_error(exc: Exception, repo_id: str, revision: str) -> WeightsError:
    if isinstance(exc, RevisionNotFoundError):
        return WeightsError("RevisionNotFound", f"hf://{repo_id} has no revision {revision!r}")
    if isinstance(exc, GatedRepoError):
        return WeightsError("Unauthorized", f"hf://{repo_id} is gated: the token lacks access")
    if isinstance(exc, RepositoryNotFoundError):
        return WeightsError("RepositoryNotFound",
                            f"hf://{repo_id} does not exist or the token (if any) cannot see it")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        if status in (401, 403):
            return WeightsError("Unauthorized", f"hf://{repo_id}: HTTP {status}")
        return WeightsError("HubError", f"hf://{repo_id}: HTTP {status}")
    if isinstance(exc, (httpx2.TransportError, OSError)):
        return WeightsError("HubUnreachable", f"hf://{repo_id}: {type(exc).__name__}: {exc}")
    return WeightsError("HubError", f"hf://{repo_id}: an answer the stager cannot read ({type(exc).__name__}: {exc})")


class HfSource:
    fetches = True

    def __init__(self, repo_id: str, *, token: str | None, endpoint: str | None) -> None:
        self.repo_id = repo_id
        self.token: str | bool = token or False  # never fall back to a token file found on the node
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        self.api = HfApi(endpoint=self.endpoint, token=self.token)
        self.commit = ""
        if isinstance(self.token, str):
            _HOMES[self.token] = _origin(self.api.endpoint)

    def secrets(self) -> list[str]:
        return [self.token] if isinstance(self.token, str) and self.token else []

    def resolve(self, revision: str, previous: Manifest | None) -> str:
        revision = revision or "main"
        if HUB_COMMIT.match(revision):  # a commit names itself: no request at all
            self.commit = revision
            return revision
        try:
            info = self.api.model_info(self.repo_id, revision=revision)
        except Exception as exc:
            raise _hub_error(exc, self.repo_id, revision) from exc
        if not info.sha or not HUB_COMMIT.match(info.sha):
            raise WeightsError("HubError", f"hf://{self.repo_id}@{revision}: the Hub returned no commit sha")
        self.commit = info.sha
        return info.sha

    def list_files(self, commit: str | None) -> list[RemoteFile]:
        assert commit
        out = []
        try:
            for item in self.api.list_repo_tree(self.repo_id, recursive=True, revision=commit):
                if not isinstance(item, RepoFile):
                    continue
                if item.lfs is not None:
                    out.append(RemoteFile(item.path, parse_size(item.lfs.size, item.path), str(item.lfs.sha256),
                                          {"sha256": str(item.lfs.sha256)}))
                else:
                    out.append(RemoteFile(item.path, parse_size(item.size, item.path), str(item.blob_id),
                                          {"git-sha1": str(item.blob_id)}))
        except WeightsError:
            raise
        except Exception as exc:
            raise _hub_error(exc, self.repo_id, commit) from exc
        return out

    def prepare(self, rf: RemoteFile) -> RemoteFile:
        return rf

    def fetch(self, rf: RemoteFile, out: PartialWriter) -> None:
        url = hf_hub_url(self.repo_id, rf.path, revision=self.commit, endpoint=self.endpoint)
        try:
            meta = get_hf_file_metadata(url, token=self.token, endpoint=self.endpoint, retry_on_errors=True)
        except Exception as exc:
            raise _hub_error(exc, self.repo_id, self.commit) from exc
        if meta.commit_hash and meta.commit_hash != self.commit:
            raise WeightsError("SourceChanged", f"{rf.path}: the Hub served commit {meta.commit_hash}, "
                                                f"expected {self.commit}")
        if meta.size is not None and meta.size != rf.size:
            raise WeightsError("SourceChanged", f"{rf.path}: the Hub says {meta.size} bytes, the tree {rf.size}")
        if meta.etag and meta.etag != rf.identity:  # the checksum decides; this only explains a failure
            log.warning("%s: the Hub's ETag %s is not the listed %s", rf.path, meta.etag, rf.identity)
        headers = build_hf_headers(token=self.token)
        if _origin(meta.location) != _origin(url):
            headers.pop("authorization", None)  # a signed CDN URL: the token stays on the Hub
        try:
            http_get(meta.location, out,  # type: ignore[arg-type]  # file-like: write/tell/seek/truncate
                     resume_size=out.offset, headers=headers, expected_size=rf.size, displayed_filename=rf.path,
                     tqdm_class=_Silent)
        except WeightsError:
            raise
        except HfHubHTTPError as exc:
            raise _hub_error(exc, self.repo_id, self.commit) from exc
        except (OSError, ValueError, httpx2.TransportError) as exc:  # ValueError: over huggingface_hub's HTTP limit
            raise WeightsError("DownloadFailed", f"{rf.path}: {type(exc).__name__}: {exc}") from exc

    def final_commit(self, entries: Sequence[FileEntry]) -> str:
        return self.commit
