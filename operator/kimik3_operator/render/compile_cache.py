"""JIT and compile caches that outlive the pod, so a restarted engine does not compile for minutes.

Where the libraries of the vLLM 0.33.0 image keep what they compile, and the variable that moves it:
- vLLM's torch.compile artifacts, `VLLM_CACHE_ROOT`/torch_compile_cache (vllm/envs.py:714-719,
  compilation/backends.py:1096), with Inductor's and (unless the caller sets one) Triton's caches
  under it (compilation/compiler_interface.py:29-42), DeepGEMM's JIT kernels unless
  DG_JIT_CACHE_DIR is set (utils/deep_gemm.py:281-285) and FlashInfer's autotune results
  (model_executor/warmup/flashinfer_autotune_cache.py:41-54).
- Triton kernels compiled outside torch.compile (vLLM's Triton MoE and attention kernels):
  `TRITON_CACHE_DIR`, default ~/.triton/cache (vllm/snapshot/runtime.py:95); vLLM keeps a value
  the caller set (compiler_interface.py:35-42).
- DeepGEMM: `DG_JIT_CACHE_DIR` (utils/deep_gemm.py:281).
- FlashInfer's JIT-built ops: `FLASHINFER_WORKSPACE_BASE`, under which it keeps .cache/flashinfer
  (flashinfer-ai/flashinfer flashinfer/jit/env.py, FLASHINFER_BASE_DIR / FLASHINFER_CACHE_DIR).

All four point into one read-write folder, per serving image, on the deployment's weights cache
claim (ReadWriteMany, already bound for the staged checkpoints): every pod of every role shares it,
and each library keys its entries by what they were compiled for (vLLM by its config hash, Triton
by kernel source and backend, FlashInfer by GPU architecture). The folder is per image because a
new vLLM, Triton or CUDA build must not load kernels an older build wrote. A deployment whose
checkpoints are all pvc:// has no cache claim; it gets a small claim of its own for this.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..contract.kinds import PERSISTENT_VOLUME_CLAIM
from ..planner import WeightsPlan
from .names import Owner, bounded, object_meta
from .weights import cache_claim_name

VOLUME = "compile-cache"
MOUNT_PATH = "/compile-cache"
FOLDER = "compile-cache"
"""Folder of the weights cache claim (beside the staged checkpoints' folders)."""
OWN_CLAIM_SIZE = "100Gi"
"""vLLM's compile artifacts, Triton, DeepGEMM and FlashInfer kernels of a few images: a few GB each."""
ENV_NAMES = ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "DG_JIT_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")


def image_key(image: str) -> str:
    return hashlib.sha256(image.encode()).hexdigest()[:12]


def claim_name(owner: Owner, weights: WeightsPlan) -> str:
    return cache_claim_name(owner) if weights.needs_cache else bounded(f"{owner.name}-compile-cache", 253)


def own_claim(owner: Owner, weights: WeightsPlan) -> list[dict[str, Any]]:
    """The compile cache's own claim, when there is no weights cache claim to share."""
    if weights.needs_cache:
        return []
    spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": OWN_CLAIM_SIZE}}}
    if weights.cache_storage_class:
        spec["storageClassName"] = weights.cache_storage_class
    meta = object_meta(owner, claim_name(owner, weights), None, None)
    if weights.cache_retained:  # spec.model.cache.retentionPolicy covers this cache claim too
        del meta["ownerReferences"]
    return [{**PERSISTENT_VOLUME_CLAIM.type_meta(), "metadata": meta, "spec": spec}]


def volume(owner: Owner, weights: WeightsPlan) -> dict[str, Any]:
    return {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim_name(owner, weights)}}


def mount(image: str) -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": MOUNT_PATH, "subPath": f"{FOLDER}/{image_key(image)}"}


def env() -> list[dict[str, str]]:
    return [{"name": "VLLM_CACHE_ROOT", "value": f"{MOUNT_PATH}/vllm"},
            {"name": "TRITON_CACHE_DIR", "value": f"{MOUNT_PATH}/triton"},
            {"name": "DG_JIT_CACHE_DIR", "value": f"{MOUNT_PATH}/deep_gemm"},
            {"name": "FLASHINFER_WORKSPACE_BASE", "value": MOUNT_PATH}]
