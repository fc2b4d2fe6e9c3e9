"""The stager's failures: each carries a stable reason (CamelCase, like a condition reason) that the
Job's last progress record and its exit message show, and the operator puts into status."""

from __future__ import annotations


class WeightsError(Exception):
    """A staging or waiting failure with a stable, machine-readable reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class ChecksumMismatch(WeightsError):
    def __init__(self, path: str, algorithm: str, expected: str, actual: str) -> None:
        super().__init__(
            "ChecksumMismatch",
            f"{path}: {algorithm} is {actual}, the source says {expected}; the partial download was discarded",
        )
        self.path = path
        self.algorithm = algorithm
        self.expected = expected
        self.actual = actual
