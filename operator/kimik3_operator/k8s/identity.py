"""Who this operator process is, as the API server should see it.

One identity per process (not per pod): `$POD_NAME` (the downward API) or the hostname, plus a
short random suffix, so a restarted container is a new candidate for the Lease and the audit log
tells two replicas, and two lives of one replica, apart by the User-Agent of every request.
"""

from __future__ import annotations

import os
import socket
import uuid

from .. import __version__


def _identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


IDENTITY = _identity()


def user_agent(component: str = "") -> str:
    """`kimik3-operator/VERSION [component] (IDENTITY)`: the User-Agent of every request."""
    return f"kimik3-operator/{__version__}{' ' + component if component else ''} ({IDENTITY})"
