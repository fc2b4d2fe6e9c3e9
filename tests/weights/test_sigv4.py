"""The SigV4 signer against AWS's published example, and against botocore when it is installed."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from kimik3_operator.weights.sigv4 import EMPTY_SHA256, Credentials, canonical_query, sign

EXAMPLE = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
WHEN = datetime(2013, 5, 24, tzinfo=timezone.utc)


def test_aws_documented_get_object_example() -> None:
    """'Example: GET Object' of the S3 SigV4 header-auth documentation: first 10 bytes of test.txt."""
    h = sign("GET", "https://examplebucket.s3.amazonaws.com/test.txt", {"Range": "bytes=0-9"}, EXAMPLE,
             "us-east-1", now=WHEN, payload_hash=EMPTY_SHA256)
    assert h["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")


def test_query_encoding_is_canonical() -> None:
    assert canonical_query({"prefix": "a b/c", "list-type": "2", "continuation-token": "x+y=="}) == (
        "continuation-token=x%2By%3D%3D&list-type=2&prefix=a%20b%2Fc")


def test_unsigned_when_anonymous() -> None:
    h = sign("GET", "https://b.s3.amazonaws.com/k", {}, None, "us-east-1", now=WHEN)
    assert "Authorization" not in h and h["x-amz-content-sha256"] == EMPTY_SHA256


def test_same_signature_as_botocore(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("botocore", reason="botocore conflicts with the pinned kubernetes client")
    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCreds

    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: when.replace(tzinfo=None))
    url = "http://127.0.0.1:9000/bucket/models/k%20k/model-00001.safetensors?partNumber=1&x-id=HeadObject"
    creds = Credentials("AKIDEXAMPLE", "secret/with+chars", "session-token")
    ours = sign("HEAD", url, {"Range": "bytes=5-"}, creds, "eu-west-1", now=when)
    req = AWSRequest(method="HEAD", url=url, headers={"x-amz-content-sha256": EMPTY_SHA256, "Range": "bytes=5-"})
    botocore.auth.S3SigV4Auth(BotoCreds("AKIDEXAMPLE", "secret/with+chars", "session-token"), "s3",
                              "eu-west-1").add_auth(req)
    theirs = req.headers["Authorization"]
    signed_ours = ours["Authorization"].split("SignedHeaders=")[1].split(",")[0]
    signed_theirs = theirs.split("SignedHeaders=")[1].split(",")[0]
    assert signed_ours == signed_theirs
    assert ours["Authorization"].rsplit("Signature=", 1)[1] == theirs.rsplit("Signature=", 1)[1]
