"""The weights cache claim, the staging Jobs, and what serving pods need to read the weights.

One Job per checkpoint (model, draft) runs the stager (`python -m kimik3_operator.stager stage`,
from the operator image) into its folder of the cache claim; its final progress record is the
container's termination message, where the operator reads the resolved commit. While it runs it
writes its latest record into a ConfigMap made for that Job alone, through a ServiceAccount whose
Role allows exactly that (patch on these ConfigMap names; nothing of the Job itself), so status
shows progress without the operator reading pod logs. Serving pods mount the folder read-only and
wait in an init container until its completion marker names the commit the status shows.

The staging pod meets Pod Security "restricted" (non-root, no privilege escalation, no
capability, RuntimeDefault seccomp). It gets only the Secret keys the stager reads, each by
secretKeyRef, and every user string in its command and environment goes through `literal`
(kubelet.py), so none of them can name one of those variables.
"""

from __future__ import annotations

from typing import Any

from ..api import GROUP
from ..contract.kinds import CONFIG_MAP, JOB, PERSISTENT_VOLUME_CLAIM, ROLE, ROLE_BINDING, SERVICE_ACCOUNT
from ..contract.stager import MARKER_NAME, S3_SECRET_KEYS, STAGER_MODULE, STATE_DIR
from ..planner import WeightsPlan, WeightsSource
from ..planner.weights import CACHE_MOUNT
from .kubelet import literal
from .names import Owner, bounded, object_meta
from .placement import place

CACHE_VOLUME = "model-cache"
LABEL_SOURCE = f"{GROUP}/weights-source"
RUN_AS = 65532  # the operator image's non-root user
WAIT_TIMEOUT_SECONDS = 3600
"""A serving pod starts only after its Job reported the commit; the wait guards against a folder
that changed since (a claim restored from a snapshot, a hand edit) and then fails the pod loudly."""
STAGE_RESOURCES = {
    "requests": {"cpu": "2", "memory": "1Gi", "ephemeral-storage": "256Mi"},
    "limits": {"memory": "8Gi", "ephemeral-storage": "2Gi"},
}
"""Burstable. The memory request is what the stager itself holds: 8 files in flight (`stage
--workers` default, stager/__main__.py) x (a 1 MiB HTTP chunk, stager/s3.py CHUNK, + an 8 MiB
hash block, stager/digests.py HASH_BLOCK) = 72 MiB, an S3 listing page of up to 64 MiB (s3.py
MAX_BODY), a pvc:// checksum file of up to 64 MiB (pvc.py MAX_SUMS_BYTES) and CPython with its
HTTP stack (~150 MiB): ~350 MiB, rounded up. The limit is higher because the 1.5 TB it writes goes
through the page cache, charged to its cgroup: the kernel throttles writers at a fraction of the
limit, so a limit near the request would stall the writes. No CPU limit: SHA-256 over every byte
wants what the node can spare. Ephemeral storage: HOME=/tmp only (no download lands there)."""
WAIT_RESOURCES = {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "64Mi"}
"""A Python loop that stats the checkpoint's files every 5 s."""
MAX_ATTEMPTS = 20
"""Pods a staging Job may use up; every attempt resumes the files already fetched."""


def cache_claim_name(owner: Owner) -> str:
    return bounded(f"{owner.name}-model-cache", 253)


def service_account_name(owner: Owner) -> str:
    return bounded(f"{owner.name}-weights", 253)


def job_name(owner: Owner, source: WeightsSource) -> str:
    return bounded(f"{owner.name}-weights-{source.name}-{source.key}", 63)


def progress_name(owner: Owner, source: WeightsSource) -> str:
    """The ConfigMap the Job's pod reports its progress into."""
    return bounded(f"{job_name(owner, source)}-progress", 253)


def claim_of(owner: Owner, source: WeightsSource) -> str:
    return source.claim or cache_claim_name(owner)


def volume_name(owner: Owner, source: WeightsSource) -> str:
    return CACHE_VOLUME if source.claim is None else bounded(f"weights-{source.claim}", 63)


