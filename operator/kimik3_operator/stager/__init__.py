"""The stager: stage model weights into the shared cache volume once, before serving pods start.

Runs in a Kubernetes Job (``python -m kimik3_operator.stager stage ...``, the command the operator
renders). Sources: ``hf://org/name`` (huggingface_hub), ``s3://bucket/prefix`` (SigV4 over requests),
``pvc://claim/path`` (verify in place). It imports neither kopf nor the Kubernetes client nor the
operator; what it shares with the operator (the URI grammar, the marker, the progress record) is
in ``kimik3_operator.contract``. It is the only package that imports huggingface_hub (lazily:
importing the stager costs nothing).

    flow.py        stage(): lock, resolve, fast path, stage the files, write the marker
    files.py       per file: skip, verify, fetch or resume; the destination lock; the space check
    source.py      what a source offers (Source, RemoteFile) and the partial file it writes into
    hf.py s3.py pvc.py (sigv4.py)   the sources
    listing.py     what a listing must be (sizes, names, no file that is also a folder)
    manifest.py    what a stage leaves on disk: the marker (manifest), the journal
    confine.py     paths that stay inside the destination (no symlink leads out)
    digests.py     hashing while writing, and the checksums sources vouch for
    progress.py progress_configmap.py   progress records: stdout, the termination message, the Job's ConfigMap
    redact.py      secrets and URL credentials masked in everything printed
    wait.py        wait until a destination holds a complete stage

    from kimik3_operator.stager import stage
    result = stage("hf://moonshotai/Kimi-K3", "main", "/cache/kimi-k3", token=os.environ.get("HF_TOKEN"))
    result.commit, result.files, result.bytes, result.skipped_bytes
"""

from .errors import ChecksumMismatch, WeightsError
from .flow import StageResult, parse_uri, stage
from .manifest import FileEntry, Manifest, marker_path, read_manifest
from .progress import Progress
from .source import RemoteFile
from .wait import WaitResult, check_ready, wait_ready

__all__ = [
    "ChecksumMismatch",
    "FileEntry",
    "Manifest",
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
