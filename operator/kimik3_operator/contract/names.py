"""The names the operator writes onto the cluster to recognise its own work there.

The API, the renderer (which stamps them) and the API client (which reads them back to decide
whether an object drifted) share these; the client must not import the renderer for them.
"""

GROUP = "serving.kimik3.dev"
"""The API group of KimiK3Deployment and the prefix of every label and annotation the operator sets."""

FIELD_MANAGER = "kimik3-operator"
"""The server-side-apply field manager of the operator's writes: fields under another manager
are someone else's edit."""

ANNOTATION_HASH = f"{GROUP}/desired-hash"
"""Carries the hash of the object as rendered: an apply is skipped while it matches."""
