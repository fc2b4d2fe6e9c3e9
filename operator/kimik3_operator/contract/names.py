"""The names the operator writes onto the cluster to recognise its own work there.

The API, the renderer (which stamps them) and the API client (which reads them back to decide
whether an object drifted) share these; the client must not import the renderer for them.
"""

GROUP = "serving.kimik3.dev"
"""The API group of KimiK3Deployment and the prefix of every label and annotation the operator sets."""

FIELD_MANAGER = "kimik3-operator"
"""The server-side-apply field manager of the operator's writes: fields under another manager
are someone else's edit."""

AUTOSCALER_FIELD_MANAGER = "kimik3-autoscaler"
"""The field manager of an autoscaled LeaderWorkerSet's spec.replicas when the operator sets it:
the SLO scaler's decisions, and the hand-over of the count when a role becomes autoscaled (so the
main apply can leave the field out without the API server resetting it)."""

ANNOTATION_HASH = f"{GROUP}/desired-hash"
"""Carries the hash of the object as rendered: an apply is skipped while it matches."""

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kimik3-operator"
"""Every child and every pod of a child carries MANAGED_BY_LABEL=MANAGED_BY: what the operator's
informers select (server-side, so a watch never streams the cluster's other objects)."""
LABEL_DEPLOYMENT = f"{GROUP}/deployment"
"""Names the deployment (render.names.deployment_label) on every child and pod of it."""


OPERATOR_POD_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", MANAGED_BY_LABEL,
                       "app.kubernetes.io/part-of", "app.kubernetes.io/component")
"""The well-known labels the operator sets on every pod it makes (render/names.py labels)."""
RESERVED_POD_KEY_PREFIXES = (f"{GROUP}/", "leaderworkerset.sigs.k8s.io/", "kueue.x-k8s.io/")
"""Label and annotation prefixes of the operator, LeaderWorkerSet and Kueue on a pod: what they
select, group and gate pods by."""


def reserved_pod_key(key: str) -> bool:
    """A pod label or annotation key spec.pods may not set: one the operator, LeaderWorkerSet or
    Kueue sets and selects by (a user's value would be overwritten, or would break a selector)."""
    return key in OPERATOR_POD_LABELS or key.startswith(RESERVED_POD_KEY_PREFIXES)


SERIES_LABELS = {f"{GROUP}/deployment": "kimik3_deployment", f"{GROUP}/pool": "kimik3_pool",
                 f"{GROUP}/role": "kimik3_role"}
"""The serving pods' labels as a scrape copies them onto their series (beside `namespace` and
`pod`): the chart's PodMonitor relabels them so, the e2e pod runner's discovery writes them so,
and the scalers' queries select a role's engines by them."""
