"""A stand-in for the ComputeDomain controller of NVIDIA's DRA driver, for the local e2e cluster.

Why it exists: kwok runs no DRA driver. On a real NVL72 cluster the driver's controller turns each
ComputeDomain into the ResourceClaimTemplate named in spec.channel.resourceClaimTemplate.name; every
pod of the workload claims an IMEX channel from it. Without that template the resourceclaim
controller cannot create the pods' claims and the pods stay Pending. This process does only that
part; the rest is real Kubernetes: KCM's resourceclaim controller makes one claim per pod,
kube-scheduler allocates it from the per-tray ResourceSlices and the DeviceClass that cluster.sh
applies (compute-domain/), and kwok runs the pods.

What it does, as upstream (kubernetes-sigs/dra-driver-nvidia-gpu, cmd/compute-domain-controller and
templates/compute-domain-workload-claim-template.tmpl.yaml):
- creates the template in the ComputeDomain's namespace with upstream's labels, request (one device
  of class compute-domain-default-channel.nvidia.com) and opaque channel config;
- sets status.status=Ready once the template exists, as upstream does in host-managed IMEX mode
  (no IMEX daemons run here, so status.nodes stays empty).
One difference: the template is owned by the ComputeDomain (controller=true) and the garbage
collector deletes it with the domain, where upstream uses finalizers and deletes it itself.

How: list the ComputeDomains of all namespaces, then watch from the list's resourceVersion (bookmarks
on, reconnect on timeout, relist on 410 Gone or any error). A domain whose template name is still
held by the template of a deleted domain of the same name (the garbage collector has not got to it
yet) is retried every second until the name is free.

Usage: python compute_domain_controller.py KUBECONFIG READY_FILE
READY_FILE exists while the last list succeeded; it is cluster.sh's health check.
"""

from __future__ import annotations

import logging
import pathlib
import sys
import time
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

GROUP, VERSION, PLURAL = "resource.nvidia.com", "v1beta1", "computedomains"
DRIVER = "compute-domain.nvidia.com"
DEVICE_CLASS = "compute-domain-default-channel.nvidia.com"
CD_LABEL = "resource.nvidia.com/computeDomain"  # value: the ComputeDomain's UID
TARGET_LABEL = "resource.nvidia.com/computeDomainTarget"
FIELD_MANAGER = "compute-domain-controller"
WATCH_SECONDS = 300  # the server ends an idle watch after this; we then watch again
RETRY_SECONDS = 1

log = logging.getLogger("compute-domain-controller")


def claim_template(cd: dict[str, Any]) -> dict[str, Any]:
    meta, channel = cd["metadata"], cd["spec"]["channel"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": channel["resourceClaimTemplate"]["name"],
            "namespace": meta["namespace"],
            "labels": {CD_LABEL: meta["uid"], TARGET_LABEL: "Workload"},
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "ComputeDomain",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "channel", "exactly": {"deviceClassName": DEVICE_CLASS}}],
                    "config": [
                        {
                            "requests": ["channel"],
                            "opaque": {
                                "driver": DRIVER,
                                "parameters": {
                                    "apiVersion": f"{GROUP}/{VERSION}",
                                    "kind": "ComputeDomainChannelConfig",
                                    "domainID": meta["uid"],
                                    "allocationMode": channel.get("allocationMode", "Single"),
                                },
                            },
                        }
                    ],
                }
            }
        },
    }


