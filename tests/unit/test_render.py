"""Rendering: one LeaderWorkerSet and one leader Service per (pool, role), with the group shape,
GPU requests, clique affinity, labels, owner references and hash that the rules ask for."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.contract.names import ANNOTATION_HASH
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.render import Owner, render_children
from kimik3_operator.render.names import LABEL_COMPAT, MAX_WORKLOAD_NAME, bounded, desired_hash, workload_name
from tests.support.cases import EXAMPLES, load_examples
from tests.support.nodes import all_pools

OWNER = Owner(name="k3-pd", namespace="inference", uid="0000-1111")
NODES = all_pools()


def _render(body: dict[str, Any], owner: Owner = OWNER) -> list[dict[str, Any]]:
    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, NODES) for p in spec.pools})
    return render_children(owner, plan)


def _example(name: str) -> dict[str, Any]:
    return dict(load_examples())[name]


def _by_kind(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def test_pd_example_renders_one_workload_and_service_per_role() -> None:
    objs = _render(_example("pd-gb300-decode-b200-prefill.yaml"))
    assert sorted(_by_kind(objs, "LeaderWorkerSet")) == ["k3-pd-b200-prefill-prefill", "k3-pd-gb300-decode-decode"]
    assert sorted(_by_kind(objs, "Service")) == [
        "k3-pd-b200-prefill-prefill-leader", "k3-pd-gb300-decode-decode-leader", "k3-pd-router"]
    assert [o["kind"] for o in objs] == [
        "PersistentVolumeClaim", "ServiceAccount", "ServiceAccount", "Role", "Role", "RoleBinding", "RoleBinding",
        "ConfigMap", "ConfigMap", "Job", "Job",  # model and draft: progress and Job
        "Service", "Service", "Service", "NetworkPolicy", "NetworkPolicy", "ComputeDomain",
        "LeaderWorkerSet", "LeaderWorkerSet", "Deployment", "PodDisruptionBudget", "PodDisruptionBudget",
        "PodDisruptionBudget"]
    # The stager's identity and the router's, each its own.
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        assert sorted(_by_kind(objs, kind)) == ["k3-pd-router", "k3-pd-weights"]
    # One P/D router Deployment, for the plan's own revision, behind the one router Service.
    (router,) = _by_kind(objs, "Deployment").values()
    revision = {o["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"][LABEL_COMPAT]
                for o in _by_kind(objs, "LeaderWorkerSet").values()}
    (compat,) = revision
    assert router["metadata"]["name"] == f"k3-pd-router-{compat[:10]}"
    assert router["spec"]["selector"]["matchLabels"]["serving.kimik3.dev/router-revision"] == compat


@pytest.mark.parametrize("example", [p.name for p in EXAMPLES if p.name != "design-reference.yaml"])
def test_every_role_and_every_router_has_one_budget_over_all_its_pods(example: str) -> None:
    """A drain evicts at most one pod of a role, or of a router, at a time; the budget selects every
    pod of the role (leaders and workers, any revision: LWS's name label) or every pod the router's
    Service selects; a pod that is not Ready may always go."""
    objs = _render(_example(example))
    budgets = _by_kind(objs, "PodDisruptionBudget")
    roles = _by_kind(objs, "LeaderWorkerSet")
    routers = {name: s for name, s in _by_kind(objs, "Service").items()
               if s["metadata"]["labels"].get("app.kubernetes.io/component") == "router"}
    assert routers and set(budgets) == set(roles) | set(routers)
    for name in roles:
        assert budgets[name]["spec"]["selector"] == {"matchLabels": {"leaderworkerset.sigs.k8s.io/name": name}}
    for name, service in routers.items():
        assert budgets[name]["spec"]["selector"] == {"matchLabels": service["spec"]["selector"]}
    for budget in budgets.values():
        assert budget["apiVersion"] == "policy/v1"
        assert {k: v for k, v in budget["spec"].items() if k != "selector"} == {
            "maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow"}
        (ref,) = budget["metadata"]["ownerReferences"]
        assert ref["uid"] == OWNER.uid and ref["controller"] is True


def test_multi_tray_nvlink_replicas_claim_a_compute_domain_channel() -> None:
    objs = _render(_example("pd-gb300-decode-b200-prefill.yaml"))
    (cd,) = _by_kind(objs, "ComputeDomain").values()
    assert cd["metadata"]["name"] == "k3-pd-gb300-decode-decode-cd"
    assert cd["spec"] == {"numNodes": 0, "channel": {
        "resourceClaimTemplate": {"name": "k3-pd-gb300-decode-decode-cd-channel"}, "allocationMode": "Single"}}
    lws = _by_kind(objs, "LeaderWorkerSet")
    for template in ("leaderTemplate", "workerTemplate"):
        pod = lws["k3-pd-gb300-decode-decode"]["spec"]["leaderWorkerTemplate"][template]["spec"]
        assert pod["resourceClaims"] == [{"name": "compute-domain-channel",
                                          "resourceClaimTemplateName": "k3-pd-gb300-decode-decode-cd-channel"}]
        assert pod["containers"][0]["resources"]["claims"] == [{"name": "compute-domain-channel"}]
    rdma_pod = lws["k3-pd-b200-prefill-prefill"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert "resourceClaims" not in rdma_pod


def test_group_size_and_gpu_requests() -> None:
    lws = _by_kind(_render(_example("pd-gb300-decode-b200-prefill.yaml")), "LeaderWorkerSet")
    decode = lws["k3-pd-gb300-decode-decode"]["spec"]
    prefill = lws["k3-pd-b200-prefill-prefill"]["spec"]
    assert decode["replicas"] == 2 and decode["leaderWorkerTemplate"]["size"] == 2
    assert prefill["replicas"] == 1 and prefill["leaderWorkerTemplate"]["size"] == 2
    for spec, gpus in ((decode, "4"), (prefill, "8")):
        for template in ("leaderTemplate", "workerTemplate"):
            (c,) = spec["leaderWorkerTemplate"][template]["spec"]["containers"]
            assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus == c["resources"]["requests"]["nvidia.com/gpu"]


def test_multi_node_nvlink_group_stays_in_one_clique() -> None:
    lws = _by_kind(_render(_example("pd-gb300-decode-b200-prefill.yaml")), "LeaderWorkerSet")
    for template in ("leaderTemplate", "workerTemplate"):
        pod = lws["k3-pd-gb300-decode-decode"]["spec"]["leaderWorkerTemplate"][template]["spec"]
        (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "nvidia.com/gpu.clique"
        assert term["matchLabelKeys"] == ["leaderworkerset.sigs.k8s.io/group-key"]
        assert term["labelSelector"]["matchLabels"] == {"leaderworkerset.sigs.k8s.io/name": "k3-pd-gb300-decode-decode"}
    b200 = lws["k3-pd-b200-prefill-prefill"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert "affinity" not in b200


def test_single_node_replica_has_only_a_leader_template() -> None:
    body = _example("gb300-aggregated-tp8.yaml")
    body["spec"]["pools"][0].update(nodeSelector={"pool": "b300"}, gpu={"product": "B300", "perNode": 8})
    (lws,) = _by_kind(_render(body), "LeaderWorkerSet").values()
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 1 and "leaderTemplate" not in group
    (c,) = group["workerTemplate"]["spec"]["containers"]
    assert "--headless" not in c["command"] and c["ports"][0]["containerPort"] == 8000


def test_leader_serves_http_and_workers_run_headless() -> None:
    lws = _by_kind(_render(_example("pd-gb300-decode-b200-prefill.yaml")), "LeaderWorkerSet")
    group = lws["k3-pd-gb300-decode-decode"]["spec"]["leaderWorkerTemplate"]
    (leader,) = group["leaderTemplate"]["spec"]["containers"]
    (worker,) = group["workerTemplate"]["spec"]["containers"]
    assert "--headless" in worker["command"] and "--headless" not in leader["command"]
    assert leader["command"][leader["command"].index("--node-rank") + 1] == "0"
    assert worker["command"][worker["command"].index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    assert "startupProbe" in leader and "startupProbe" not in worker
    assert "http" in {p["name"] for p in leader["ports"]} and "http" not in {p["name"] for p in worker["ports"]}
    env = {e["name"] for e in leader["env"]}
    assert "VLLM_USE_RUST_FRONTEND" in env and "VLLM_USE_RUST_FRONTEND" not in {e["name"] for e in worker["env"]}


def test_leader_service_selects_leaders_of_its_workload() -> None:
    objs = _render(_example("pd-gb300-decode-b200-prefill.yaml"))
    svc = _by_kind(objs, "Service")["k3-pd-gb300-decode-decode-leader"]
    lws = _by_kind(objs, "LeaderWorkerSet")["k3-pd-gb300-decode-decode"]
    compat = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"][LABEL_COMPAT]
    assert svc["spec"]["type"] == "ClusterIP"
    # Paired roles select one revision (reconcile/pairing.py): the plan's own when nothing else serves.
    assert svc["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": "k3-pd-gb300-decode-decode",
                                       "leaderworkerset.sigs.k8s.io/worker-index": "0", LABEL_COMPAT: compat}
    aggregated = _by_kind(_render(_example("gb300-aggregated-tp8.yaml")), "Service")
    assert all(LABEL_COMPAT not in s["spec"]["selector"] for s in aggregated.values())


@pytest.mark.parametrize("example", [p.name for p in EXAMPLES if p.name != "design-reference.yaml"])
def test_every_child_is_owned_labelled_and_hashed(example: str) -> None:
    """Except the model cache claim, which by default (retentionPolicy Retain) outlives the deployment."""
    for obj in _render(_example(example)):
        meta = obj["metadata"]
        assert meta["namespace"] == OWNER.namespace
        if obj["kind"] == "PersistentVolumeClaim":
            assert "ownerReferences" not in meta
        else:
            (ref,) = meta["ownerReferences"]
            assert ref["uid"] == OWNER.uid and ref["controller"] is True and ref["blockOwnerDeletion"] is True
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "kimik3-operator"
        assert meta["labels"]["serving.kimik3.dev/deployment"] == OWNER.name
        assert meta["annotations"][ANNOTATION_HASH] == desired_hash(obj)


def test_prefill_and_decode_carry_the_same_compat_hash() -> None:
    lws = _by_kind(_render(_example("pd-gb300-decode-b200-prefill.yaml")), "LeaderWorkerSet")
    hashes = {t["metadata"]["labels"][LABEL_COMPAT] for o in lws.values()
              for t in o["spec"]["leaderWorkerTemplate"].values() if isinstance(t, dict)}
    assert len(hashes) == 1


def test_rendering_is_deterministic() -> None:
    body = _example("pd-gb300-decode-b200-prefill.yaml")
    assert _render(body) == _render(body)


def test_long_names_are_bounded_with_a_stable_hash() -> None:
    owner = Owner(name="a-very-long-deployment-name-for-kimi-k3-serving", namespace="ns", uid="u")
    name = workload_name(owner, "gb300-rack-with-a-long-name", "aggregated")
    assert len(name) <= MAX_WORKLOAD_NAME
    assert name == workload_name(owner, "gb300-rack-with-a-long-name", "aggregated")
    assert name != workload_name(owner, "gb300-rack-with-a-long-name", "decode")
    assert bounded("short", 45) == "short"


def test_changing_replicas_changes_only_that_workload_hash() -> None:
    body = _example("pd-gb300-decode-b200-prefill.yaml")

    def hashes() -> dict[tuple[str, str], str]:
        return {(o["kind"], o["metadata"]["name"]): o["metadata"]["annotations"][ANNOTATION_HASH]
                for o in _render(body)}

    before = hashes()
    body["spec"]["pools"][1]["decode"]["replicas"] = 3
    after = hashes()
    assert {k for k in before if before[k] != after[k]} == {("LeaderWorkerSet", "k3-pd-gb300-decode-decode")}


def test_prefix_caching_is_always_explicit() -> None:
    body = _example("gb300-aggregated-tp8.yaml")
    for enabled, flag in ((True, "--enable-prefix-caching"), (False, "--no-enable-prefix-caching")):
        body["spec"]["engine"]["prefixCaching"]["enabled"] = enabled
        for lws in _by_kind(_render(body), "LeaderWorkerSet").values():
            for template in lws["spec"]["leaderWorkerTemplate"].values():
                if isinstance(template, dict):
                    assert flag in template["spec"]["containers"][0]["command"]


def test_pd_pods_carry_nixl_side_channel_settings() -> None:
    lws = _by_kind(_render(_example("pd-gb300-decode-b200-prefill.yaml")), "LeaderWorkerSet")
    prefill = lws["k3-pd-b200-prefill-prefill"]["spec"]["leaderWorkerTemplate"]
    for template in ("leaderTemplate", "workerTemplate"):
        (c,) = prefill[template]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "$(POD_IP)"
        assert [p["containerPort"] for p in c["ports"] if p["name"].startswith("nixl-")] == [5600, 5601]
        config = c["command"][c["command"].index("--kv-transfer-config") + 1]
        assert '"kv_role":"kv_producer"' in config and '"kv_connector":"NixlConnector"' in config
        # NIXL over the B200 NICs: one per GPU (the nodes advertise 8) and the capability to pin memory
        assert c["resources"]["limits"]["rdma/ib"] == "8"
        assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    decode = lws["k3-pd-gb300-decode-decode"]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    config = decode["command"][decode["command"].index("--kv-transfer-config") + 1]
    assert '"kv_role":"kv_consumer"' in config


def test_serving_pod_essentials() -> None:
    body = _example("pd-gb300-decode-b200-prefill.yaml")
    body["spec"]["engine"]["shutdownTimeoutSeconds"] = 120
    lws = _by_kind(_render(body), "LeaderWorkerSet")["k3-pd-gb300-decode-decode"]
    pod = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    (c,) = pod["containers"]
    # the probe outlasts vLLM's own start-up deadline, which outlasts the collectives' (timeouts.py)
    env = {e["name"]: e.get("value") for e in c["env"]}
    ready = int(env["VLLM_ENGINE_READY_TIMEOUT_S"])
    distributed = int(c["command"][c["command"].index("--distributed-timeout-seconds") + 1])
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] > ready > distributed >= 1800
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["lifecycle"]["preStop"]["sleep"]["seconds"] > 0
    assert c["command"][c["command"].index("--shutdown-timeout") + 1] == "120"
    assert pod["terminationGracePeriodSeconds"] > 120 + c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    # Serving pods read staged local files: the Hub token goes to the staging Jobs only.
    assert not any(e["name"] == "HF_TOKEN" or "secretKeyRef" in e.get("valueFrom", {}) for e in c["env"])
    assert {"name": "model-cache", "mountPath": "/models/kimi-k3-draft", "readOnly": True,
            "subPath": next(m["subPath"] for m in c["volumeMounts"] if m["mountPath"] == "/models/kimi-k3-draft")
            } in c["volumeMounts"]
    assert [i["name"] for i in pod["initContainers"]] == ["wait-model", "wait-draft"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1" and int(env["VLLM_ENGINE_READY_TIMEOUT_S"]) > 600
    spec_config = c["command"][c["command"].index("--speculative-config") + 1]
    assert '"model":"/models/kimi-k3-draft"' in spec_config and '"method":"dspark"' in spec_config
    for flag in ("--tool-call-parser", "--enable-auto-tool-choice", "--reasoning-parser"):
        assert flag in c["command"]


def _containers(objs: list[dict[str, Any]], lws: str) -> dict[str, dict[str, Any]]:
    group = _by_kind(objs, "LeaderWorkerSet")[lws]["spec"]["leaderWorkerTemplate"]
    return {t: group[t]["spec"]["containers"][0] for t in ("leaderTemplate", "workerTemplate") if t in group}


def _after(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_multi_node_ranks_rendezvous_at_the_leader() -> None:
    objs = _render(_example("pd-gb300-decode-b200-prefill.yaml"))
    pods = _containers(objs, "k3-pd-b200-prefill-prefill")
    leader, worker = pods["leaderTemplate"]["command"], pods["workerTemplate"]["command"]
    assert (_after(leader, "--nnodes"), _after(leader, "--node-rank"), _after(leader, "--master-addr")) == \
        ("2", "0", "$(POD_IP)")
    assert (_after(worker, "--node-rank"), _after(worker, "--master-addr")) == \
        ("$(LWS_WORKER_INDEX)", "$(LWS_LEADER_ADDRESS)")
    assert _after(leader, "--data-parallel-rpc-port") == _after(worker, "--data-parallel-rpc-port")
    assert "--headless" in worker and "--headless" not in leader


def test_pd_roles_share_the_kda_transfer_settings() -> None:
    objs = _render(_example("pd-gb300-decode-b200-prefill.yaml"))
    for lws in ("k3-pd-b200-prefill-prefill", "k3-pd-gb300-decode-decode"):
        for c in _containers(objs, lws).values():
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"
            assert "--enable-hybrid-kv-cache-manager" in c["command"]
            assert _after(c["command"], "--mamba-ssm-cache-dtype") == "auto"


def test_decode_under_sequence_parallel_moe_shards_shared_experts() -> None:
    objs = _render(_example("pd-gb300-decode-b200-prefill.yaml"))
    prefill = _containers(objs, "k3-pd-b200-prefill-prefill")["leaderTemplate"]
    decode = _containers(objs, "k3-pd-gb300-decode-decode")["leaderTemplate"]
    assert "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT" not in {e["name"] for e in prefill["env"]}  # prefill role
    assert "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT" not in {e["name"] for e in decode["env"]}   # TP8 without EP
    body = _example("pd-gb300-decode-b200-prefill.yaml")
    body["spec"]["pools"][1]["decode"]["parallelism"] = {"tensor": 8, "expert": True}  # TP8 + EP8: MegaMoE
    decode = _containers(_render(body), "k3-pd-gb300-decode-decode")["leaderTemplate"]
    env = {e["name"]: e.get("value") for e in decode["env"]}
    assert env["VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT"] == "1"
    assert _after(decode["command"], "--moe-backend") == "deep_gemm_mega_moe"


def test_amd_pools_turn_aiter_on() -> None:
    body = _example("gb300-aggregated-tp8.yaml")
    body["spec"]["pools"][0].update(nodeSelector={"pool": "amd"}, gpu={"product": "MI355X", "perNode": 8})
    body["spec"]["pools"][0]["aggregated"]["replicas"] = 1
    (c,) = _containers(_render(body), "k3-pd-gb300-rack-a-aggregated").values()
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["VLLM_ROCM_USE_AITER"] == "1" and _after(c["command"], "--moe-backend") == "aiter"
    assert c["resources"]["limits"]["amd.com/gpu"] == "8"


def test_rollout_surges_by_default_and_can_update_in_place() -> None:
    body = _example("pd-gb300-decode-b200-prefill.yaml")
    for lws in _by_kind(_render(body), "LeaderWorkerSet").values():
        assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxSurge": 1, "maxUnavailable": 0}
    body["spec"]["rollout"] = {"maxSurge": 0, "maxUnavailable": 1}
    for lws in _by_kind(_render(body), "LeaderWorkerSet").values():
        assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxSurge": 0, "maxUnavailable": 1}


@pytest.mark.parametrize("example", [p.name for p in EXAMPLES])
def test_every_variable_the_renderer_sets_is_owned(example: str) -> None:
    """engine.env may not repeat these (Kubernetes would take the user's silently); the fabric
    defaults (render/rdma.py) are the exception: the user's value replaces them."""
    from kimik3_operator.api.spec import OWNED_ENV
    from kimik3_operator.render.rdma import FABRIC_VARIABLES

    for lws in _by_kind(_render(_example(example)), "LeaderWorkerSet").values():
        for template in lws["spec"]["leaderWorkerTemplate"].values():
            if isinstance(template, dict) and "spec" in template:
                for c in template["spec"]["containers"]:
                    assert {e["name"] for e in c["env"]} - set(OWNED_ENV) - FABRIC_VARIABLES == set(), example


def _media(body: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The aggregated leader's --allowed-media-domains values and its media env."""
    pods = _containers(_render(body), "k3-pd-gb300-rack-a-aggregated")
    assert "--allowed-media-domains" not in pods["workerTemplate"]["command"]  # headless: no frontend
    container = pods.get("leaderTemplate", pods["workerTemplate"])
    command = container["command"]
    start = command.index("--allowed-media-domains") + 1 if "--allowed-media-domains" in command else len(command)
    hosts = list(itertools.takewhile(lambda a: not a.startswith("--"), command[start:]))
    env = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith(("VLLM_MEDIA", "VLLM_IMAGE"))}
    return hosts, env


def test_python_frontends_fetch_no_image_url_unless_the_spec_names_its_hosts() -> None:
    body = _example("gb300-aggregated-tp8.yaml")
    # The Rust frontend (the default) refuses the flag at start and keeps a policy of its own.
    assert _media(body) == ([], {})
    body["spec"].setdefault("engine", {})["rustFrontend"] = False
    assert _media(body) == (["media-fetch-off.invalid"], {"VLLM_MEDIA_URL_ALLOW_REDIRECTS": "0"})
    body["spec"]["engine"]["multimodal"] = {
        "allowedMediaDomains": ["images.example.com", "cdn.example.com"], "fetchTimeoutSeconds": 10}
    assert _media(body) == (["images.example.com", "cdn.example.com"],
                            {"VLLM_MEDIA_URL_ALLOW_REDIRECTS": "0", "VLLM_IMAGE_FETCH_TIMEOUT": "10"})


@pytest.mark.parametrize("multimodal", [
    {"allowedMediaDomains": ["https://images.example.com"]},  # a URL, not a host
    {"allowedMediaDomains": ["*.example.com"]},  # vLLM compares hosts exactly: no wildcard
    {"allowedMediaDomains": ["Images.Example.com"]},  # the URL's host arrives lower-cased
    {"fetchTimeoutSeconds": 0},
])
def test_a_media_policy_vllm_would_misread_is_refused(multimodal: dict[str, Any]) -> None:
    body = _example("gb300-aggregated-tp8.yaml")
    body["spec"].setdefault("engine", {}).update(rustFrontend=False, multimodal=multimodal)
    with pytest.raises(ValueError, match="multimodal"):
        KimiK3Deployment.model_validate(body)


def _vision(body: dict[str, Any]) -> tuple[list[str], list[str], str]:
    """The aggregated role's --mm-encoder-tp-mode arguments on leader and worker, and its planned mode."""
    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, NODES) for p in spec.pools})
    pods = _containers(render_children(OWNER, plan), "k3-pd-gb300-rack-a-aggregated")

    def flag(template: str) -> list[str]:
        command = pods[template]["command"]
        return command[command.index("--mm-encoder-tp-mode"):][:2] if "--mm-encoder-tp-mode" in command else []
    return flag("leaderTemplate"), flag("workerTemplate"), plan.pools[0].roles[0].vision_encoder


