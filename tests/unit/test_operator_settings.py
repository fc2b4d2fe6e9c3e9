"""How `kimik3 run`'s settings map onto kopf's (reconcile/settings.py)."""

from __future__ import annotations

import kopf

from kimik3_operator.reconcile.settings import OperatorConfig


def applied(config: OperatorConfig) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    config.apply(settings)
    return settings


def test_watched_namespaces_are_served_as_named_without_listing_every_namespace() -> None:
    # The chart's namespaced install grants no right to list namespaces: kopf's scanning would
    # retry a 403 nine times before handling anything.
    assert applied(OperatorConfig(namespaces=("team-a", "team-b"))).scanning.disabled is True


def test_every_namespace_keeps_kopfs_crd_watch() -> None:
    assert applied(OperatorConfig()).scanning.disabled is False


def test_status_stays_the_operators_and_handler_logs_post_no_events() -> None:
    settings = applied(OperatorConfig())
    assert settings.posting.enabled is False
    assert settings.persistence.finalizer == "serving.kimik3.dev/finalizer"