def weights_children(owner: Owner, weights: WeightsPlan, image: str) -> list[dict[str, Any]]:
    """The cache claim (when a source needs it), the staging identity, and one progress ConfigMap
    and one Job per source."""
    out: list[dict[str, Any]] = []
    if weights.needs_cache:
        spec: dict[str, Any] = {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": weights.cache_size}},
        }
        if weights.cache_storage_class:
            spec["storageClassName"] = weights.cache_storage_class
        out.append({**PERSISTENT_VOLUME_CLAIM.type_meta(), "metadata": cache_claim_meta(owner, weights), "spec": spec})
    sa = service_account_name(owner)
    out.append({**SERVICE_ACCOUNT.type_meta(), "metadata": object_meta(owner, sa, None, None),
                "automountServiceAccountToken": True})
    out.append({**ROLE.type_meta(), "metadata": object_meta(owner, sa, None, None),
                "rules": [{"apiGroups": [CONFIG_MAP.group], "resources": [CONFIG_MAP.plural], "verbs": ["patch"],
                           "resourceNames": [progress_name(owner, s) for s in weights.sources]}]})
    out.append({**ROLE_BINDING.type_meta(), "metadata": object_meta(owner, sa, None, None),
                "roleRef": {"apiGroup": ROLE.group, "kind": ROLE.kind, "name": sa},
                "subjects": [{"kind": SERVICE_ACCOUNT.kind, "name": sa, "namespace": owner.namespace}]})
    for s in weights.sources:
        out += [progress_configmap(owner, s), staging_job(owner, weights, s, image)]
    return out


def cache_claim_meta(owner: Owner, weights: WeightsPlan) -> dict[str, Any]:
    """The cache claim's metadata. Retained, it has no owner reference: garbage collection leaves it
    when the deployment goes, the prune never selects it (it prunes only what the deployment owns),
    and a deployment re-created under the name applies to it as it is (server-side apply also
    drops an owner reference an earlier Delete policy set). Labels still name the deployment."""
    meta = object_meta(owner, cache_claim_name(owner), None, None)
    if weights.cache_retained:
        del meta["ownerReferences"]
    return meta


def _weights_meta(owner: Owner, name: str, source: WeightsSource) -> dict[str, Any]:
    meta = object_meta(owner, name, None, None)
    meta["labels"].update({"app.kubernetes.io/component": "weights", LABEL_SOURCE: source.name})
    return meta


def progress_configmap(owner: Owner, source: WeightsSource) -> dict[str, Any]:
    """Empty as rendered: its one key is the staging pod's to write (contract/stager.py)."""
    return {**CONFIG_MAP.type_meta(), "metadata": _weights_meta(owner, progress_name(owner, source), source)}


def _secret_env(weights: WeightsPlan, source: WeightsSource) -> list[dict[str, Any]]:
    """The source's credentials (by secretKeyRef, only the keys the stager reads) and endpoint;
    never an argument, never the whole Secret."""
    env: list[dict[str, Any]] = []
    if source.scheme == "hf":
        if weights.auth_secret:
            name, key = weights.auth_secret
            env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": name, "key": key}}})
        if weights.endpoint:
            env.append({"name": "HF_ENDPOINT", "value": literal(weights.endpoint)})
        env.append({"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"})
    elif source.scheme == "s3":
        if weights.auth_secret:
            env += [{"name": key, "valueFrom": {"secretKeyRef": {
                "name": weights.auth_secret[0], "key": key, "optional": True}}} for key in S3_SECRET_KEYS]
        if weights.endpoint:  # S3 only: AWS_ENDPOINT_URL would also send the pod's STS exchange there
            env.append({"name": "AWS_ENDPOINT_URL_S3", "value": literal(weights.endpoint)})
    return env


def _restricted() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}}


def stage_args(owner: Owner, source: WeightsSource) -> list[str]:
    args = ["python", "-m", STAGER_MODULE, "stage", "--uri", literal(source.uri)]
    if source.revision:
        args += ["--revision", literal(source.revision)]
    return args + ["--dest", literal(f"{CACHE_MOUNT}/{source.folder}".rstrip("/")),
                   "--progress-file", "/dev/termination-log", "--report-configmap", progress_name(owner, source)]


