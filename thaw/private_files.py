"""Files that hold secrets (the cluster token, store credentials, key tables), written
so that nobody but their owner can read or swap them, whatever the umask.

A file is created with its final mode by ``os.open`` (a umask can only take bits
away, so 0600 stays 0600 even under ``umask 0``), never chmod-ed after its bytes are
written, and replaced by a rename: a reader sees the old file or the new one. Its
directory is created 0700; one that exists and is world-writable (anyone could rename
the file away and put their own in its place) loses that bit, or is refused if it is
not ours.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


class UnsafeDirectory(PermissionError):
    """A directory for secrets that anyone may write to and that is not ours to fix."""


def ensure_private_dir(path: Path) -> Path:
    """``path`` created (with any missing parents) mode 0700, or made not world-writable."""
    path = Path(path)
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            pass  # another process made it first
    st = os.stat(path)
    if st.st_mode & stat.S_IWOTH:
        if st.st_uid == os.getuid():
            os.chmod(path, stat.S_IMODE(st.st_mode) & ~stat.S_IWOTH)
        elif not st.st_mode & stat.S_ISVTX:
            raise UnsafeDirectory(f"{path} is writable by anyone and not owned by this user: "
                                  "keep secrets in a directory only you can write to")
    return path


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, mode 0600: written to a new file created 0600 in
    the same directory, flushed to disk, then renamed over ``path``."""
    path = Path(path)
    ensure_private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def open_private(path: Path, flags: int) -> int:
    """``os.open`` of a file that holds secrets: created 0600; one that exists with a
    looser mode (an older Thaw's) is narrowed to 0600 through the descriptor itself."""
    ensure_private_dir(Path(path).parent)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & ~FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd
