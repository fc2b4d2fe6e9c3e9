"""Operator settings from `kimik3 run`'s flags or the environment, and how they map onto kopf's settings."""

from __future__ import annotations

import os
from dataclasses import dataclass

import kopf

from ..api import GROUP
from ..k8s.lease import LeaseConfig
from ..planner.images import OPERATOR_IMAGE, PROJECT_ROUTER_IMAGES, RouterImages


@dataclass(frozen=True)
class OperatorConfig:
    resync_seconds: float = 30.0
    """Every deployment is reconciled at least this often (drift repair, node changes)."""
    retry_seconds: float = 10.0
    """Delay before retrying a pass that failed on an API error."""
    workers: int = 4
    """Deployments reconciled at once by the resync worker (each pass mostly waits on the API server)."""
    coalesce_seconds: float = 0.5
    """A child event starts its deployment's pass this much later, shared with the events that
    follow it meanwhile (queue.WorkQueue.put_soon)."""
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; all when empty."""
    metrics_port: int | None = None
    """Serve Prometheus metrics on this port."""
    tools_image: str = OPERATOR_IMAGE
    """Image of the staging Jobs and the serving pods' weights wait: the operator's own (the chart
    passes the image it deployed)."""
    lease: LeaseConfig | None = None
    """Act only while holding this Lease (leader election among replicas); always when None."""
    prometheus_url: str | None = None
    """Prometheus's HTTP API for the SLO scaler and KEDA triggers (spec.autoscaling.prometheusUrl wins)."""
    router_images: RouterImages = PROJECT_ROUTER_IMAGES
    """The router pods' images where a deployment names none (the chart's routerImages)."""

    @classmethod
    def from_env(cls, namespaces: tuple[str, ...] = (), metrics_port: int | None = None,
                 lease: LeaseConfig | None = None, prometheus_url: str | None = None,
                 resync_seconds: float | None = None, retry_seconds: float | None = None,
                 workers: int | None = None, tools_image: str | None = None,
                 coalesce_seconds: float | None = None, router_image: str | None = None,
                 vllm_router_image: str | None = None) -> OperatorConfig:
        """The settings given (`kimik3 run`'s flags), else their environment variable, else the default."""
        return cls(
            resync_seconds=resync_seconds or float(os.environ.get("KIMIK3_RESYNC_SECONDS", cls.resync_seconds)),
            retry_seconds=retry_seconds or float(os.environ.get("KIMIK3_RETRY_SECONDS", cls.retry_seconds)),
            workers=workers or max(1, int(os.environ.get("KIMIK3_WORKERS", cls.workers))),
            coalesce_seconds=coalesce_seconds if coalesce_seconds is not None
            else float(os.environ.get("KIMIK3_COALESCE_SECONDS", cls.coalesce_seconds)),
            tools_image=tools_image or os.environ.get("KIMIK3_TOOLS_IMAGE") or cls.tools_image,
            namespaces=namespaces,
            metrics_port=metrics_port,
            lease=lease,
            prometheus_url=prometheus_url or os.environ.get("KIMIK3_PROMETHEUS_URL") or None,
            router_images=RouterImages(
                kimik3_router=router_image or os.environ.get("KIMIK3_ROUTER_IMAGE") or RouterImages.kimik3_router,
                vllm_router=vllm_router_image or os.environ.get("KIMIK3_VLLM_ROUTER_IMAGE")
                or RouterImages.vllm_router),
        )

    def apply(self, settings: kopf.OperatorSettings) -> None:
        # Handler progress and the diff base live in annotations, so status stays ours alone.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=f"kopf.{GROUP}")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=f"kopf.{GROUP}", key="last-handled-configuration")
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        # kopf would post handler logs as Kubernetes Events: a write per log line.
        settings.posting.enabled = False
        # With --namespace (the chart's watchNamespaces) kopf lists every namespace to match its
        # patterns, a right the chart does not grant: each start spent about 55 s in nine refused
        # retries (403, logged as errors) before it handled anything. The names given are exact, so
        # kopf's strict mode serves exactly them; its CRD watch goes with it (a new CRD version is
        # noticed at the next start). Watching every namespace needs no namespace listing at all.
        settings.scanning.disabled = bool(self.namespaces)
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.execution.max_workers = 8
