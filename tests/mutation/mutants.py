"""Each planning rule, broken on purpose, and the named test that must catch it.

A mutant replaces one snippet of the operator's source (which must occur exactly once); the
harness runs only the named test against the mutated copy and expects it to fail.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    rule: str
    path: str  # relative to operator/kimik3_operator
    original: str
    mutated: str
    test: str  # pytest node id that must fail


MUTANTS: tuple[Mutant, ...] = (
    Mutant("memory floor counts toward the fit", "planner/memory.py",
           "return self.weights + self.floor - self.budget", "return self.weights - self.budget",
           "tests/unit/test_layout.py::test_gpus_per_replica_from_memory_fit"),
    Mutant("replicated weights stay whole on every TP rank", "planner/memory.py",
           "(BF16_WEIGHT_BYTES - REPLICATED_BYTES) / (tensor * pipeline) + REPLICATED_BYTES / pipeline",
           "BF16_WEIGHT_BYTES / (tensor * pipeline)",
           "tests/unit/test_layout.py::test_weights_per_gpu_match_the_reference_table"),
    Mutant("tensor parallelism never spans the RDMA boundary", "planner/layout.py",
           "if layout.tensor > domain:", "if layout.tensor > 2 * domain:",
           "tests/unit/test_layout.py::test_explicit_layout_rejections"),
    Mutant("disaggregated roles never pipeline", "planner/layout.py",
           "if disaggregated and layout.pipeline > 1:", "if False:",
           "tests/unit/test_layout.py::test_explicit_layout_rejections"),
    Mutant("expert parallel size divides 896", "planner/layout.py",
           "if layout.expert and NUM_EXPERTS % (layout.tensor * layout.data):", "if False:",
           "tests/unit/test_layout.py::test_explicit_layout_rejections"),
    Mutant("replicas span whole nodes", "planner/layout.py",
           "if layout.gpus > node and layout.gpus % node:", "if False:",
           "tests/unit/test_layout.py::test_explicit_layout_rejections"),
    Mutant("aggregated HGX replicas pipeline across nodes", "planner/layout.py",
           'if role == "aggregated":\n        yield Layout(tensor=tp, pipeline=count // tp)', "if False:\n        pass",
           "tests/unit/test_layout.py::test_layout_shape_by_role"),
    Mutant("prefill uses DEP", "planner/layout.py",
           'if role == "prefill":', 'if role == "never":',
           "tests/unit/test_layout.py::test_layout_shape_by_role"),
    Mutant("tensor parallel divides the 96 heads", "api/v1alpha1.py",
           "check=lambda p: KDA_HEADS % p.tensor == 0,", "check=lambda p: True,",
           "tests/unit/test_api.py::test_rule_rejects_its_negative_example"),
    Mutant("all-to-all only when EP spans DP ranks", "planner/backends.py",
           "return layout.expert and layout.data > 1", "return layout.expert",
           "tests/unit/test_backends.py::test_default_backends"),
    Mutant("RDMA expert groups use deepep_v2", "planner/backends.py",
           'return "deepep_v2" if crosses_rdma else "flashinfer_nvlink_one_sided"',
           'return "flashinfer_nvlink_one_sided"',
           "tests/unit/test_backends.py::test_default_backends"),
    Mutant("MegaMoE for expert parallel layouts", "planner/backends.py",
           'return "deep_gemm_mega_moe" if layout.expert else "flashinfer_trtllm"', 'return "flashinfer_trtllm"',
           "tests/unit/test_backends.py::test_default_backends"),
    Mutant("no NVIDIA kernels on AMD", "planner/backends.py",
           "if rule.vendor != gpu.vendor:", "if False:",
           "tests/unit/test_backends.py::test_invalid_overrides_are_rejected"),
    Mutant("no Blackwell-only kernels on Hopper", "planner/backends.py",
           "if rule.generations is not None and gpu.generation not in rule.generations:", "if False:",
           "tests/unit/test_backends.py::test_invalid_overrides_are_rejected"),
    Mutant("Hopper experts run Marlin W4A16", "planner/backends.py",
           'if gpu.generation == "hopper":\n        return "marlin"', 'if False:\n        return "marlin"',
           "tests/unit/test_backends.py::test_default_backends"),
    Mutant("NVL72 multi-tray replicas get a ComputeDomain", "planner/topology.py",
           "multi_node_nvlink = nodes > 1 and not crosses_rdma", "multi_node_nvlink = False",
           "tests/unit/test_planner.py::test_layout_to_groups"),
    Mutant("a replica's pods share one clique", "render/workloads.py",
           '"topologyKey": role.group_topology_key,', '"topologyKey": "kubernetes.io/hostname",',
           "tests/unit/test_render.py::test_multi_node_nvlink_group_stays_in_one_clique"),
    Mutant("1P1D over NIXL is refused", "planner/traps.py",
           'applies=lambda pools: _replicas(pools, "prefill") == 1 and _replicas(pools, "decode") == 1,',
           "applies=lambda pools: False,",
           "tests/unit/test_planner.py::test_one_prefill_one_decode_is_a_known_trap"),
    Mutant("rate matching covers the request rate", "planner/split.py",
           "share = max(0.0, rate - served) / len(missing)", "share = 0.0",
           "tests/unit/test_split.py::test_replicas_grow_with_request_rate"),
    Mutant("extraArgs may not set owned flags", "api/v1alpha1.py",
           "check=lambda e: owned_flag(e.extra_args) is None,", "check=lambda e: True,",
           "tests/unit/test_api.py::test_rule_rejects_its_negative_example"),
    Mutant("prefix caching is always explicit", "render/engine.py",
           'args.append("--enable-prefix-caching" if engine.prefix_caching else "--no-enable-prefix-caching")',
           "pass",
           "tests/unit/test_render.py::test_prefix_caching_is_always_explicit"),
)

MUTANTS += (
    Mutant("block size follows vLLM's hybrid alignment", "planner/blocks.py",
           "return MLA_ALIGN * math.ceil(state / (MLA_ALIGN * mla_bytes))", "return MLA_ALIGN",
           "tests/unit/test_blocks.py::test_block_size_matches_vllm"),
    Mutant("retention interval is rounded to a multiple of every role's block", "planner/topology.py",
           "interval = round_interval(interval, granularity)", "interval = interval",
           "tests/unit/test_planner.py::test_retention_policy_maps_to_interval"),
    Mutant("prefill and decode stay on one GPU generation", "planner/topology.py",
           "if len(kinds) > 1:", "if False:",
           "tests/unit/test_planner.py::test_pd_pairs_need_one_gpu_generation"),
    Mutant("workers run headless", "render/engine.py",
           'if worker:\n        # Nothing infers this from the node rank: without it a worker starts API servers too.\n'
           '        args.append("--headless")', "pass",
           "tests/unit/test_render.py::test_multi_node_ranks_rendezvous_at_the_leader"),
    Mutant("KDA conv state crosses NIXL in the DS layout", "render/engine.py",
           '{"name": "VLLM_SSM_CONV_STATE_LAYOUT", "value": "DS"}]', "]",
           "tests/unit/test_render.py::test_pd_roles_share_the_kda_transfer_settings"),
    Mutant("NIXL side channel on the pod IP", "render/engine.py",
           '{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "$(POD_IP)"}',
           '{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "localhost"}',
           "tests/unit/test_render.py::test_pd_pods_carry_nixl_side_channel_settings"),
    Mutant("DSpark runs on Model Runner V2", "render/engine.py",
           'env.append({"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"})', "pass",
           "tests/unit/test_render.py::test_serving_pod_essentials"),
    Mutant("the Hub token reaches the staging Job from a Secret", "render/weights.py",
           'env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": name, "key": key}}})', "pass",
           "tests/unit/test_weights_render.py::test_hub_sources_stage_into_the_cache_claim_with_the_token_as_a_secret_reference"),
    Mutant("serving pods wait for the staged commit", "render/weights.py",
           's.mount_path, s.commit or ""', 's.mount_path, ""',
           "tests/unit/test_weights_render.py::test_serving_pods_mount_read_only_and_wait_for_the_staged_commit"),
    Mutant("nothing serves before its weights are staged", "reconcile/reconciler.py",
           "if weights.all_staged:", "if True:",
           "tests/unit/test_reconciler.py::test_weights_are_staged_before_anything_serves_then_steady_state_writes_nothing"),
    Mutant("the staged commit enters the P/D compatibility hash", "planner/plan.py",
           '**({"commits": dict(self.commits)} if self.commits else {}),', "",
           "tests/unit/test_weights_render.py::test_serving_pods_mount_read_only_and_wait_for_the_staged_commit"),
    Mutant("AITER on for MI355X", "render/engine.py",
           'env.append({"name": "VLLM_ROCM_USE_AITER", "value": "1"})', "pass",
           "tests/unit/test_render.py::test_amd_pools_turn_aiter_on"),
)
