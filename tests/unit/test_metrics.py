"""Deployments by phase: one series per phase, a deployment counted once, gone ones dropped."""

from __future__ import annotations

from prometheus_client import REGISTRY

from kimik3_operator.metrics import PhaseBook


def _count(phase: str) -> float:
    return REGISTRY.get_sample_value("kimik3_operator_deployments", {"phase": phase}) or 0.0


def test_each_deployment_counts_once_in_its_latest_phase() -> None:
    book = PhaseBook()
    book.record(("a", "x"), "Progressing")
    book.record(("a", "y"), "Progressing")
    book.record(("a", "x"), "Ready")
    assert (_count("Ready"), _count("Progressing"), _count("Failed")) == (1, 1, 0)
    book.keep_only({("a", "x")})
    assert (_count("Ready"), _count("Progressing")) == (1, 0)
