"""Cap glibc's malloc arenas for the operator process, before its threads start.

glibc gives each thread that allocates while another holds the main arena an arena of its own, up
to 8 per core. The operator's informer threads (one per watched kind and namespace, k8s/cache.py)
each parse large JSON lists and watch events: their freed memory sits fragmented in their own
arena and is rarely given back, so resident memory grows with the thread count, not with what is
live. Two arenas is the usual cure for long-running threaded CPython services (it is what
MALLOC_ARENA_MAX=2 sets); bench/control_plane.py measures the operator's RSS at 500 deployments.

A user's own MALLOC_ARENA_MAX wins (glibc reads it at startup; we then leave it alone), and on a
libc without mallopt (musl) nothing is done.
"""

from __future__ import annotations

import ctypes
import os

M_ARENA_MAX = -8
"""glibc malloc.h."""
ARENAS = 2


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """True when the cap was set."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        # The process's own symbols, libc's among them: no library search (find_library runs
        # ldconfig or a compiler in a subprocess) at the operator's start.
        return bool(ctypes.CDLL(None).mallopt(M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False