@pytest.mark.parametrize(("tensor", "data", "images", "expected"), [
    (4, 2, None, (["--mm-encoder-tp-mode", "data"], ["--mm-encoder-tp-mode", "data"], "data")),
    (8, 1, None, ([], [], "data")),    # 12 vision heads over 8 ranks: vLLM takes data mode itself
    (4, 2, 0, ([], [], "off")),         # images off: vLLM never loads the tower
    (1, 16, None, ([], [], "weights")),  # one GPU per engine: the whole tower on it anyway
])
def test_tensor_parallel_roles_run_the_vision_tower_whole_on_every_rank(
        tensor: int, data: int, images: int | None, expected: tuple[list[str], list[str], str]) -> None:
    body = _example("gb300-aggregated-tp8.yaml")
    body["spec"]["pools"][0]["aggregated"]["parallelism"] = {"tensor": tensor, "data": data, "expert": True}
    if images is not None:
        body["spec"]["engine"]["multimodal"] = {"maxImagesPerPrompt": images}
    assert _vision(body) == expected


@pytest.mark.parametrize("args", [["--generation-config", "/models/k3"], ["--tokenizer_mode=mistral"],
                                  ["--seed=1", "--generation-config"]])
def test_a_value_the_rust_frontend_exits_on_is_a_planning_error_naming_the_values_it_takes(args: list[str]) -> None:
    from kimik3_operator.api.reasons import INVALID_SPEC
    from kimik3_operator.planner import PlanningError

    body = _example("gb300-aggregated-tp8.yaml")
    body["spec"]["engine"]["extraArgs"] = args
    with pytest.raises(PlanningError) as info:
        _render(body)
    assert info.value.reason == INVALID_SPEC and "Rust frontend" in info.value.message
    assert "it takes auto, " in info.value.message and "rustFrontend: false" in info.value.message
    body["spec"]["engine"]["rustFrontend"] = False
    assert _render(body)


@pytest.mark.parametrize("args", [["--generation-config", "vllm"], ["--tokenizer-mode=kimi_k3"], ["--seed=1"]])
def test_values_the_rust_frontend_takes_render(args: list[str]) -> None:
    body = _example("gb300-aggregated-tp8.yaml")
    body["spec"]["engine"]["extraArgs"] = args
    leader = _containers(_render(body), "k3-pd-gb300-rack-a-aggregated")["leaderTemplate"]
    assert leader["command"][-len(args):] == args
