"""Attack 5: the Hub token sent to another origin.

Replayed: the fake Hub sends the client elsewhere on every request path it has: a pagination ``Link``,
a 302 on the revision lookup, on the tree listing, on a regular file's ``/resolve`` (the LFS files go to
the CDN, another origin, as always). "Elsewhere" is another host, or the same host on another port. huggingface_hub
followed a next-page link with the same headers, the token included. Now: a request to any origin but the
configured endpoint's carries no ``Authorization`` header; a public repository stages as before, a private
one fails with a reason where the foreign origin asks for the token it did not get.

S3: signed requests never follow a redirect; a 307 to elsewhere is an S3Error and elsewhere sees nothing.
"""

# ruff: noqa: F811  (the fixtures are imported from stager_world, and test arguments shadow them)

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.stager.fake_hub import Logged

from .stager_world import TOKEN, FakeHub, FakeS3, fake_s3, hub, loopback_only, replay, run_stage  # noqa: F401

pytestmark = pytest.mark.timeout(240)  # a replay is bounded; a stall fails here, not at the suite's 600 s

HOPS = ("pages", "model_info", "tree", "resolve")
FILES = {"config.json": b'{"model_type": "kimi_k3"}', "tokenizer.json": b"{}" * 300,
         "weights/model-00001.safetensors": b"\x01" * 70_000, "weights/model-00002.safetensors": b"\x02" * 50_000,
         "README.md": b"# k3"}


@pytest.fixture
def elsewhere() -> FakeHub:
    """A second Hub on 127.0.0.1, another port: an origin that differs from the endpoint by its port only."""
    other = FakeHub().start()
    try:
        yield other  # type: ignore[misc]
    finally:
        other.stop()


def _foreign(hub: FakeHub, other: FakeHub) -> list[Logged]:
    return hub.requests(host="cdn") + other.requests()


def test_the_token_goes_to_the_configured_origin_only(hub: FakeHub, elsewhere: FakeHub) -> None:
    @replay(30)
    @given(hops=st.sets(st.sampled_from(HOPS), min_size=1), page_size=st.integers(1, 4), private=st.booleans(),
           same_host=st.booleans())
    def one(hops: set[str], page_size: int, private: bool, same_host: bool) -> None:
        hub.repos.clear()
        hub.reset_log()
        elsewhere.reset_log()
        hub.add_repo("org/k3", FILES, token=TOKEN if private else None)
        elsewhere.repos = hub.repos  # the other origin serves the same repositories
        hub.foreign, hub.page_size, elsewhere.page_size = hops, page_size, page_size
        hub.foreign_base = elsewhere.endpoint if same_host else ""
        with tempfile.TemporaryDirectory() as tmp:
            out = run_stage("hf://org/k3", Path(tmp, "d"), token=TOKEN, env={"HF_ENDPOINT": hub.endpoint})
            if out.error is None:
                assert all(Path(tmp, "d", p).read_bytes() == data for p, data in FILES.items())
        hub.foreign = set()
        foreign = _foreign(hub, elsewhere)
        assert foreign, "the replay never left the configured origin"
        assert not [r for r in foreign if r.authorized], "the token went to another origin"
        assert any(r.authorized for r in hub.requests(host="hub")), "the token was not used at home"
        if not private:
            assert out.error is None, out
        else:  # the foreign origin answered 401 to the request that lost its token
            assert out.reason in ("RepositoryNotFound", "Unauthorized", "HubError"), out

    one()


def test_s3_signed_requests_follow_no_redirect(fake_s3: FakeS3) -> None:
    other = FakeS3().start()
    try:
        fake_s3.put("k3-weights", "m/config.json", b"{}")
        other.buckets = fake_s3.buckets
        fake_s3.redirect_to = other.endpoint
        with tempfile.TemporaryDirectory() as tmp:
            out = run_stage("s3://k3-weights/m", Path(tmp, "d"), revision="", env=fake_s3.env())
        assert out.reason == "S3Error" and "307" in out.last.message, out
        assert other.log == []
    finally:
        other.stop()
