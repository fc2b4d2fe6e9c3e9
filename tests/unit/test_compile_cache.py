"""JIT/compile caches live on a per-image folder of a read-write claim the deployment owns."""

from __future__ import annotations

from typing import Any

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.spec import OWNED_ENV
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.render import Owner, compile_cache, render_children
from tests.fuzz.checks import pod_specs
from tests.support.cases import base_deployment
from tests.support.nodes import gb300_rack

OWNER = Owner(name="k3", namespace="ns", uid="u")


def _children(uri: str, image: str | None = None) -> list[dict[str, Any]]:
    body = base_deployment()
    body["spec"]["model"]["uri"] = uri
    if image:
        body["spec"]["engine"] = {"image": image}
    spec = KimiK3Deployment.model_validate(body).spec
    return render_children(OWNER, plan_deployment(spec, {p.name: pool_facts(p.node_selector, gb300_rack())
                                                         for p in spec.pools}))


def _cache_mounts(children: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, str]]]:
    out = []
    for child in children:
        if child["kind"] == "LeaderWorkerSet":
            for _, pod in pod_specs(child):
                (vllm,) = pod["containers"]
                (volume,) = [v for v in pod["volumes"] if v["name"] == compile_cache.VOLUME]
                (mount,) = [m for m in vllm["volumeMounts"] if m["name"] == compile_cache.VOLUME]
                out.append((volume, mount, {e["name"]: e.get("value", "") for e in vllm["env"]}))
    return out


def test_every_serving_container_points_each_cache_into_the_mounted_folder() -> None:
    assert set(compile_cache.ENV_NAMES) <= set(OWNED_ENV)  # engine.env cannot move them elsewhere
    assert [e["name"] for e in compile_cache.env()] == list(compile_cache.ENV_NAMES)
    mounts = _cache_mounts(_children("hf://moonshotai/Kimi-K3"))
    assert mounts
    for volume, mount, env in mounts:
        assert volume["persistentVolumeClaim"] == {"claimName": "k3-model-cache"}  # read-write, shared
        assert not mount.get("readOnly")
        for name in compile_cache.ENV_NAMES:
            assert env[name].startswith(mount["mountPath"]), name


def test_a_new_image_gets_a_new_folder_and_pvc_sources_get_a_claim_of_their_own() -> None:
    old = {m["subPath"] for _, m, _ in _cache_mounts(_children("hf://moonshotai/Kimi-K3", "vllm:a"))}
    new = {m["subPath"] for _, m, _ in _cache_mounts(_children("hf://moonshotai/Kimi-K3", "vllm:b"))}
    assert len(old) == len(new) == 1 and old != new
    in_place = _children("pvc://weights/kimi-k3")
    claims = [c["metadata"]["name"] for c in in_place if c["kind"] == "PersistentVolumeClaim"]
    assert claims == ["k3-compile-cache"]
    assert {v["persistentVolumeClaim"]["claimName"] for v, _, _ in _cache_mounts(in_place)} == {"k3-compile-cache"}
