"""What the operator and the stager agree on about a staging run, beyond the model URI (uri.py).

The stager runs in a Job from the operator image (`python -m kimik3_operator.stager stage`) and
may not import the operator; the operator renders its Job, reads its progress from an annotation
of that Job, and makes serving pods wait for the completion marker it leaves. Both sides read
these names and formats from here.
"""

import re

from .names import GROUP

STAGER_MODULE = "kimik3_operator.stager"
"""What the staging Job runs: `python -m STAGER_MODULE stage --uri ... --dest ...`."""

PROGRESS_ANNOTATION = f"{GROUP}/weights-progress"
"""The staging pod keeps its latest progress record (JSON) in this annotation of its own Job."""

PROGRESS_FIELD_MANAGER = "kimik3-weights-progress"
"""The staging pod writes PROGRESS_ANNOTATION under this field manager; the operator does not
take that write for drift of the Job it applied."""

STATE_DIR = ".kimik3"
"""The stager's own folder inside a destination (vLLM ignores a hidden folder)."""
MARKER_NAME = "ready.json"
"""The completion marker in STATE_DIR: the manifest of a finished stage, written last."""

HUB_COMMIT = re.compile(r"^[0-9a-f]{40}$")
"""A Hugging Face Hub commit: a revision of this form names itself, no resolving needed."""
CONTENT_COMMIT = re.compile(r"^[0-9a-f]{64}$")
"""The stager's commit of an s3:// prefix or a pvc:// folder: a sha256 over its file list. A
revision of this form pins that content."""
