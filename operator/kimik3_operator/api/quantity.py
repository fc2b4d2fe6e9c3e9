"""Kubernetes resource quantities as the API server reads them, for the rules that compare two: a
number with an optional suffix, decimal (m, k, M, G, T, P, E) or binary (Ki, Mi, Gi, Ti, Pi, Ei).
The exponent forms (1e3) are not part of what the API accepts, so they are not read here."""

from __future__ import annotations

import re
from decimal import Decimal

PATTERN = r"^[0-9]+(\.[0-9]+)?([KMGTPE]i|[mkMGTPE])?$"
_SPLIT = re.compile(r"^([0-9.]+)([A-Za-z]*)$")
_SCALE = {
    "": Decimal(1), "m": Decimal("0.001"),
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate("kMGTPE")},
    **{f"{s}i": Decimal(1024) ** (i + 1) for i, s in enumerate("KMGTPE")},
}


def quantity(text: str) -> Decimal:
    """The value of a quantity that matches PATTERN (ValueError otherwise)."""
    match = _SPLIT.match(text) if re.match(PATTERN, text) else None
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    return Decimal(match.group(1)) * _SCALE[match.group(2)]
