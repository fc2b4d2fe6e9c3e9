"""The kinds of object a KimiK3Deployment owns, in one table.

Whatever depends on the set of child kinds reads it from here: the renderer (apply order, which
stage emits what), the API client (what it lists), the reconciler (what it never re-applies or
prunes, what to install when the cluster lacks an API), the kopf watches, the e2e checks, and a
test that holds the chart's ClusterRole to exactly the verbs these entries need. Adding a child
kind is one entry here, its renderer, and its rule in the chart's ClusterRole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Stage = Literal["weights", "serving"]
WEIGHTS: Stage = "weights"
"""Stages the checkpoints: applied first, and on its own while they are not staged yet."""
SERVING: Stage = "serving"
"""Serves once the checkpoints are staged; what serves keeps serving while a new revision stages."""


@dataclass(frozen=True)
class ChildKind:
    """A kind of object the operator makes for a deployment, and how it treats such objects."""

    api_version: str
    kind: str
    plural: str
    stage: Stage
    create_only: bool = False
    """Created once and then left alone: never re-applied."""
    pruned: bool = True
    """Deleted when the plan no longer renders it. False for what every plan renders under the
    same name: garbage collection removes it with the deployment, and the operator holds no
    delete permission for it."""
    watched: bool = False
    """Its events start a pass of its owner, rather than the periodic resync finding changes (every
    child kind is followed by an informer; this says whether a change is worth a pass at once)."""
    missing_hint: str = ""
    """What to install when the cluster does not serve this kind (empty: every cluster does)."""
    pod_templates: tuple[tuple[str, ...], ...] = ()
    """Where its pod templates are (paths of keys; a path an object lacks is skipped): what
    spec.pods dresses (render/pod_extras.py)."""

    @property
    def group(self) -> str:
        """The API group ("" for the core group)."""
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def resource(self) -> str:
        """The resource as kubectl names it unambiguously (`plural.group`)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def type_meta(self) -> dict[str, str]:
        """The apiVersion and kind an object of this kind starts with."""
        return {"apiVersion": self.api_version, "kind": self.kind}

    def verbs(self) -> frozenset[str]:
        """What the operator does to objects of this kind: list and watch them (its informer: prune,
        status), server-side apply them (a PATCH, which the API server also authorizes as create
        when the object is new: create-only kinds are created that way too), delete them as flagged."""
        return frozenset({"list", "watch", "create", "patch"} | ({"delete"} if self.pruned else set()))


PERSISTENT_VOLUME_CLAIM = ChildKind("v1", "PersistentVolumeClaim", "persistentvolumeclaims", WEIGHTS)
SERVICE_ACCOUNT = ChildKind("v1", "ServiceAccount", "serviceaccounts", WEIGHTS, pruned=False)
ROLE = ChildKind("rbac.authorization.k8s.io/v1", "Role", "roles", WEIGHTS, pruned=False)
ROLE_BINDING = ChildKind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", WEIGHTS, pruned=False)
CONFIG_MAP = ChildKind("v1", "ConfigMap", "configmaps", WEIGHTS)
"""A staging Job's progress, the only object its pod may write (contract/stager.py). Its events
start no pass: progress changes every few seconds while a Job runs; the Job's own events and the
resync refresh the progress status shows."""
JOB = ChildKind("batch/v1", "Job", "jobs", WEIGHTS, create_only=True, watched=True,
               pod_templates=(("spec", "template"),))
"""A Job's pod template is immutable and its name already says what it stages: once created it is
left alone (an operator upgrade that changes its image neither fails the apply nor stages again)."""
SERVICE = ChildKind("v1", "Service", "services", SERVING)
NETWORK_POLICY = ChildKind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", SERVING)
"""Who may connect to the engines and the routers (render/network_policy.py); before the pods start."""
COMPUTE_DOMAIN = ChildKind(
    "resource.nvidia.com/v1beta1", "ComputeDomain", "computedomains", SERVING,
    missing_hint="multi-node NVLink replicas on NVL72 racks need NVIDIA's DRA driver (ComputeDomain)")
LEADER_WORKER_SET = ChildKind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets", SERVING,
                              watched=True, missing_hint="install LeaderWorkerSet (sigs.k8s.io/lws)",
                              pod_templates=(("spec", "leaderWorkerTemplate", "leaderTemplate"),
                                             ("spec", "leaderWorkerTemplate", "workerTemplate")))
HORIZONTAL_POD_AUTOSCALER = ChildKind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers",
                                      SERVING)
"""A role in autoscaling mode HPA: the cluster's HPA controller scales its LeaderWorkerSet's /scale."""
SCALED_OBJECT = ChildKind("keda.sh/v1alpha1", "ScaledObject", "scaledobjects", SERVING,
                          missing_hint="autoscaling mode KEDA needs KEDA installed (keda.sh/v1alpha1 ScaledObject)")
"""A role in autoscaling mode KEDA: KEDA makes and drives the HPA from a Prometheus trigger."""
DEPLOYMENT = ChildKind("apps/v1", "Deployment", "deployments", SERVING, watched=True,
                       pod_templates=(("spec", "template"),))
"""The router. Watched: its readiness is part of the deployment's, and a router deleted or edited
by hand must be repaired at once, since every request goes through it."""
HTTP_ROUTE = ChildKind("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes", SERVING,
                       missing_hint="spec.router.gateway needs Gateway API installed "
                                    "(gateway.networking.k8s.io/v1 HTTPRoute)")
"""The endpoint attached to the user's Gateway (spec.router.gateway, render/gateway.py)."""
POD_DISRUPTION_BUDGET = ChildKind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", SERVING)
"""One per serving role and per router (render/disruption.py): a drain takes one group at a time."""

CHILD_KINDS: tuple[ChildKind, ...] = (
    PERSISTENT_VOLUME_CLAIM, SERVICE_ACCOUNT, ROLE, ROLE_BINDING, CONFIG_MAP, JOB, SERVICE, NETWORK_POLICY,
    COMPUTE_DOMAIN,
    LEADER_WORKER_SET, HORIZONTAL_POD_AUTOSCALER, SCALED_OBJECT, DEPLOYMENT, HTTP_ROUTE, POD_DISRUPTION_BUDGET,
)
"""In apply order: an identity and the ConfigMap it may write before the Job that runs as it, what
a workload needs (its Service, its ComputeDomain) before the workload, a workload before the
scaler that targets it, the engines before the router in front, the router before the route to it,
and the budgets guarding both last."""

BY_KIND: dict[str, ChildKind] = {k.kind: k for k in CHILD_KINDS}
APPLY_ORDER: dict[str, int] = {k.kind: i for i, k in enumerate(CHILD_KINDS)}
