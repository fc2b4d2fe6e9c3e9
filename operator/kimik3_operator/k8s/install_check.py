"""`kimik3 check-install`: what the chart's `helm test` pod runs, as the operator image has no kubectl.

Three checks, each one line of the report:
- the CRD is served: the API server's discovery lists kimik3deployments (what `Established` means
  to a client; discovery needs no RBAC, so the test pod holds no cluster-wide right);
- the webhook answers: a server-side dry-run create of a deployment only the webhook refuses
  (explicit H100 hardware that cannot hold the model at TP8: schema and CEL admit it, the planner
  does not) comes back refused with the planner's reason. Admitted means the webhook did not answer
  (failurePolicy Ignore) or is not registered; nothing is stored either way (dry run);
- the operator is ready: its Deployment reports a ready replica and condition Available.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..api import GROUP, KIND, PLURAL, VERSION
from ..api.reasons import INSUFFICIENT_MEMORY
from .cluster import _api_message  # the Status message the API server sent, as the operator reads it

PROBE_NAME = "kimik3-install-check"


def refused_body(namespace: str) -> dict[str, Any]:
    """A deployment the CRD's schema and CEL admit and the webhook refuses (InsufficientMemory)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
        "metadata": {"name": PROBE_NAME, "namespace": namespace},
        "spec": {
            "model": {"uri": "hf://moonshotai/Kimi-K3"},
            "pools": [{"name": "h100", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                       "gpu": {"product": "H100"},
                       "aggregated": {"replicas": 1, "parallelism": {"tensor": 8}}}],
        },
    }


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok' if self.ok else 'FAILED'}  {self.name}: {self.detail}"


def crd_served(custom: client.CustomObjectsApi) -> Check:
    name = "CRD served"
    try:
        resources = custom.get_api_resources(GROUP, VERSION).resources or []
    except ApiException as exc:
        return Check(name, False, f"{GROUP}/{VERSION} is not served: {_api_message(exc)}")
    served = any(r.name == PLURAL for r in resources)
    return Check(name, served, f"{PLURAL}.{GROUP}/{VERSION}" + ("" if served else " missing from discovery"))


def webhook_answers(custom: client.CustomObjectsApi, namespace: str) -> Check:
    name = "webhook answers"
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, refused_body(namespace),
                                               dry_run="All")
    except ApiException as exc:
        message = _api_message(exc)
        return Check(name, "denied the request" in message and INSUFFICIENT_MEMORY in message, message)
    return Check(name, False, "a spec the webhook refuses was admitted: no replica answered "
                              "(failurePolicy Ignore) or the webhook is not registered")


def operator_ready(apps: client.AppsV1Api, namespace: str, deployment: str) -> Check:
    name = "operator ready"
    try:
        status = apps.read_namespaced_deployment(deployment, namespace).status
    except ApiException as exc:
        return Check(name, False, f"deployment {namespace}/{deployment}: {_api_message(exc)}")
    ready = status.ready_replicas or 0
    available = any(c.type == "Available" and c.status == "True" for c in status.conditions or [])
    return Check(name, ready >= 1 and available,
                 f"deployment {namespace}/{deployment}: {ready} ready, Available={available}")


def check_install(api: client.ApiClient, namespace: str, deployment: str, webhook: bool = True,
                  out: Callable[[str], None] = print) -> bool:
    """Run the checks, print one line each; True when all pass."""
    custom, apps = client.CustomObjectsApi(api), client.AppsV1Api(api)
    checks = [crd_served(custom), *([webhook_answers(custom, namespace)] if webhook else []),
              operator_ready(apps, namespace, deployment)]
    for check in checks:
        out(check.line())
    return all(c.ok for c in checks)
