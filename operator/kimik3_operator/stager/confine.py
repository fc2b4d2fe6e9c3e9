"""Paths under a destination that stay under it: no symlink leads the stager outside ``dest``.

Whoever could write the cache volume before this run (an earlier, compromised run; a hand edit) may
have left symlinks: a folder on the way to a listed file, the state folder, the lock, a marker or a
partial file pointing elsewhere. Every path the stager writes, removes or reads is therefore one of:

- a folder made of real folders (``ensure_dir``): a symlink or a file in the way is removed and a folder
  made in its place when the stager owns that spot (``heal``: its state folder; every listed path of a
  source it fetches), or refused with UnsafePath;
- a file opened with O_NOFOLLOW (``open_nofollow``), whose folder is one of the above;
- a file of a pvc:// volume read in place (``resolved``): symlinks are followed, but only to a place
  inside ``dest``.

``dest`` itself is taken as it is (a symlink there is the operator's own choice of folder); everything
below it is checked.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import threading
from pathlib import Path, PurePosixPath

from .errors import WeightsError

log = logging.getLogger(__name__)


def root_of(dest: Path) -> Path:
    return Path(os.path.realpath(dest))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _kind(mode: int) -> str:
    return "symlink" if stat.S_ISLNK(mode) else "folder" if stat.S_ISDIR(mode) else "file"


def _remove(path: Path) -> None:
    """Remove what is at ``path`` without following it (a symlink goes, never its target)."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # does not follow symlinks inside
    else:
        os.unlink(path)


def ensure_dir(dest: Path, rel: str, *, heal: bool) -> Path:
    """The folder ``dest/rel``, every component a real folder (made when missing). A symlink or file in the
    way is replaced by a folder when ``heal``, else refused (UnsafePath). One thread at a time: workers
    staging files of one folder would otherwise remove each other's fresh folder or the same symlink."""
    with _MAKING:
        return _ensure_dir(dest, rel, heal)


_MAKING = threading.Lock()


def _ensure_dir(dest: Path, rel: str, heal: bool) -> Path:
    cur = root_of(dest)
    for name in PurePosixPath(rel).parts:
        cur = cur / name
        try:
            os.mkdir(cur)
            continue
        except FileExistsError:  # also when a parallel worker made it a moment ago
            pass
        st = os.lstat(cur)
        if stat.S_ISDIR(st.st_mode):
            continue
        if not heal:
            raise WeightsError("UnsafePath", f"{rel}: {name} is a {_kind(st.st_mode)}, not a folder")
        log.warning("%s: a %s is in the way of a folder; replacing it", cur, _kind(st.st_mode))
        _remove(cur)
        os.mkdir(cur)
    return cur


def target_path(dest: Path, rel: str) -> Path:
    """Where a fetched file ``rel`` goes: its folders made real (``ensure_dir``), its name not followed."""
    p = PurePosixPath(rel)
    return ensure_dir(dest, str(p.parent), heal=True) / p.name


def clear_for_file(path: Path) -> None:
    """Remove a folder or symlink where a file is about to be renamed into place."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        log.warning("%s: a %s is in the way of a file; replacing it", path, _kind(st.st_mode))
        _remove(path)


def _parts(rel: str) -> tuple[str, ...]:
    """The names of a relative path that stays below its root; () for any other (absolute, '..')."""
    parts = PurePosixPath(rel).parts
    return () if not parts or parts[0] == "/" or ".." in parts else parts


def plain_stat(dest: Path, rel: str) -> os.stat_result | None:
    """The stat of ``dest/rel`` when it is a regular file reached through real folders only, else None
    (missing, or a symlink anywhere on the way: not a file this stager staged)."""
    cur = root_of(dest)
    parts = _parts(rel)
    for i, name in enumerate(parts):
        cur = cur / name
        try:
            st = os.lstat(cur)
        except OSError:
            return None
        expected = stat.S_ISREG if i == len(parts) - 1 else stat.S_ISDIR
        if not expected(st.st_mode):
            return None
    return st if parts else None


def local_stat(dest: Path, rel: str, fetches: bool) -> os.stat_result | None:
    """The file ``rel`` as staged: for a fetching source a regular file reached through real folders only
    (a symlink is never what it staged); for pvc:// the file a symlink inside ``dest`` may lead to."""
    if fetches:
        return plain_stat(dest, rel)
    try:
        return os.stat(resolved(dest, rel))
    except (OSError, WeightsError):
        return None


def resolved(dest: Path, rel: str) -> Path:
    """``dest/rel`` with every symlink followed, refused (UnsafePath) when that leads outside ``dest``."""
    root = str(root_of(dest))
    real = os.path.realpath(os.path.join(root, rel))
    if not _inside(real, root):
        raise WeightsError("UnsafePath", f"{rel} resolves outside the destination (a symlink to {real})")
    return Path(real)


def remove_file(dest: Path, rel: str) -> bool:
    """Remove the staged file ``dest/rel`` (or a symlink there, not its target) if reached through real
    folders only; True when something was removed."""
    cur = root_of(dest)
    parts = _parts(rel)
    if not parts:
        return False
    for name in parts[:-1]:
        cur = cur / name
        try:
            if not stat.S_ISDIR(os.lstat(cur).st_mode):
                return False
        except OSError:
            return False
    try:
        if stat.S_ISDIR(os.lstat(cur / parts[-1]).st_mode):
            return False
        os.unlink(cur / parts[-1])
    except OSError:
        return False
    return True


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that never follows a symlink at ``path``: one there (planted; the stager makes none) is
    removed and the file opened anew."""
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    log.warning("%s is a symlink; replacing it", path)
    os.unlink(path)
    return os.open(path, flags | os.O_CREAT | os.O_EXCL, mode)


def read_own(path: Path) -> str:
    """A file of the stager's state folder, never through a symlink (OSError then, like a missing file)."""
    if os.path.islink(path.parent):
        raise OSError(errno.ELOOP, "the state folder is a symlink", str(path.parent))
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, encoding="utf-8") as f:
        return f.read()
