"""The operator's webhook certificate keeper against an API server in memory: it creates the Secret
owned by the webhook configuration, sets the caBundle, writes the files; a second round writes
nothing; a lost race adopts the winner's; a tampered caBundle is set back; new hosts renew under
the same CA with a PUT guarded by the resourceVersion."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from kimik3_operator.k8s.webhook_cert_keeper import CertificateKeeper
from kimik3_operator.webhook_pki import CertificateError, Material, inspect

NAMESPACE, SECRET, CONFIG = "kimik3-system", "op-webhook-cert", "op"
HOSTS = frozenset({"op-webhook", "op-webhook.kimik3-system.svc"})


@dataclass
class Response:
    data: bytes


@dataclass
class FakeApi:
    """Secrets of one namespace and one ValidatingWebhookConfiguration, with resourceVersions."""

    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=lambda: {
        "metadata": {"name": CONFIG, "uid": "uid-1"},
        "webhooks": [{"name": "a.kimik3.dev", "clientConfig": {"service": {"name": "x"}}},
                     {"name": "b.kimik3.dev", "clientConfig": {"url": "https://x"}}]})
    calls: list[str] = field(default_factory=list)
    version: int = 0
    before_create: Any = None
    """Called once before the next create: another replica writing first."""

    def _stamp(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        return stored

    def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> Response:
        self.calls.append("get secret")
        if name not in self.secrets:
            raise ApiException(status=404)
        return Response(json.dumps(self.secrets[name]).encode())

    def create_namespaced_secret(self, namespace: str, body: dict[str, Any], **_: Any) -> Response:
        self.calls.append("create secret")
        if self.before_create is not None:
            hook, self.before_create = self.before_create, None
            hook()
        name = body["metadata"]["name"]
        if name in self.secrets:
            raise ApiException(status=409)
        self.secrets[name] = self._stamp(body)
        return Response(json.dumps(self.secrets[name]).encode())

    def replace_namespaced_secret(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> Response:
        self.calls.append("update secret")
        if body["metadata"].get("resourceVersion") != self.secrets[name]["metadata"]["resourceVersion"]:
            raise ApiException(status=409)
        self.secrets[name] = self._stamp(body)
        return Response(b"{}")

    def read_validating_webhook_configuration(self, name: str, **_: Any) -> Response:
        self.calls.append("get config")
        return Response(json.dumps(self.config).encode())

    def patch_validating_webhook_configuration(self, name: str, patch: list[dict[str, Any]], **kwargs: Any) -> Response:
        assert kwargs["_content_type"] == "application/json-patch+json"
        self.calls.append("patch config")
        self.config = jsonpatch.apply_patch(self.config, patch)
        return Response(b"{}")


def keeper(api: FakeApi, directory: Path, hosts: frozenset[str] = HOSTS) -> CertificateKeeper:
    kept = CertificateKeeper(None, NAMESPACE, SECRET, CONFIG, hosts, directory)  # type: ignore[arg-type]
    kept._core = kept._admission = api  # type: ignore[assignment]
    return kept


def bundles(api: FakeApi) -> list[str | None]:
    return [w["clientConfig"].get("caBundle") for w in api.config["webhooks"]]


def test_the_first_round_creates_the_secret_sets_the_ca_bundle_and_writes_the_files(tmp_path: Path) -> None:
    api = FakeApi()
    kept = keeper(api, tmp_path / "certs")
    material = kept.ensure()
    secret = api.secrets[SECRET]
    assert Material.from_secret_data(secret["data"]) == material
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration", "name": CONFIG,
         "uid": "uid-1"}]
    assert bundles(api) == [base64.b64encode(material.ca_bundle).decode()] * 2
    assert kept.certfile.read_bytes() == material.cert and kept.keyfile.read_bytes() == material.key
    assert stat.S_IMODE(kept.keyfile.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.directory.stat().st_mode) == 0o700
    facts = inspect(material)
    assert facts is not None and facts.hosts == HOSTS

    api.calls.clear()
    assert kept.ensure() == material
    assert api.calls == ["get secret", "get config"], "a sound certificate is only read"


def test_a_lost_race_adopts_the_winners_certificate(tmp_path: Path) -> None:
    api = FakeApi()
    winner = keeper(FakeApi(), tmp_path / "winner").ensure()

    def other_replica_first() -> None:
        api.secrets[SECRET] = api._stamp({"metadata": {"name": SECRET}, "data": winner.secret_data()})

    api.before_create = other_replica_first
    kept = keeper(api, tmp_path / "certs")
    assert kept.ensure() == winner
    assert api.calls.count("create secret") == 1 and "update secret" not in api.calls
    assert kept.certfile.read_bytes() == winner.cert


def test_a_tampered_ca_bundle_is_set_back(tmp_path: Path) -> None:
    api = FakeApi()
    kept = keeper(api, tmp_path)
    material = kept.ensure()
    api.config["webhooks"][1]["clientConfig"]["caBundle"] = "QUJD"
    kept.ensure()
    assert bundles(api) == [base64.b64encode(material.ca_bundle).decode()] * 2


def test_new_hosts_renew_the_certificate_under_the_same_ca(tmp_path: Path) -> None:
    api = FakeApi()
    first = keeper(api, tmp_path).ensure()
    api.calls.clear()
    second = keeper(api, tmp_path, HOSTS | {"127.0.0.1"}).ensure()
    assert "update secret" in api.calls and "patch config" not in api.calls  # the CA is unchanged
    assert second.ca_bundle == first.ca_bundle and second.cert != first.cert
    assert api.secrets[SECRET]["metadata"]["resourceVersion"] == "2"
    facts = inspect(second)
    assert facts is not None and "127.0.0.1" in facts.hosts


def answering(status: int) -> Any:
    def call(*_: Any, **__: Any) -> Response:
        raise ApiException(status=status)

    return call


def test_api_errors_other_than_conflicts_propagate(tmp_path: Path) -> None:
    api = FakeApi()
    api.read_namespaced_secret = answering(403)  # type: ignore[method-assign]
    with pytest.raises(ApiException):
        keeper(api, tmp_path).ensure()


def test_no_secret_is_made_without_the_webhook_configuration(tmp_path: Path) -> None:
    api = FakeApi()
    api.read_validating_webhook_configuration = answering(404)  # type: ignore[method-assign]
    with pytest.raises(CertificateError):
        keeper(api, tmp_path).ensure()
    assert not api.secrets, "an uninstalled release's Secret was made again"


def test_the_keeper_goes_on_after_an_api_outage(tmp_path: Path) -> None:
    api = FakeApi()
    real = api.read_namespaced_secret
    outages = [urllib3.exceptions.MaxRetryError(None, "/api", "refused"), ApiException(status=500)]  # type: ignore[arg-type]

    def flaky(*args: Any, **kwargs: Any) -> Response:
        if outages:
            raise outages.pop(0)
        return real(*args, **kwargs)

    api.read_namespaced_secret = flaky  # type: ignore[method-assign]
    kept = keeper(api, tmp_path)
    kept.retry_seconds = 0.05

    async def run() -> bool:
        await kept.start()
        try:
            for _ in range(200):
                if kept.certfile.exists():
                    return True
                await asyncio.sleep(0.05)
            return False
        finally:
            await kept.stop()

    assert asyncio.run(run()), "no certificate after two failed rounds"
    assert not outages
