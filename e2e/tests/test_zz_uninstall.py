"""Last in the suite: uninstalling the chart removes the operator's objects and keeps the CRD
(crds.keep), so deployments and their GPUs survive an operator uninstall."""

from __future__ import annotations

import pytest

from .conftest import CHART_NAMESPACE, CRD, RELEASE, SERVICE_ACCOUNT, helm
from .kube import kubectl

pytestmark = pytest.mark.e2e


def test_uninstall_keeps_the_crd(chart: str) -> None:
    helm("uninstall", RELEASE, "-n", CHART_NAMESPACE, "--wait")
    assert kubectl("get", CRD, check=False).returncode == 0
    for kind in ("clusterrole", "clusterrolebinding"):
        assert kubectl("get", kind, SERVICE_ACCOUNT, check=False).returncode != 0
    for kind in ("deployment", "role", "rolebinding"):
        assert kubectl("-n", CHART_NAMESPACE, "get", kind, SERVICE_ACCOUNT, check=False).returncode != 0