def staging_job(owner: Owner, weights: WeightsPlan, source: WeightsSource, image: str) -> dict[str, Any]:
    meta = _weights_meta(owner, job_name(owner, source), source)
    env = [*_secret_env(weights, source),
           {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
           {"name": "HOME", "value": "/tmp"}]
    container: dict[str, Any] = {
        "name": "stage",
        "image": image,
        "command": stage_args(owner, source),
        "env": env,
        "volumeMounts": [{"name": volume_name(owner, source), "mountPath": CACHE_MOUNT},
                         {"name": "tmp", "mountPath": "/tmp"}],
        "resources": {part: dict(amounts) for part, amounts in STAGE_RESOURCES.items()},
        "terminationMessagePolicy": "File",
        "securityContext": _restricted(),
    }
    return {
        **JOB.type_meta(),
        "metadata": meta,
        "spec": {
            "backoffLimit": MAX_ATTEMPTS,
            "template": {
                "metadata": {"labels": dict(meta["labels"])},
                "spec": place({
                    "restartPolicy": "Never",
                    "serviceAccountName": service_account_name(owner),
                    "enableServiceLinks": False,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                                        "fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": volume_name(owner, source),
                                 "persistentVolumeClaim": {"claimName": claim_of(owner, source)}},
                                {"name": "tmp", "emptyDir": {}}],
                }, weights.staging),
            },
        },
    }


def serving_volumes(owner: Owner, weights: WeightsPlan) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for s in weights.sources:
        seen.setdefault(volume_name(owner, s), {"name": volume_name(owner, s), "persistentVolumeClaim": {
            "claimName": claim_of(owner, s), "readOnly": True}})
    return list(seen.values())


def serving_mounts(owner: Owner, weights: WeightsPlan) -> list[dict[str, Any]]:
    return [{"name": volume_name(owner, s), "mountPath": s.mount_path, "subPath": s.folder, "readOnly": True}
            if s.folder else {"name": volume_name(owner, s), "mountPath": s.mount_path, "readOnly": True}
            for s in weights.sources]


WAIT_SCRIPT = f"""\
import json, os, sys, time
dest, commit, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
marker = os.path.join(dest, "{STATE_DIR}", "{MARKER_NAME}")
deadline = time.monotonic() + timeout
while True:
    try:
        m = json.load(open(marker))
        bad = [f["path"] for f in m["files"] if os.path.getsize(os.path.join(dest, f["path"])) != f["size"]]
        why = ("marker is for commit %s" % m["commit"]) if commit and m["commit"] != commit else (
            "%s does not have the size the marker records" % bad[0] if bad else "")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = "%s: %s" % (marker, exc)
    if not why:
        print("weights ready at %s" % m["commit"])
        sys.exit(0)
    if time.monotonic() >= deadline:
        print("NotReady: " + why, file=sys.stderr)
        sys.exit(1)
    time.sleep(5)
"""
"""The serving pods' wait, run by the serving image's own Python: what `stager wait` checks (the
completion marker names the commit, every listed file has its size). Not the operator image, whose
tag changes with every operator release: a pod template must not, or an upgrade would restart
every replica."""


def wait_containers(owner: Owner, weights: WeightsPlan, image: str) -> list[dict[str, Any]]:
    """Init containers that hold a serving pod until its checkpoints are staged at the commit the
    plan was made for (a Job that re-stages another revision never feeds a pod of this one).
    `image` is the serving image. They run as the stager's user, not as the image's root: the
    marker is the stager's, mode 0600, and a root without capabilities could not read it."""
    out = []
    for s in weights.sources:
        out.append({
            "name": f"wait-{s.name}",
            "image": image,
            "command": ["python3", "-c", WAIT_SCRIPT, s.mount_path, literal(s.commit or ""),
                        str(WAIT_TIMEOUT_SECONDS)],
            "volumeMounts": [m for m in serving_mounts(owner, weights) if m["mountPath"] == s.mount_path],
            # Equal requests and limits: one container without them would make the serving pod
            # Burstable, not Guaranteed (planner/pod_resources.py).
            "resources": {"requests": dict(WAIT_RESOURCES), "limits": dict(WAIT_RESOURCES)},
            "securityContext": _restricted() | {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS},
        })
    return out
