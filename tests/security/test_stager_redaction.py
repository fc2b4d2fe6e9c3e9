"""Attack 6: a field cut to its length bound before secrets are masked keeps a secret's beginning.

Replayed: a progress record whose text fields (message, uri, revision, current and unverified files)
carry a secret across each of their cuts (1024, 512, 256, the last 120 characters, and the 200 a record
over 4000 bytes falls back to); the Job annotation reporter's error with a secret across its 200; a
secret written to stderr in two pieces; credentials in URLs that were never known by value. Now: masking
comes first, so no output holds even the secret's first four characters.
"""

# ruff: noqa: F811  (the fixtures are imported from stager_world, and test arguments shadow them)

from __future__ import annotations

import io
import json
import logging
import string
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kimik3_operator.stager import Progress
from kimik3_operator.stager.progress import JsonSink
from kimik3_operator.stager.progress_configmap import ConfigMapReporter
from kimik3_operator.stager.redact import MIN_SECRET, RedactingStream, Redactor, scrub_urls
from tests.stager.fake_hub import Slow

from .stager_world import TOKEN, FakeHub, cli, cli_env, hub, loopback_only, replay  # noqa: F401

pytestmark = pytest.mark.timeout(240)  # a replay is bounded; a stall fails here, not at the suite's 600 s

SECRETS = st.text(string.ascii_uppercase + string.digits + "+/=_-.", min_size=8, max_size=64)
"""Secrets drawn from characters the filler never uses, so any trace of one is the secret's own."""
FILLER = string.ascii_lowercase + " "


def _traces(secret: str) -> list[str]:
    return [secret[:MIN_SECRET], secret[-MIN_SECRET:]]


FIELDS = {  # field -> (the cut, and whether it keeps the head or the tail)
    "message": (1024, "head"), "uri": (512, "head"), "revision": (256, "head"),
    "current_files": (120, "tail"), "unverified_files": (120, "tail"),
}


@st.composite
def straddling(draw: Any) -> tuple[str, str, str]:
    """(field, its text, the secret): the secret starts a little before the field's cut."""
    field = draw(st.sampled_from(sorted(FIELDS)))
    secret = draw(SECRETS)
    cut, keep = FIELDS[field]
    before = draw(st.integers(1, len(secret) - 1))  # characters of the secret that survive the cut
    pad = draw(st.text(FILLER, min_size=0, max_size=3))
    if keep == "head":
        text = "x" * (cut - before) + secret + pad
    else:
        text = pad + secret + "x" * (cut - (len(secret) - before))
    return field, text, secret


def _record(field: str, text: str) -> Progress:
    if field in ("current_files", "unverified_files"):
        return Progress(phase="Downloading", **{field: (text,)})
    return Progress(phase="Failed", reason="HubError", **{field: text})


def test_every_record_field_is_masked_before_it_is_cut() -> None:
    @replay(200)
    @given(case=straddling(), crowded=st.booleans())
    def one(case: tuple[str, str, str], crowded: bool) -> None:
        field, text, secret = case
        p = _record(field, text)
        if crowded:  # a record over 4000 bytes, whose message falls back to 200 characters
            p = Progress(phase=p.phase, uri="u" * 600, revision="r" * 300, message=p.message or "m" * 2000,
                         current_files=p.current_files or tuple("f" * 200 for _ in range(4)),
                         unverified_files=p.unverified_files or tuple("v" * 200 for _ in range(10)),
                         reason=p.reason)
        out, forwarded = io.StringIO(), []
        with tempfile.TemporaryDirectory() as tmp:
            JsonSink(out, Path(tmp, "termination-log"), redact=Redactor([secret]), forward=forwarded.append)(p)
            written = [out.getvalue(), Path(tmp, "termination-log").read_text(), json.dumps(forwarded)]
        decoded = json.loads(written[1])
        texts = written + [json.dumps(decoded, ensure_ascii=False)]
        for trace in _traces(secret):
            assert not any(trace in t for t in texts), (field, trace)

    one()


class _Refusing:
    def __init__(self, text: str) -> None:
        self.text = text

    def patch(self, *args: Any, **kwargs: Any) -> Any:
        return type("R", (), {"status_code": 403, "text": self.text})()