class Controller:
    def __init__(self, api: client.ApiClient) -> None:
        self.crs = client.CustomObjectsApi(api)
        self.dra = client.ResourceV1Api(api)
        self.retry: dict[str, dict[str, Any]] = {}  # "ns/name" -> ComputeDomain waiting for its template name

    def reconcile(self, cd: dict[str, Any]) -> bool:
        """Make the template and the Ready status exist; False if it must be retried later."""
        meta = cd["metadata"]
        if meta.get("deletionTimestamp"):
            return True
        ns, uid = meta["namespace"], meta["uid"]
        body = claim_template(cd)
        name = body["metadata"]["name"]
        try:
            have = self.dra.read_namespaced_resource_claim_template(name, ns)
        except ApiException as e:
            if e.status != 404:
                raise
            # Created by server-side apply, not a JSON POST: the API server stores opaque
            # parameters byte for byte, and with the ", " and ": " separators of the client's JSON
            # every later update of the template (even the garbage collector's metadata patch) fails
            # with "spec: field is immutable". Apply stores what the server serialises itself.
            self.dra.patch_namespaced_resource_claim_template(
                name, ns, body, field_manager=FIELD_MANAGER, force=True, _content_type="application/apply-patch+yaml"
            )
            log.info("created ResourceClaimTemplate %s/%s for ComputeDomain %s", ns, name, meta["name"])
        else:
            if not any(o.uid == uid for o in have.metadata.owner_references or []):
                return False
        if (cd.get("status") or {}).get("status") != "Ready":
            self.crs.patch_namespaced_custom_object_status(
                GROUP, VERSION, ns, PLURAL, meta["name"], {"status": {"status": "Ready"}}
            )
            log.info("ComputeDomain %s/%s is Ready", ns, meta["name"])
        return True

    def handle(self, cd: dict[str, Any], deleted: bool = False) -> None:
        key = f"{cd['metadata']['namespace']}/{cd['metadata']['name']}"
        waiting = self.retry.pop(key, None) is not None
        if not deleted and not self.reconcile(cd):
            if not waiting:
                log.info("ComputeDomain %s: its template name is held by another object; retrying", key)
            self.retry[key] = cd

    def retry_pending(self) -> None:
        for cd in list(self.retry.values()):
            try:  # the stored copy may be stale: reconcile the current object
                cd = self.crs.get_namespaced_custom_object(
                    GROUP, VERSION, cd["metadata"]["namespace"], PLURAL, cd["metadata"]["name"]
                )
            except ApiException as e:
                if e.status != 404:
                    raise
                self.handle(cd, deleted=True)
                continue
            self.handle(cd)

    def run(self, ready_file: pathlib.Path) -> None:
        while True:
            try:
                listed = self.crs.list_cluster_custom_object(GROUP, VERSION, PLURAL)
                self.retry.clear()
                for cd in listed["items"]:
                    self.handle(cd)
                ready_file.touch()
                self.watch(listed["metadata"]["resourceVersion"])
            except Exception as e:  # noqa: BLE001 - any failure: log, wait, list again
                ready_file.unlink(missing_ok=True)
                log.warning("%s; listing again in %ss", e if isinstance(e, ApiException) else repr(e), RETRY_SECONDS)
                time.sleep(RETRY_SECONDS)

    def watch(self, resource_version: str) -> None:
        """Watch from resource_version until an error (410 Gone included) raises."""
        w = watch.Watch()
        while True:
            timeout = RETRY_SECONDS if self.retry else WATCH_SECONDS
            for event in w.stream(
                self.crs.list_cluster_custom_object,
                GROUP,
                VERSION,
                PLURAL,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _request_timeout=timeout + 10,
            ):
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    self.handle(event["raw_object"], deleted=event["type"] == "DELETED")
                if self.retry and timeout != RETRY_SECONDS:
                    break  # watch again with the short timeout, so the retry comes soon
            resource_version = w.resource_version or resource_version
            self.retry_pending()


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__.rsplit("Usage: ", 1)[1])
    kubeconfig, ready_file = sys.argv[1], pathlib.Path(sys.argv[2])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.proxy = None  # loopback only: never take a proxy from the environment
    if not cfg.host.startswith("https://127.0.0.1:"):
        sys.exit(f"refusing to talk to {cfg.host}: the local cluster is on 127.0.0.1 only")
    ready_file.unlink(missing_ok=True)
    log.info("watching ComputeDomains at %s", cfg.host)
    Controller(client.ApiClient(cfg)).run(ready_file)


if __name__ == "__main__":
    main()
