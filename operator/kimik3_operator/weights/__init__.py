"""Stage model weights into the shared cache volume once, before serving pods start.

Runs in a Kubernetes Job (``python -m kimik3_operator.weights stage ...``); serving pods' init containers
run ``... wait``. Sources: ``hf://org/name`` (huggingface_hub), ``s3://bucket/prefix`` (SigV4 over
requests), ``pvc://claim/path`` (verify in place). This package imports neither kopf nor the Kubernetes
client, and is the only one that imports huggingface_hub (lazily: importing it costs nothing).

    from kimik3_operator.weights import stage
    result = stage("hf://moonshotai/Kimi-K3", "main", "/cache/kimi-k3", token=os.environ.get("HF_TOKEN"))
    result.commit, result.files, result.bytes, result.skipped_bytes
"""

from .model import (
    ChecksumMismatch,
    FileEntry,
    Manifest,
    RemoteFile,
    StageResult,
    WeightsError,
    marker_path,
    read_manifest,
)
from .progress import Progress
from .engine import stage
from .uri import ModelUri, parse_uri
from .wait import WaitResult, check_ready, wait_ready

__all__ = [
    "ChecksumMismatch",
    "FileEntry",
    "Manifest",
    "ModelUri",
    "Progress",
    "RemoteFile",
    "StageResult",
    "WaitResult",
    "WeightsError",
    "check_ready",
    "marker_path",
    "parse_uri",
    "read_manifest",
    "stage",
    "wait_ready",
]
