"""Model URIs the stager stages: ``hf://org/name``, ``s3://bucket/prefix``, ``pvc://claim/path``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import WeightsError

_HF_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]{0,251}[a-z0-9])?$")


@dataclass(frozen=True)
class ModelUri:
    scheme: str  # hf | s3 | pvc
    authority: str  # repo id (org/name) | bucket | claim
    path: str  # "" for hf | key prefix (no leading slash) | path inside the claim

    def __str__(self) -> str:
        tail = f"/{self.path}" if self.path else ""
        return f"{self.scheme}://{self.authority}{tail}"


def parse_uri(uri: str) -> ModelUri:
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise WeightsError("InvalidUri", f"{uri!r}: expected hf://org/name, s3://bucket/prefix or pvc://claim/path")
    if scheme == "hf":
        parts = rest.strip("/").split("/")
        if len(parts) != 2 or not all(_HF_PART.match(p) for p in parts):
            raise WeightsError("InvalidUri", f"{uri!r}: hf:// takes exactly org/name")
        return ModelUri("hf", "/".join(parts), "")
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        if not _BUCKET.match(bucket):
            raise WeightsError("InvalidUri", f"{uri!r}: {bucket!r} is not a valid S3 bucket name")
        return ModelUri("s3", bucket, prefix.strip("/"))
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        if not _DNS1123.match(claim):
            raise WeightsError("InvalidUri", f"{uri!r}: {claim!r} is not a valid PersistentVolumeClaim name")
        if ".." in path.split("/"):
            raise WeightsError("InvalidUri", f"{uri!r}: '..' is not allowed in the path")
        return ModelUri("pvc", claim, path.strip("/"))
    raise WeightsError("InvalidUri", f"{uri!r}: unsupported scheme {scheme!r} (hf, s3, pvc)")
