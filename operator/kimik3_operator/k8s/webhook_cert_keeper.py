"""The webhook's serving certificate, kept by the operator itself when no cert-manager does: the
chart renders no key material (so `helm template` is the same every time and GitOps tools see no
drift), and every replica, at start and then every `check_seconds`:

1. reads the Secret; if it is missing, not certificates, for other hosts, or near expiry, makes
   new ones (webhook_pki.renewed) and writes them: create, or a PUT guarded by the
   resourceVersion it read, so two replicas racing write once and the loser reads the winner's;
2. sets that Secret's CA bundle as the caBundle of every webhook of the
   ValidatingWebhookConfiguration, if it differs (a JSON patch, tested against the webhook's name);
3. writes the serving certificate and key to files the webhook server reloads when they change.

The Secret is owned by the ValidatingWebhookConfiguration, so uninstalling the chart removes it
(a namespaced object may have a cluster-scoped owner), and it is made only while that
configuration exists, so a replica still running after an uninstall leaves none behind. Like
cert-controller and kopf's self-signed server, without cert-manager; unlike helm's genCA, nothing
in the chart changes on each render.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..webhook_pki import DEFAULT_POLICY, CertificateError, Material, Policy, renewed
from .cluster import UNREACHABLE

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 10.0


class CertificateKeeper:
    """`await start()` on the operator's loop: the first round at once, then one every
    `check_seconds` (sooner after a failure); `certfile`/`keyfile` appear after the first."""

    def __init__(self, api: client.ApiClient, namespace: str, secret: str, configuration: str,
                 hosts: frozenset[str], directory: Path, policy: Policy = DEFAULT_POLICY,
                 check_seconds: float = 300.0, retry_seconds: float = 10.0) -> None:
        self._core, self._admission = client.CoreV1Api(api), client.AdmissionregistrationV1Api(api)
        self.namespace, self.secret, self.configuration, self.hosts = namespace, secret, configuration, hosts
        self.directory, self.policy = directory, policy
        self.certfile, self.keyfile = directory / "tls.crt", directory / "tls.key"
        self.check_seconds, self.retry_seconds = check_seconds, retry_seconds
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="kimik3-webhook-cert")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.ensure)
                pause = self.check_seconds
            except (ApiException, CertificateError, OSError, *UNREACHABLE) as exc:
                log.warning("Webhook certificate: %s; trying again in %ss", _brief(exc), self.retry_seconds)
                pause = self.retry_seconds
            await asyncio.sleep(pause)

    def ensure(self, now: datetime | None = None) -> Material:
        """One round; the material now in the Secret and the files."""
        for _ in range(3):  # a lost race: read the winner's and decide again
            secret = self._read_secret()
            previous = Material.from_secret_data((secret or {}).get("data"))
            action, fresh = renewed(previous, self.hosts, now or datetime.now(UTC), self.policy)
            if fresh is None:
                assert previous is not None
                material = previous
            elif self._write_secret(secret, fresh):
                log.info("Webhook certificate: %s in Secret %s/%s for %s", action.value, self.namespace,
                         self.secret, ", ".join(sorted(self.hosts)))
                material = fresh
            else:
                continue
            self._inject(material.ca_bundle)
            self._write_files(material)
            return material
        raise CertificateError(f"Secret {self.namespace}/{self.secret} kept changing under us")

    def _read_secret(self) -> dict[str, Any] | None:
        try:
            return _json(self._core.read_namespaced_secret(self.secret, self.namespace, _preload_content=False,
                                                          _request_timeout=REQUEST_TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _owner(self) -> list[dict[str, Any]]:
        try:
            config = _json(self._admission.read_validating_webhook_configuration(
                self.configuration, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:  # uninstalled (or not yet installed): no Secret to leave behind
                raise CertificateError(f"no ValidatingWebhookConfiguration {self.configuration}") from exc
            raise
        return [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                 "name": self.configuration, "uid": config["metadata"]["uid"]}]

    def _write_secret(self, secret: dict[str, Any] | None, material: Material) -> bool:
        """False when another replica wrote first."""
        metadata: dict[str, Any] = {"name": self.secret, "namespace": self.namespace,
                                    "labels": {"app.kubernetes.io/managed-by": "kimik3-operator"}}
        if secret is None:
            metadata["ownerReferences"] = self._owner()
        else:  # as read, resourceVersion included: a PUT after another replica's write fails (409)
            metadata = {k: v for k, v in secret["metadata"].items() if k != "managedFields"}
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": metadata,
                "data": material.secret_data()}
        try:
            if secret is None:
                self._core.create_namespaced_secret(self.namespace, body, _preload_content=False,
                                                    _request_timeout=REQUEST_TIMEOUT)
            else:
                self._core.replace_namespaced_secret(self.secret, self.namespace, body, _preload_content=False,
                                                     _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def _inject(self, ca_bundle: bytes) -> None:
        """The CA bundle into every webhook of the configuration that lacks it."""
        try:
            config = _json(self._admission.read_validating_webhook_configuration(
                self.configuration, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:
                log.warning("Webhook certificate: no ValidatingWebhookConfiguration %s to trust it",
                            self.configuration)
                return
            raise
        wanted = base64.b64encode(ca_bundle).decode()
        patch: list[dict[str, Any]] = []
        for index, webhook in enumerate(config.get("webhooks") or ()):
            if (webhook.get("clientConfig") or {}).get("caBundle") != wanted:
                patch += [{"op": "test", "path": f"/webhooks/{index}/name", "value": webhook["name"]},
                          {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": wanted}]
        if patch:
            self._admission.patch_validating_webhook_configuration(
                self.configuration, patch, _content_type="application/json-patch+json", _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT)
            log.info("Webhook certificate: CA bundle set on ValidatingWebhookConfiguration %s", self.configuration)

    def _write_files(self, material: Material) -> None:
        """Certificate and key, each replaced whole (the server retries a pair read between the two)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for path, data in ((self.certfile, material.cert), (self.keyfile, material.key)):
            if path.exists() and path.read_bytes() == data:
                continue
            partial = path.with_name(f".{path.name}.partial")
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(partial, path)


def _json(response: Any) -> dict[str, Any]:
    return json.loads(response.data)  # type: ignore[no-any-return]


def _brief(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"API {exc.status} {exc.reason}"
    return str(exc)
