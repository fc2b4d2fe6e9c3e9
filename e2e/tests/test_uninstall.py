"""Last in the suite (`after_suite`): uninstalling the chart removes the operator's objects and keeps the CRD
(crds.keep), so deployments and their GPUs survive an operator uninstall."""

from __future__ import annotations

import pytest

from e2e.harness.kube import kubectl, wait_for

from .conftest import CHART_NAMESPACE, CRD, RELEASE, SERVICE_ACCOUNT, WEBHOOK_CERT_SECRET, helm

pytestmark = [pytest.mark.e2e, pytest.mark.after_suite(2)]


def test_uninstall_keeps_the_crd(chart: str) -> None:
    helm("uninstall", RELEASE, "-n", CHART_NAMESPACE, "--wait")
    assert kubectl("get", CRD, check=False).returncode == 0
    for kind in ("clusterrole", "clusterrolebinding"):
        assert kubectl("get", kind, SERVICE_ACCOUNT, check=False).returncode != 0
    for kind in ("deployment", "role", "rolebinding"):
        assert kubectl("-n", CHART_NAMESPACE, "get", kind, SERVICE_ACCOUNT, check=False).returncode != 0
    # the Secret the operator made for the webhook's certificate goes with the webhook configuration
    wait_for("the webhook certificate's Secret garbage-collected", lambda: kubectl(
        "-n", CHART_NAMESPACE, "get", "secret", WEBHOOK_CERT_SECRET, check=False).returncode != 0, timeout=60)
