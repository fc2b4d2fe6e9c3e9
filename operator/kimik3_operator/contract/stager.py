"""What the operator and the stager agree on about a staging run, beyond the model URI (uri.py).

The stager runs in a Job from the operator image (`python -m kimik3_operator.stager stage`) and
may not import the operator; the operator renders its Job, reads its progress from a ConfigMap
made for that Job alone, its commit from the termination message of the Job's own pod, and makes
serving pods wait for the completion marker it leaves. Both sides read these names and formats
from here.

The staging pod's only write is its progress: its Role allows `patch` on its progress ConfigMap by
name and nothing else (not its Job: parallelism, suspend, owner references, finalizers and the
Job's status stay out of its reach). The operator takes whatever it reads back, the ConfigMap and
the termination message alike, as untrusted: a record larger than MAX_RECORD_BYTES is dropped,
and only the keys below, of the right type and range, are read.
"""

import re

STAGER_MODULE = "kimik3_operator.stager"
"""What the staging Job runs: `python -m STAGER_MODULE stage --uri ... --dest ...`."""

PROGRESS_KEY = "progress"
"""The staging pod keeps its latest progress record (JSON) under this key of its progress
ConfigMap (`stage --report-configmap NAME`), with a JSON merge patch."""

PROGRESS_FIELD_MANAGER = "kimik3-weights-progress"
"""The staging pod writes PROGRESS_KEY under this field manager; the operator does not take that
write (and only that one: `data.<PROGRESS_KEY>`) for drift of the ConfigMap it applied."""

MAX_RECORD_BYTES = 4000
"""A progress record's JSON never exceeds this (it fits a termination message, 4096 bytes); the
operator ignores a larger one."""

PHASES = ("Pending", "Resolving", "Listing", "Downloading", "Verifying", "Complete", "Failed")
"""A progress record's `phase`."""
COUNTERS = ("filesDone", "filesTotal", "bytesDone", "bytesTotal")
"""The record's counters the operator shows (non-negative integers), beside `percent` (0-100)."""
REASON = re.compile(r"^[A-Z][A-Za-z0-9]{0,63}$")
"""A failed record's `reason`, e.g. RevisionNotFound."""
MAX_MESSAGE = 1024
"""A record's `message` is cut to this length."""

S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION")
"""The keys of an s3:// source's Secret the staging pod gets, each as the variable of its name
(by secretKeyRef, each optional: never the whole Secret)."""

STATE_DIR = ".kimik3"
"""The stager's own folder inside a destination (vLLM ignores a hidden folder)."""
MARKER_NAME = "ready.json"
"""The completion marker in STATE_DIR: the manifest of a finished stage, written last."""

HUB_COMMIT = re.compile(r"^[0-9a-f]{40}$")
"""A Hugging Face Hub commit: a revision of this form names itself, no resolving needed."""
CONTENT_COMMIT = re.compile(r"^[0-9a-f]{64}$")
"""The stager's commit of an s3:// prefix or a pvc:// folder: a sha256 over its file list. A
revision of this form pins that content."""
