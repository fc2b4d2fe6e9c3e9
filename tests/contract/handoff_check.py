#!/usr/bin/env python3
"""What vLLM 0.33.0 itself says of Kimi K3's prefill/decode pairs: each role's MLA backend, kernel
block and blocks per logical block, and which pairs its NIXL handshake refuses. Offline, no GPU.

Run with the python of the venv made by scripts/vllm-venv.sh (never imported by the project's venv):

    echo '[{"name": "a", "prefix_caching": true, "roles": [{"name": "p", "role": "prefill",
            "vendor": "nvidia", "capability": [10, 3], "kv_cache_dtype": "fp8", "block": 2944,
            "tensor": 4}, ...]}]' | "$VENV/bin/python" tests/contract/handoff_check.py

Output: per case {"name", "ok", "errors", "roles": {name: {"backend", "kernel", "per_logical"}},
"refused": [[prefill, decode, check], ...]}, plus one case "sources" whose errors list every cited
line range of vLLM that changed since it was read (a vLLM bump fails until someone re-reads it).

How each input is taken from vLLM (the CUDA platform, flashinfer, FlashAttention and NIXL cannot
load here, so nothing that needs them is imported):
  priority   platforms/cuda.py `_get_backend_priorities` (platforms/rocm.py for AMD, with AITER's MLA
             on, as the operator's VLLM_ROCM_USE_AITER=1 makes it): the function's own source, run.
  backends   each backend class's `supported_kv_cache_dtypes`, `supports_compute_capability`,
             `get_supported_kernel_block_sizes` and `is_sparse`, read from its module's source
             (the registry names the module); the first in priority order that runs the GPU, the
             dtype and dense MLA wins, as the selector's validate_configuration does. Probes that
             need the hardware (FlashMLA's and FlashAttention's `supports_combination`) are not
             run: hardware remains the final word there.
  kernel     v1/worker/utils.py `select_common_block_size`, imported, over that backend and K3's KDA
             backend, which keeps AttentionBackend's default sizes (checked: neither
             KimiK3KDAAttentionBackend nor GDNAttentionBackend overrides them).
  handshake  decode is the local side (pull mode): kv_connector/utils.py `TransferTopology.tp_ratio`
             and `block_size_ratio`, and nixl/base_worker.py `_split_remote_blocks`, imported and
             called on stand-in objects; then the prefix-caching comparison of
             base_worker.py:2766-2779, whose text is checksummed below.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from check_harness import serve  # this script's own folder

os.environ["VLLM_TARGET_DEVICE"] = "cpu"

import vllm

VLLM = Path(vllm.__file__).parent
NIXL = "distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py"
CITED = {
    ("platforms/cuda.py", 83, 155): "_get_backend_priorities for CUDA",
    ("platforms/rocm.py", 531, 551): "_get_backend_priorities for ROCm (MLA branch)",
    ("v1/worker/utils.py", 515, 560): "select_common_block_size",
    (NIXL, 1063, 1082): "_sync_block_size_with_kernel: physical_blocks_per_logical = block // kernel",
    (NIXL, 2338, 2387): "_split_remote_blocks",
    (NIXL, 2498, 2500): "the split runs for hybrid MLA models in pull mode",
    (NIXL, 2720, 2723): "tp_ratio and block_size_ratio at the handshake",
    (NIXL, 2731, 2749): "the head-sharded draft rule (no such regions for K3)",
    (NIXL, 2766, 2779): "prefix caching with heterogeneous physical_blocks_per_logical",
    ("distributed/kv_transfer/kv_connector/utils.py", 522, 547): "tp_ratio, block_size_ratio",
    ("models/kimi_k3/nvidia/mla.py", 324, 331): "K3's MLA asks the selector for dense MLA",
}
"""(file, first line, last line) -> what the rule takes from it. Their sha256 is EXPECTED."""

EXPECTED = {
    "platforms/cuda.py:83-155":
        "d69934c45bc11421d2c60774cc4dc79d64fc0d8f2deed5b9fe5886fc43368cb3",
    "platforms/rocm.py:531-551":
        "897a009baa8385b0b85df58d0fdaa9c7809936275337f9b053bb7ba7b5ad4826",
    "v1/worker/utils.py:515-560":
        "a93560fed7b32d31bf06b19a6db5a2a721d7b87acdeb5bc89702e5a2a8219ed9",
    "distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:1063-1082":
        "d0fa5a042d6c8be81d13645a12d7cf859b246803a0deb9e242609feedaa46717",
    "distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:2338-2387":
        "f0c086fd343a30a696478ac96c68298f69c0f5a401895b5847664c8b06fdd2fd",
    "distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:2498-2500":
        "0cc405b4152af00c8d2eb6d56879a59cd72f22adcd24a2fa3c3745e937da808d",
    "distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:2720-2723":
        "c8c892e7b05e4eccdb69ba54a409c88f69169782957c81b927c3b78aba28d1f8",
    "distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:2731-2749":
        "4883849b75412169dc234b871ea5ba1d5553bb4e895eb10acaa98ef84842f36f",
    "distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:2766-2779":
        "d37577fd4e5fa27cafd88493cbd1cf65f3babbaa9252fa3e34ef8bbfbf729c55",
    "distributed/kv_transfer/kv_connector/utils.py:522-547":
        "4d0dfcc9dc9de804f5e2d0f30c8d58ba6a78fc8fde5f4708ccbdb72a5d8735cb",
    "models/kimi_k3/nvidia/mla.py:324-331":
        "5dbfe109836648bddcb9a4777ac813cdaaac36ef0281906ff5d29042a2f6ac96",
}
"""sha256 of each cited range in vLLM 0.33.0, as read for docs/pd-handoff.md."""


def digest(path: str, first: int, last: int) -> str:
    lines = (VLLM / path).read_text().splitlines()[first - 1:last]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _function(path: str, name: str) -> ast.FunctionDef:
    tree = ast.parse((VLLM / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"{path}: no function {name}")


def _bare(fn: ast.FunctionDef) -> ast.FunctionDef:
    """The function without decorators and annotations, so it runs outside its module."""
    fn = ast.parse(textwrap.dedent(ast.unparse(fn))).body[0]  # a copy
    assert isinstance(fn, ast.FunctionDef)
    fn.decorator_list, fn.returns = [], None
    for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
        a.annotation = None
    return fn


def _run(fn: ast.FunctionDef, namespace: dict[str, Any]) -> Any:
    module = ast.Module(body=[_bare(fn)], type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), fn.name, "exec"), namespace)
    return namespace[fn.name]


class _Names:
    """AttentionBackendEnum stand-in: each member is its name."""

    def __getattr__(self, name: str) -> str:
        return name


@functools.cache
def priorities(vendor: str, capability: tuple[int, ...] | None, kv_cache_dtype: str, heads: int) -> list[str]:
    if vendor == "amd":
        from vllm._aiter_ops import rocm_aiter_ops
        # What VLLM_ROCM_USE_AITER=1 gives on an MI355X (VLLM_ROCM_USE_AITER_MLA is on by default); off
        # ROCm the probe behind is_mla_enabled says no, so it is answered here.
        rocm_aiter_ops.is_mla_enabled = classmethod(lambda cls: True)
        run = _run(_function("platforms/rocm.py", "_get_backend_priorities"), {"AttentionBackendEnum": _Names()})
        return list(run(True, False, True))
    major, minor = capability or (0, 0)
    run = _run(_function("platforms/cuda.py", "_get_backend_priorities"), {"AttentionBackendEnum": _Names()})
    return list(run(True, SimpleNamespace(major=major, minor=minor), heads, kv_cache_dtype))


@functools.cache
def _module_classes(module: str) -> tuple[dict[str, ast.ClassDef], dict[str, str]]:
    """A module's classes, and the module each name it imports comes from (read, not imported:
    importing a model package would import the model)."""
    path = VLLM.parent / module.replace(".", "/")
    tree = ast.parse((path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text())
    imports = {(a.asname or a.name): n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
               for a in n.names}
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}, imports


def _lineage(module: str, name: str) -> list[ast.ClassDef]:
    """The class and its bases, nearest first, followed across modules by their imports."""
    classes, imports = _module_classes(module)
    cls = classes[name]
    out = [cls]
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            out += _lineage(module, base.id)
        elif isinstance(base, ast.Name) and imports.get(base.id, "").startswith("vllm."):
            out += _lineage(imports[base.id], base.id)
    return out


def _class_lineage(name: str) -> list[ast.ClassDef]:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    module, _, cls = AttentionBackendEnum[name].get_path().rpartition(".")
    return _lineage(module, cls)


def _member(lineage: list[ast.ClassDef], name: str) -> ast.AST | None:
    for cls in lineage:
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return node.value
    return None


def _capability(method: ast.AST | None) -> Any:
    """supports_compute_capability as a function of the capability (AttentionBackend's when not overridden)."""
    if method is None:
        return lambda capability: True
    assert isinstance(method, ast.FunctionDef)
    run = _run(method, {})
    return lambda capability: run(None, capability)


@functools.cache
def backend_facts(name: str) -> dict[str, Any]:
    """What the selector and the kernel-block choice read of one backend class ("sizes" is its
    get_supported_kernel_block_sizes, called only for the backend chosen)."""
    from vllm.v1.attention.backend import AttentionBackend, MultipleOf
    lineage = _class_lineage(name)
    dtypes = _member(lineage, "supported_kv_cache_dtypes")
    sizes = _member(lineage, "get_supported_kernel_block_sizes")
    capability = _member(lineage, "supports_compute_capability")
    sparse = _member(lineage, "is_sparse")
    return {
        "kv_dtypes": None if dtypes is None else ast.literal_eval(dtypes),
        "sizes": AttentionBackend.get_supported_kernel_block_sizes if sizes is None
        else _run(sizes, {"MultipleOf": MultipleOf}),
        "capability": _capability(capability),
        "sparse": sparse is not None and (_run(sparse, {})(None) if isinstance(sparse, ast.FunctionDef)
                                          else ast.literal_eval(sparse)),
    }


def mla_backend(role: dict[str, Any]) -> str | None:
    """The first backend of the priority that serves dense MLA on this GPU with this KV dtype."""
    major, minor = role["capability"] or (0, 0)
    capability = tuple(role["capability"]) if role["capability"] else None
    for name in priorities(role["vendor"], capability, role["kv_cache_dtype"], 96 // role["tensor"]):
        facts = backend_facts(name)
        if facts["sparse"] or (facts["kv_dtypes"] and role["kv_cache_dtype"] not in facts["kv_dtypes"]):
            continue
        if role["capability"] is not None and not facts["capability"](SimpleNamespace(major=major, minor=minor)):
            continue
        return name
    return None


def kernel(block: int, backend: str) -> int:
    from vllm.v1.attention.backend import AttentionBackend
    from vllm.v1.worker.utils import select_common_block_size
    sizes = backend_facts(backend)["sizes"]()
    mla = type("Mla", (), {"get_supported_kernel_block_sizes": staticmethod(lambda spec=None: sizes),
                           "get_name": staticmethod(lambda: backend)})
    kda = type("Kda", (), {
        "get_supported_kernel_block_sizes": staticmethod(AttentionBackend.get_supported_kernel_block_sizes),
        "get_name": staticmethod(lambda: "KIMI_K3_KDA")})
    return int(select_common_block_size(block, [mla, kda], [None, None]))


def handshake(prefill: dict[str, Any], decode: dict[str, Any], prefix_caching: bool) -> str | None:
    """The check that refuses the decode's handshake with the prefill, or None."""
    from vllm.distributed.kv_transfer.kv_connector.utils import TransferTopology
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker
    local = SimpleNamespace(tp_size=decode["tensor"], block_size=decode["kernel"])
    try:
        TransferTopology.tp_ratio(local, prefill["tensor"])  # type: ignore[arg-type]
    except AssertionError:
        return "tp_ratio"
    lens = [prefill["kernel"] * 576]
    meta = SimpleNamespace(block_size=prefill["kernel"], physical_blocks_per_logical_kv_block=prefill["per_logical"],
                           num_blocks=1024, block_lens=lens, block_strides=list(lens), ple_block_len=None,
                           region_num_blocks=None)
    NixlBaseConnectorWorker._split_remote_blocks(local, meta)  # type: ignore[arg-type]
    try:
        TransferTopology.block_size_ratio(local, meta.block_size)  # type: ignore[arg-type]
    except AssertionError:
        return "block_size_ratio"
    # base_worker.py:2766-2779 (_has_mamba is true for K3: its KDA layers are GDN-type mamba layers)
    if meta.physical_blocks_per_logical_kv_block != decode["per_logical"] and prefix_caching:
        return "heterogeneous physical_blocks_per_logical"
    return None


def kda_keeps_default_sizes() -> list[str]:
    errors = []
    for module, name in (("vllm.models.kimi_k3.nvidia.kda_metadata", "KimiK3KDAAttentionBackend"),
                         ("vllm.models.kimi_k3.amd.kda_metadata", "KimiK3ROCmKDABackend")):
        lineage = _lineage(module, name)
        if lineage[-1].name != "AttentionBackend":
            errors.append(f"{name} no longer derives from AttentionBackend alone: {[c.name for c in lineage]}")
        for cls in lineage:
            if cls.name != "AttentionBackend" and _member([cls], "get_supported_kernel_block_sizes") is not None:
                errors.append(f"{cls.name}, a base of K3's KDA backend {name}, now sets its own kernel block sizes")
    return errors


def sources() -> dict[str, Any]:
    errors = [f"{path}:{a}-{b} ({what}) changed: sha256 {digest(path, a, b)}, read as {EXPECTED.get(f'{path}:{a}-{b}')}"
              for (path, a, b), what in CITED.items() if EXPECTED.get(f"{path}:{a}-{b}") != digest(path, a, b)]
    return {"name": "sources", "ok": not errors, "errors": errors + kda_keeps_default_sizes()}


def check(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [sources()]
    for case in cases:
        roles: dict[str, dict[str, Any]] = {}
        errors: list[str] = []
        for role in case["roles"]:
            backend = mla_backend(role)
            if backend is None:
                roles[role["name"]] = {"backend": None, "kernel": None, "per_logical": None}
                continue
            k = kernel(role["block"], backend)
            roles[role["name"]] = {"backend": backend, "kernel": k, "per_logical": role["block"] // k}
        refused = []
        for p in case["roles"]:
            for d in case["roles"]:
                if p["role"] != "prefill" or d["role"] != "decode" or roles[p["name"]]["backend"] is None \
                        or roles[d["name"]]["backend"] is None:
                    continue
                why = handshake({**p, **roles[p["name"]]}, {**d, **roles[d["name"]]}, case["prefix_caching"])
                if why:
                    refused.append([p["name"], d["name"], why])
        out.append({"name": case["name"], "ok": not errors, "errors": errors, "roles": roles, "refused": refused})
    return out


if __name__ == "__main__":
    raise SystemExit(serve(check))
