"""A clock a test moves by hand, and a Prometheus that answers from a table: what the scaler and
the probes read time and metrics from, so no test sleeps or needs a server for them."""

from __future__ import annotations


class Clock:
    """Seconds since some start, moved by setting `now`."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class FakePrometheus:
    """Answers the scaler's queries by metric name: what Prometheus would return for the role. A
    trend query (deriv) answers `values["deriv"]` only: no slope unless a test gives one."""

    def __init__(self) -> None:
        self.values: dict[str, float | None] = {}
        self.queries: list[str] = []

    def scalar(self, query: str) -> float | None:
        self.queries.append(query)
        if query.startswith("deriv("):
            return self.values.get("deriv")
        return next((v for k, v in self.values.items() if k in query), None)
