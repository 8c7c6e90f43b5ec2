"""The local disk cache tier: recently loaded safetensors objects, kept on the instance's disk.

A standby instance that served a model before loads it again from local disk instead
of S3. Layout and rules:

- One directory, a byte budget (``max_bytes``), least recently used entries evicted
  first. No index file to keep consistent: an entry is a plain file whose name is
  derived from ``(bucket, key, ETag)``, its size is the object's size, and its mtime
  is its last access (set explicitly on every hit; atime is unreliable under
  ``relatime``). A changed object has a new ETag, hence a new name: it is never
  served stale, and committing the new version removes the old one.
- Writes are atomic: bytes go to a temp file (``.tmp-<pid>-...``), which is fsynced
  and then renamed into place, so a crash (process or machine) never leaves a half
  file under an entry name. Temp files of dead processes are removed on open.
- The budget counts everything in the directory, temp files included (a writer
  sizes its temp file up front), so several writers, even in several processes,
  never overshoot it together. A file larger than the whole budget is not cached.
- Thread-safe (one lock) and process-safe (``flock`` on ``.lock`` around the
  check-evict-reserve and rename steps).
- A full file system is not an error: an entry that does not fit in the free space
  (less what temp files of running writers have yet to fill) is not started, and a
  write that fails (``ENOSPC``) drops its entry; the load goes on from the store.
- Which models a cache holds: after a load, ``record_model`` writes a small record
  (``.models/<hash(uri)>.json``: the model's URI and its files' entry names and
  sizes). ``models()`` reads the records back and checks each file against the
  directory, so a record never claims an entry that was evicted since.

A hit is trusted when its size matches the object's; the loader also checks the
safetensors header and, when asked, the sha256, and evicts an entry that fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from thaw.log import get_logger

log = get_logger()

_TMP_PREFIX = ".tmp-"
_LOCK_NAME = ".lock"
_MODELS_DIR = ".models"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


class CacheError(RuntimeError):
    """A cache write could not be completed (the load itself is unaffected)."""


@dataclass(frozen=True)
class CacheEntry:
    """One committed file in the cache."""

    path: Path
    size: int
    last_access_ns: int


@dataclass(frozen=True)
class CachedModel:
    """What a cache holds of one model: ``bytes`` of its ``total_bytes`` are there."""

    uri: str
    bytes: int
    total_bytes: int
    files: int
    files_present: int

    @property
    def complete(self) -> bool:
        return self.files_present == self.files


def entry_name(bucket: str, key: str, etag: str) -> str:
    """File name of the entry for one version of an object.

    ``<hash(bucket, key)>-<hash(etag)>-<basename>``: the first part groups the versions
    of an object (so committing a new one removes the others), the basename is for
    people reading ``ls``.
    """
    obj = hashlib.sha256(f"{bucket}\0{key}".encode()).hexdigest()[:20]
    ver = hashlib.sha256(etag.strip('"').encode()).hexdigest()[:12]
    base = _SAFE.sub("_", key.rsplit("/", 1)[-1])[-80:] or "object"
    return f"{obj}-{ver}-{base}"


class DiskCache:
    """A directory of cached objects with a byte budget and LRU eviction."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._lock_path = self.root / _LOCK_NAME
        self._committer: ThreadPoolExecutor | None = None
        # Entries whose commit (fsync + rename) is running in the background.
        self._pending: dict[str, Future[None]] = {}
        with self._locked():
            self._remove_stale_temps()

    # --- reading --------------------------------------------------------------------

    def lookup(self, bucket: str, key: str, etag: str, size: int) -> Path | None:
        """The cached file for this version of the object, or None.

        A hit becomes the most recently used entry. A file of the wrong size
        (truncated, or a stray write) is removed and reported as a miss.
        """
        name = entry_name(bucket, key, etag)
        self._wait_pending(name)
        path = self.root / name
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        if st.st_size != size:
            log.warning("cache_entry_bad_size", path=str(path), size=st.st_size, expected=size)
            self._remove(path)
            return None
        try:
            os.utime(path, ns=(st.st_atime_ns, time.time_ns()))
        except FileNotFoundError:  # evicted by another process just now
            return None
        return path

    def evict(self, bucket: str, key: str, etag: str) -> bool:
        """Remove this version's entry (e.g. its bytes failed a check); True if one was there."""
        name = entry_name(bucket, key, etag)
        self._wait_pending(name)
        with self._locked():
            return self._remove(self.root / name)

    def entries(self) -> list[CacheEntry]:
        """Committed entries, least recently used first."""
        out = []
        for p in self.root.iterdir():
            if p.name.startswith("."):
                continue
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            out.append(CacheEntry(p, st.st_size, st.st_mtime_ns))
        return sorted(out, key=lambda e: (e.last_access_ns, e.path.name))

    def used_bytes(self) -> int:
        """Bytes in the directory: entries plus temp files being written, as they stand
        between this cache's writes and evictions (taken under their lock: read apart,
        an entry evicted and the temp file that took its room could both be counted)."""
        with self._locked():
            return self._used_bytes()

    def _used_bytes(self) -> int:
        return sum(e.size for e in self.entries()) + sum(size for _, size in self._temps())

    # --- which models ---------------------------------------------------------------

    def record_model(self, uri: str, files: list[tuple[str, str, str, int]]) -> None:
        """Note that the model at ``uri`` is made of these ``(bucket, key, etag, size)``
        objects (after a load that cached them; see :meth:`models`)."""
        body = {"uri": uri, "files": [{"name": entry_name(b, k, e), "size": n} for b, k, e, n in files]}
        d = self.root / _MODELS_DIR
        d.mkdir(exist_ok=True)
        path = d / f"{_model_id(uri)}.json"
        tmp = d / f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        tmp.write_text(json.dumps(body))
        os.replace(tmp, path)

    def models(self) -> list[CachedModel]:
        """The models recorded here, with how much of each is still cached (records of
        which nothing is left are removed)."""
        d = self.root / _MODELS_DIR
        try:
            paths = sorted(p for p in d.iterdir() if p.suffix == ".json" and not p.name.startswith("."))
        except FileNotFoundError:
            return []
        sizes = {e.path.name: e.size for e in self.entries()}
        out = []
        for p in paths:
            try:
                rec = json.loads(p.read_text())
                uri, files = str(rec["uri"]), [(str(f["name"]), int(f["size"])) for f in rec["files"]]
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("cache_model_record_unreadable", path=str(p))
                self._remove(p)
                continue
            present = [(n, size) for n, size in files if sizes.get(n) == size]
            if not present:
                self._remove(p)
                continue
            out.append(CachedModel(uri, sum(s for _, s in present), sum(s for _, s in files), len(files),
                                   len(present)))
        return out

    def clear(self) -> None:
        """Remove every entry and record (e.g. a host cache given back when its worker stops)."""
        self.flush()
        with self._locked():
            for e in self.entries():
                self._remove(e.path)
            d = self.root / _MODELS_DIR
            if d.is_dir():
                for p in d.iterdir():
                    self._remove(p)

    # --- writing --------------------------------------------------------------------

    def begin(self, bucket: str, key: str, etag: str, size: int) -> CacheWriter | None:
        """Start writing an entry; None when it cannot be cached (the load goes on without).

        Evicts least recently used entries until ``size`` fits in the budget, then
        creates the temp file at its full size, which reserves the space.
        """
        name = entry_name(bucket, key, etag)
        if size > self.max_bytes:
            log.info(
                "cache_skip_too_big", object=f"s3://{bucket}/{key}", size=size, budget=self.max_bytes
            )
            return None
        with self._locked():
            if not self._make_room(size):
                log.info(
                    "cache_skip_no_room", object=f"s3://{bucket}/{key}", size=size,
                    budget=self.max_bytes, used=self._used_bytes(),
                )
                return None
            free = self._free_bytes()
            if size > free:
                log.warning("cache_skip_disk_full", object=f"s3://{bucket}/{key}", size=size,
                            free=free, dir=str(self.root))
                return None
            tmp = self.root / f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-{name}"
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                os.ftruncate(fd, size)
            except BaseException:
                os.close(fd)
                tmp.unlink(missing_ok=True)
                raise
        return CacheWriter(self, name, tmp, fd, size, f"s3://{bucket}/{key}")

    def flush(self) -> None:
        """Wait for every background commit started so far."""
        with self._lock:
            pending = list(self._pending.values())
        for fut in pending:
            with contextlib.suppress(Exception):  # a failed commit was logged; the entry is simply absent
                fut.result()

    def close(self) -> None:
        """Finish background commits and stop the committer thread."""
        self.flush()
        with self._lock:
            committer, self._committer = self._committer, None
        if committer is not None:
            committer.shutdown(wait=True)

    # --- internals ------------------------------------------------------------------

    def _commit(self, writer: CacheWriter) -> None:
        if writer._aborted:
            raise CacheError(f"{writer.uri}: aborted")
        if writer.written != writer.size:
            raise CacheError(f"{writer.uri}: wrote {writer.written} of {writer.size} bytes; not cached")
        os.fsync(writer.fd)  # the bytes are on disk before the name says they are whole
        os.close(writer.fd)
        writer.fd = -1
        final = self.root / writer.name
        with self._locked():
            if not writer.tmp.exists():
                raise CacheError(f"{writer.tmp} disappeared before commit")
            os.replace(writer.tmp, final)
            os.utime(final, ns=(time.time_ns(), time.time_ns()))
            group = writer.name.split("-", 1)[0] + "-"
            for other in self.root.iterdir():
                # Older versions of the same object can never be served again.
                if other.name.startswith(group) and other.name != writer.name:
                    self._remove(other)
        log.info("cache_stored", object=writer.uri, path=str(final), size=writer.size)

    def _background(self, fn: Callable[[], None]) -> Future[None]:
        """Run ``fn`` on the cache's one background thread, after everything queued before it."""
        with self._lock:
            if self._committer is None:
                self._committer = ThreadPoolExecutor(1, thread_name_prefix="thaw-cache-writer")
            return self._committer.submit(fn)

    def _submit_commit(self, writer: CacheWriter) -> Future[None]:
        def commit() -> None:
            try:
                self._commit(writer)
            except BaseException as exc:
                log.warning("cache_commit_failed", object=writer.uri, error=str(exc))
                writer._discard()
                raise

        fut = self._background(commit)
        with self._lock:
            self._pending[writer.name] = fut
        fut.add_done_callback(lambda _f: self._forget_pending(writer.name, fut))
        return fut

    def _forget_pending(self, name: str, fut: Future[None]) -> None:
        with self._lock:
            if self._pending.get(name) is fut:
                del self._pending[name]

    def _wait_pending(self, name: str) -> None:
        with self._lock:
            fut = self._pending.get(name)
        if fut is not None:
            with contextlib.suppress(Exception):
                fut.result()

    def _make_room(self, size: int) -> bool:
        """Evict LRU entries until ``size`` more bytes fit; False if they cannot."""
        entries = self.entries()
        committed = sum(e.size for e in entries)
        used = committed + sum(s for _, s in self._temps())
        if used - committed + size > self.max_bytes:
            return False  # in-flight writes hold the space: evicting would not make room
        for e in entries:
            if used + size <= self.max_bytes:
                break
            # An open reader of this file keeps reading it (POSIX unlink semantics).
            if self._remove(e.path):
                log.info("cache_evicted", path=str(e.path), size=e.size)
            used -= e.size
        return used + size <= self.max_bytes

    def _free_bytes(self) -> int:
        """Free space on the file system, less what running writers' temp files (sized
        up front, sparse) will still take."""
        st = os.statvfs(self.root)
        unwritten = 0
        for p in self.root.iterdir():
            if p.name.startswith(_TMP_PREFIX):
                try:
                    t = p.stat()
                except FileNotFoundError:
                    continue
                unwritten += max(t.st_size - t.st_blocks * 512, 0)
        return st.f_bavail * st.f_frsize - unwritten

    def _temps(self) -> Iterator[tuple[Path, int]]:
        for p in self.root.iterdir():
            if p.name.startswith(_TMP_PREFIX):
                try:
                    yield p, p.stat().st_size
                except FileNotFoundError:
                    continue

    def _remove_stale_temps(self) -> None:
        for p, _ in list(self._temps()):
            pid_s = p.name[len(_TMP_PREFIX) :].split("-", 1)[0]
            if not pid_s.isdigit() or not _pid_alive(int(pid_s)):
                log.info("cache_removed_stale_temp", path=str(p))
                self._remove(p)

    @staticmethod
    def _remove(path: Path) -> bool:
        try:
            path.unlink()
            return True
        except FileNotFoundError:
            return False

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # The thread lock first: flock does not exclude threads sharing one process.
        with self._lock:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the flock

    def __repr__(self) -> str:
        return f"DiskCache({str(self.root)!r}, max_bytes={self.max_bytes})"


