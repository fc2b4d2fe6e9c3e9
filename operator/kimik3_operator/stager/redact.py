"""Masking secrets in everything the stager prints: its stderr, its progress records (stdout, the
termination message, the Job annotation).

Two rules, because a secret is not always known by value: every known secret value is masked in the
spellings it takes on the way out (as is, percent-encoded in a URL, escaped in JSON), and every URL
loses its user info and its query string, where signed URLs and token exchanges carry credentials the
stager never saw as a value (a CDN's signature, a presigned S3 URL).

Masking comes before any cut to a length bound: a secret cut in half is no longer found, and its first
half would be printed.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Sequence
from typing import TextIO
from urllib.parse import quote, quote_plus

MASK = "***"
MIN_SECRET = 4
"""Shorter values are not masked: they would mask every occurrence of common letters."""

_URL = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^\s/?#@\"'<>\\]*@)?"
                  r"(?P<rest>[^\s?#\"'<>\\]*)(?P<query>\?[^\s#\"'<>\\]*)?")
_RELATIVE_URL = re.compile(r"(?P<head>\burl: /[^\s?#\"'<>\\]*)\?[^\s#\"'<>\\]*")
"""requests/urllib3 name the failed request as ``url: /path?query`` (no scheme, no host)."""


def scrub_urls(text: str) -> str:
    """Every URL in ``text`` without user info and query string."""

    def one(m: re.Match[str]) -> str:
        return (m["head"] + (MASK + "@" if m["userinfo"] else "") + m["rest"]
                + ("?" + MASK if m["query"] and len(m["query"]) > 1 else m["query"] or ""))

    return _RELATIVE_URL.sub(lambda m: m["head"] + "?" + MASK, _URL.sub(one, text))


def spellings(secret: str) -> set[str]:
    """The ways ``secret`` can appear in output: as is, percent-encoded, JSON-escaped."""
    return {secret, quote(secret, safe=""), quote_plus(secret), json.dumps(secret)[1:-1]}


class Redactor:
    """Masks every known secret value, and credentials in URLs. Secrets can be added later (credentials
    fetched at run time: ``extra`` is asked on every call)."""

    def __init__(self, values: Sequence[str] = (), extra: Callable[[], Sequence[str]] | None = None) -> None:
        self.values = [v for v in values if v]
        self.extra = extra

    def secrets(self) -> list[str]:
        known = list(self.values) + list(self.extra() if self.extra else [])
        out = {s for v in known if v and len(v) >= MIN_SECRET for s in spellings(v)}
        return sorted(out, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for v in self.secrets():
            text = text.replace(v, MASK)
        return scrub_urls(text)


class RedactingStream(io.TextIOBase):
    """A text stream that masks what passes through it, a whole line at a time (a secret written in two
    pieces is still found). Installed as ``sys.stderr`` by the CLI, so that what libraries print (their
    log handlers, warnings, tracebacks) is masked too."""

    def __init__(self, target: TextIO, redact: Callable[[str], str]) -> None:
        super().__init__()
        self._target = target
        self._redact = redact
        self._pending = ""

    def write(self, s: str) -> int:
        self._pending += s
        if "\n" in self._pending:
            done, _, self._pending = self._pending.rpartition("\n")
            self._target.write(self._redact(done + "\n"))
        return len(s)

    def flush(self) -> None:
        if self._pending:
            self._target.write(self._redact(self._pending))
            self._pending = ""
        self._target.flush()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._target.fileno()

    def isatty(self) -> bool:
        return self._target.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._target.encoding

    @property
    def target(self) -> TextIO:
        return self._target
