"""The SigV4 signer against AWS's published example (the fake S3 checks signatures with the signer's own
canonical request, so this is the independent check)."""

from __future__ import annotations

from datetime import UTC, datetime

from kimik3_operator.stager.sigv4 import EMPTY_SHA256, Credentials, canonical_query, sign

EXAMPLE = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
WHEN = datetime(2013, 5, 24, tzinfo=UTC)


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
