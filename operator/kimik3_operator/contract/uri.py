"""Model URIs: the one grammar that admission, the planner, the renderer and the stager read.

    hf://org/name        a Hugging Face Hub repository
    s3://bucket/prefix   every object under the prefix
    pvc://claim/path     a folder on a claim of the deployment's namespace, verified in place

Admission must refuse exactly what the stager would, or a typo is only found inside a Job. The
API server checks a string with a regular expression (the CRD's `pattern`) and CEL rules, so the
grammar is written in those two parts: PATTERN, which RE2, Rust's regex (pydantic) and Python's
re read alike, and RULES, the refusals a regular expression cannot say at a sane size, each with
its CEL twin. `parse_model_uri` accepts exactly what both accept.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

MAX_LENGTH = 512
SCHEMES = ("hf", "s3", "pvc")

_HUB_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
"""An org or a repository name as the Hub allows it: 1 to 96 characters, ending in a word
character (huggingface_hub's validate_repo_id refuses a trailing '.' or '-')."""
_BUCKET = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
_CLAIM = r"[a-z0-9](?:[-a-z0-9]{0,251}[a-z0-9])?"
"""A claim name the renderer can also turn into a volume name: no dots."""
_TAIL = r"(?:/[^\t\n\v\f\r ]*)?"
"""An optional path, no whitespace (spelled out: `\\s` is ASCII in RE2 but Unicode in Python)."""

_BY_SCHEME = {
    "hf": f"hf://{_HUB_NAME}/{_HUB_NAME}",
    "s3": f"s3://{_BUCKET}{_TAIL}",
    "pvc": f"pvc://{_CLAIM}{_TAIL}",
}
PATTERN = "^(?:" + "|".join(_BY_SCHEME.values()) + ")$"
"""The CRD's `pattern` for a model URI."""

_COMPILED = {scheme: re.compile(body) for scheme, body in _BY_SCHEME.items()}
_WHY_NOT = {
    "hf": "hf:// takes exactly org/name, each 1 to 96 letters, digits, '.', '_' or '-', starting with a "
          "letter or digit and ending with a letter, digit or '_'",
    "s3": "s3:// takes a bucket name (3 to 63 lowercase letters, digits, '.' or '-') and a key prefix "
          "without whitespace",
    "pvc": "pvc:// takes a claim name (at most 253 lowercase letters, digits or '-', no dots) and a path "
           "without whitespace",
}


@dataclass(frozen=True)
class UriRule:
    """A refusal PATTERN cannot express: a predicate and, for the CRD, its CEL twin."""

    message: str
    cel: str
    """CEL over the URI string, written as `{uri}`: true when the URI is acceptable."""
    holds: Callable[[str], bool]


RULES: tuple[UriRule, ...] = (
    UriRule(
        message="an hf:// repository id has no '--' or '..' and does not end in .git (the Hub refuses them)",
        cel="!{uri}.startsWith('hf://') || !({uri}.contains('--') || {uri}.contains('..') || {uri}.endsWith('.git'))",
        holds=lambda u: not u.startswith("hf://") or not ("--" in u or ".." in u or u.endswith(".git")),
    ),
    UriRule(
        message="a pvc:// path stays inside its claim: no '..' in it",
        cel="!{uri}.startsWith('pvc://') || !({uri} + '/').contains('/../')",
        holds=lambda u: not u.startswith("pvc://") or "/../" not in u + "/",
    ),
)


class InvalidModelUri(ValueError):
    """The URI is not one the stager can stage; the message says why."""


@dataclass(frozen=True)
class ModelLocation:
    """A parsed model URI."""

    scheme: str
    """hf | s3 | pvc"""
    authority: str
    """The repository id (org/name), the bucket or the claim."""
    path: str
    """"" for hf; the key prefix or the path inside the claim, without leading or trailing '/'."""

    def __str__(self) -> str:
        tail = f"/{self.path}" if self.path else ""
        return f"{self.scheme}://{self.authority}{tail}"


def parse_model_uri(uri: str) -> ModelLocation:
    """Where `uri` points, or InvalidModelUri when admission would have refused it."""
    if len(uri) > MAX_LENGTH:
        raise InvalidModelUri(f"longer than {MAX_LENGTH} characters")
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise InvalidModelUri("expected hf://org/name, s3://bucket/prefix or pvc://claim/path")
    if scheme not in _COMPILED:
        raise InvalidModelUri(f"unsupported scheme {scheme!r} ({', '.join(SCHEMES)})")
    if not _COMPILED[scheme].fullmatch(uri):
        raise InvalidModelUri(_WHY_NOT[scheme])
    for rule in RULES:
        if not rule.holds(uri):
            raise InvalidModelUri(rule.message)
    if scheme == "hf":
        return ModelLocation("hf", rest, "")
    authority, _, path = rest.partition("/")
    return ModelLocation(scheme, authority, path.strip("/"))