def test_the_progress_reporter_masks_before_it_cuts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "token").write_text("sa-token")
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KIMIK3_SERVICEACCOUNT_DIR": str(tmp_path), "POD_NAMESPACE": "ns"}

    @replay(50)
    @given(secret=SECRETS, before=st.integers(1, 7))
    def one(secret: str, before: int) -> None:
        caplog.clear()
        body = "y" * (200 - before) + secret
        reporter = ConfigMapReporter("job-progress", env=env, session=_Refusing(body),  # type: ignore[arg-type]
                                      redact=Redactor([secret]))
        with caplog.at_level(logging.WARNING, logger="kimik3_operator.stager"):
            reporter({"phase": "Failed"})
        assert caplog.messages and "HTTP 403" in caplog.messages[0]
        assert secret[:MIN_SECRET] not in caplog.text

    one()


def test_stderr_masks_a_secret_written_in_pieces() -> None:
    @replay(100)
    @given(secret=SECRETS, split=st.integers(1, 7), spelling=st.sampled_from(["plain", "url", "json"]))
    def one(secret: str, split: int, spelling: str) -> None:
        shown = {"plain": secret, "url": secret.replace("/", "%2F").replace("+", "%2B").replace("=", "%3D"),
                 "json": json.dumps(secret)[1:-1]}[spelling]
        target = io.StringIO()
        stream = RedactingStream(target, Redactor([secret]))
        stream.write("token " + shown[:split])
        stream.write(shown[split:] + " was refused\n")
        stream.write("and again: " + shown)
        stream.flush()
        assert secret[:MIN_SECRET] not in target.getvalue() and shown[:MIN_SECRET] not in target.getvalue()

    one()


URL_PARTS = st.text(string.ascii_uppercase + "~%", min_size=4, max_size=40)
"""Uppercase only: no run of four is found in the hosts, paths and words around them."""


def test_credentials_in_urls_are_never_printed() -> None:
    """A signed CDN URL or a token in a query string is never known to the redactor by value."""

    @replay(100)
    @given(user=URL_PARTS, password=URL_PARTS, query_secret=URL_PARTS, host=st.sampled_from(
        ["cdn-lfs.hf.co", "127.0.0.1:9000", "bucket.s3.amazonaws.com"]), relative=st.booleans())
    def one(user: str, password: str, query_secret: str, host: str, relative: bool) -> None:
        if relative:  # how requests/urllib3 name a failed request
            text = f"Max retries exceeded with url: /?Action=Assume&WebIdentityToken={query_secret} (refused)"
        else:
            text = f'GET "https://{user}:{password}@{host}/a/b?X-Amz-Signature={query_secret}&e=1" failed'
        shown = scrub_urls(text)
        assert query_secret not in shown and "WebIdentityToken=" not in shown and "X-Amz-Signature" not in shown
        if not relative:
            assert password not in shown and f"{host}/a/b" in shown

    one()


def test_library_log_lines_are_masked_too(hub: FakeHub, tmp_path: Path) -> None:
    """The Job command, its CDN cutting every response short: huggingface_hub logs each retry with the
    URL it fetched, the CDN's signed URL (``?expires=...`` here). The query never reaches stderr, the
    line appears once, and the run ends in DownloadFailed."""
    hub.add_repo("org/k3", {"model.safetensors": b"\x05" * 400_000})
    hub.slow["model.safetensors"] = Slow(fast_bytes=50_000, chunk=1000, delay=0.05, max_seconds=0.2)
    out = cli("stage", "--uri", "hf://org/k3", "--dest", str(tmp_path / "d"),
              env=cli_env(HF_ENDPOINT=hub.endpoint, HF_TOKEN=TOKEN))
    retries = [line for line in out.stderr.splitlines() if "Error while downloading from" in line]
    assert retries and "/cdn/" in retries[0] and "expires=" not in out.stderr, out.stderr
    assert len(retries) == len(hub.requests(host="cdn")), "one line per failed transfer, not one per handler"
    assert out.stderr.strip().splitlines()[-1].startswith("DownloadFailed: model.safetensors"), out.stderr