class CacheWriter:
    """A temp file being filled (from several threads) with one object's bytes.

    ``write`` (in the caller's thread) and ``write_later`` (queued to the cache's
    background thread) may be mixed, for disjoint ranges. ``commit`` queues, after
    every queued write, a check that exactly ``size`` bytes were written, then the
    fsync and the rename into place; ``abort`` discards the file.
    """

    def __init__(self, cache: DiskCache, name: str, tmp: Path, fd: int, size: int, uri: str) -> None:
        self.cache = cache
        self.name = name
        self.tmp = tmp
        self.fd = fd
        self.size = size
        self.uri = uri
        self._written = 0
        self._lock = threading.Lock()
        self._done = False
        self._aborted = False

    @property
    def written(self) -> int:
        return self._written

    def write(self, offset: int, data: memoryview | bytes) -> None:
        """Write ``data`` at ``offset`` now (disjoint ranges only; each byte written once)."""
        mv = memoryview(data).cast("B")
        if offset < 0 or offset + len(mv) > self.size:
            raise CacheError(f"{self.tmp}: write of {len(mv)} bytes at {offset} is outside {self.size}")
        if self._aborted:
            return
        done = 0
        while done < len(mv):
            done += os.pwritev(self.fd, [mv[done:]], offset + done)
        with self._lock:
            self._written += len(mv)

    def write_later(self, offset: int, data: memoryview) -> None:
        """Queue ``data`` to be written at ``offset`` by the cache's background thread.

        ``data`` must stay valid and unchanged until then (a view of the load's final
        host buffer, which the queued task keeps alive): the caller does not wait for
        the disk, which on a busy instance is slower than the network.
        """
        def task() -> None:
            try:
                self.write(offset, data)
            except (OSError, CacheError) as exc:  # disk full...: give up on this entry, not the load
                if not self._aborted:
                    log.warning("cache_write_failed", object=self.uri, error=str(exc))
                self._aborted = True

        self.cache._background(task)

    def commit(self) -> Future[None]:
        """Make the entry visible once every byte is written (in the background).

        An incomplete file is never committed: if the bytes written do not add up to
        the object's size the file is discarded and the future holds a CacheError.
        """
        with self._lock:
            if self._done:
                raise CacheError(f"{self.tmp}: already committed or aborted")
            self._done = True
        return self.cache._submit_commit(self)

    def mark_failed(self) -> None:
        """Stop writing this entry: later writes are skipped and it will not be committed."""
        self._aborted = True

    def abort(self) -> None:
        """Discard the temp file; queued writes are skipped. Safe to call more than once."""
        with self._lock:
            self._done = True
            self._aborted = True
        # Behind the queued writes, so no write can hit a closed (or reused) descriptor.
        self.cache._background(self._discard).result()

    def _discard(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.tmp.unlink(missing_ok=True)


def _model_id(uri: str) -> str:
    return hashlib.sha256(uri.encode()).hexdigest()[:20]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
