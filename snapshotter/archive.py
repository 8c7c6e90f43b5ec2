"""Pack an engine's cache directory into a tar.gz, and unpack one without trusting it.

The archive holds paths relative to ``VLLM_CACHE_ROOT`` (``torch_compile_cache/...``,
``modelinfos/...``): regular files only. Unpacking refuses anything else — absolute
paths, ``..``, links, devices, FIFOs — and any archive that unpacks to more bytes
than its manifest declared, before writing a byte outside the destination.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tarfile
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ARCHIVE_NAME = "snapshot.tar.gz"
# Top-level entries of VLLM_CACHE_ROOT that are not warm state: the model's config
# and tokenizer mirror (pulled from the store at every launch anyway).
EXCLUDED_TOP_LEVEL = frozenset({"assets", "model_streamer"})
# Top-level entries that hold compiled code: vLLM's compile cache, and inductor's own
# (the worker points TORCHINDUCTOR_CACHE_DIR there). A cache root without either has
# nothing worth a snapshot.
WARM_STATE_DIRS = frozenset({"torch_compile_cache", "torchinductor"})
# Compiled kernel binaries (inductor C++ on CPU; Triton / CUDA on GPU). A start that
# writes none of these compiled nothing.
KERNEL_SUFFIXES = (".so", ".cubin", ".hsaco", ".ptx", ".fatbin")
COMPRESS_LEVEL = 6
_READ_CHUNK = 1024 * 1024


class ArchiveError(Exception):
    """An archive that cannot be made or used."""


class UnsafeArchive(ArchiveError):
    """A member that would write outside the destination or is not a plain file."""


class CorruptArchive(ArchiveError):
    """Not a readable tar.gz, or not what its manifest says."""


@dataclass(frozen=True)
class ArchiveInfo:
    path: Path
    size: int
    sha256: str
    file_count: int
    unpacked_bytes: int
    # Top-level directories of the cache root in the archive.
    cache_dirs: list[str]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_READ_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def cache_files(cache_root: Path) -> list[Path]:
    """The files of ``cache_root`` that make up its warm state, sorted.

    Lock files are skipped (they are created on demand and may be held), and so are
    links: a snapshot carries plain files only.
    """
    files: list[Path] = []
    if not cache_root.is_dir():
        return files
    for top in sorted(cache_root.iterdir()):
        if top.name in EXCLUDED_TOP_LEVEL or top.name.startswith(".") or top.is_symlink():
            continue
        if top.is_file():
            files.append(top)
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(filenames):
                p = Path(dirpath) / name
                if name.endswith(".lock") or p.is_symlink() or not p.is_file():
                    continue
                files.append(p)
    return files


def kernel_files(cache_root: Path) -> set[str]:
    """Relative paths of the compiled kernel binaries under ``cache_root``."""
    return {p.relative_to(cache_root).as_posix() for p in cache_files(cache_root)
            if p.name.endswith(KERNEL_SUFFIXES)}


def has_warm_state(cache_root: Path) -> bool:
    """Whether ``cache_root`` holds compile caches (e.g. a worker's second start)."""
    return any(p.relative_to(cache_root).parts[0] in WARM_STATE_DIRS for p in cache_files(cache_root))


def create_archive(cache_root: Path, dest: Path) -> ArchiveInfo:
    """Pack the warm state of ``cache_root`` into ``dest`` (tar.gz).

    Raises :class:`ArchiveError` when it holds no compile cache.
    """
    files = cache_files(cache_root)
    if not any(p.relative_to(cache_root).parts[0] in WARM_STATE_DIRS for p in files):
        raise ArchiveError(f"{cache_root} holds no compile cache (none of {sorted(WARM_STATE_DIRS)})")
    unpacked = 0
    with tarfile.open(dest, "w:gz", compresslevel=COMPRESS_LEVEL, format=tarfile.PAX_FORMAT) as tf:
        for p in files:
            rel = p.relative_to(cache_root).as_posix()
            info = tf.gettarinfo(str(p), arcname=rel)
            # Owners of the capturing machine mean nothing where it is restored.
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode &= 0o755
            with open(p, "rb") as f:
                tf.addfile(info, f)
            unpacked += info.size
    return ArchiveInfo(
        path=dest, size=dest.stat().st_size, sha256=sha256_file(dest), file_count=len(files),
        unpacked_bytes=unpacked,
        cache_dirs=sorted({p.relative_to(cache_root).parts[0] for p in files}),
    )


def check_member(member: tarfile.TarInfo) -> None:
    """Raise :class:`UnsafeArchive` unless ``member`` is a plain file or directory
    with a relative path that stays inside the destination."""
    name = member.name
    parts = PurePosixPath(name).parts
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchive(f"member {name!r} has an absolute path")
    if ".." in parts or "\\" in name:
        raise UnsafeArchive(f"member {name!r} leaves the destination")
    if not (member.isfile() or member.isdir()):
        kind = "link" if (member.issym() or member.islnk()) else "device, FIFO or other special file"
        raise UnsafeArchive(f"member {name!r} is a {kind}; snapshots hold plain files only")


def extract_archive(
    archive: Path, dest: Path, *, max_bytes: int, cancelled: threading.Event | None = None
) -> int:
    """Unpack ``archive`` into the new directory ``dest``; returns the files written.

    Every member is checked before it is written (:func:`check_member`), and the
    total may not exceed ``max_bytes`` (what the manifest declared). Raises
    :class:`UnsafeArchive` or :class:`CorruptArchive`; stops early (returning the count
    so far) once ``cancelled`` is set. ``dest`` may then hold part of the archive.
    """
    dest.mkdir(parents=True, exist_ok=False)
    count = total = 0
    try:
        with gzip.open(archive, "rb") as gz, tarfile.open(fileobj=gz, mode="r:") as tf:
            # One pass: each member is checked as it is read, before it is written.
            for member in tf:
                if cancelled is not None and cancelled.is_set():
                    return count
                check_member(member)
                total += member.size
                if total > max_bytes:
                    raise CorruptArchive(f"archive unpacks to more than the {max_bytes} bytes declared")
                # The "data" filter is a second line of defence (same rules, from tarfile).
                tf.extract(member, dest, filter="data")
                count += member.isfile()
            # tar checksums only its headers; gzip's CRC covers the data, and it is
            # checked when the stream is read to its end.
            while gz.read(_READ_CHUNK):
                pass
    except tarfile.FilterError as exc:
        raise UnsafeArchive(f"member refused by tarfile's data filter: {exc}") from None
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise CorruptArchive(f"not a readable tar.gz: {type(exc).__name__}: {exc}") from None
    return count
