"""Where safetensors bytes come from: a small protocol and a local-file implementation.

The streamer only needs "how big is it" and "fill this buffer from that offset", so a
local file, an S3 object (ranged GETs, see :mod:`weight_streaming.s3_source`) or an
in-memory blob in a test all plug in the same way. ``read_into`` writes straight
into the caller's buffer (a view of the preallocated, possibly pinned, host buffer),
so no source makes an intermediate copy.
"""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable


class StreamError(RuntimeError):
    """Reading a tensor source failed (short read, out-of-range request, I/O error)."""


@runtime_checkable
class RangeSource(Protocol):
    """Random access to the bytes of one safetensors file.

    Implementations must be safe to call from several threads at once: the streamer
    issues reads for different chunks in parallel.
    """

    def size(self) -> int:
        """Total size of the object in bytes."""
        ...

    def read_into(self, offset: int, view: memoryview) -> None:
        """Fill ``view`` exactly with the bytes at ``[offset, offset + len(view))``.

        Raises :class:`StreamError` if the range is outside the object or the source
        returns fewer bytes than asked; never leaves a silently short buffer.
        """
        ...


# Optional, so not in the Protocol:
# - ``abort() -> None``: the streamer calls it when a load fails, before waiting for its
#   reader threads, so a source that blocks a reader (e.g. one hashing chunks in file
#   order) can release it.
# - ``aligned_chunks: bool``: True asks the streamer to cut chunks at multiples of
#   ``chunk_bytes`` in file offsets (object stores serve part-aligned ranges faster).


def check_range(offset: int, length: int, size: int, where: str) -> None:
    """Refuse a read outside ``[0, size)`` before any bytes move."""
    if offset < 0 or length < 0 or offset + length > size:
        raise StreamError(
            f"{where}: read of {length} bytes at offset {offset} is outside the {size}-byte object"
        )


class FileRangeSource:
    """A local file read with ``pread``/``preadv`` (thread-safe: no shared file position)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        # Size is fixed at open: a file that shrinks afterwards shows up as a short
        # read, one that grows is read only up to the size the header was checked against.
        self._size = os.fstat(self._fd).st_size

    def size(self) -> int:
        return self._size

    def read_into(self, offset: int, view: memoryview) -> None:
        mv = memoryview(view).cast("B")
        n = len(mv)
        check_range(offset, n, self._size, self.path)
        done = 0
        while done < n:
            # Linux returns at most ~2 GiB per call, and a file can shrink under us:
            # loop on short reads, stop on EOF.
            try:
                got = _pread_into(self._fd, mv[done:], offset + done)
            except OSError as exc:
                raise StreamError(
                    f"{self.path}: read at offset {offset + done} failed: {exc}"
                ) from exc
            if got == 0:
                raise StreamError(
                    f"{self.path}: short read: got {done} of {n} bytes at offset {offset} "
                    "(file truncated while reading?)"
                )
            done += got

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> FileRangeSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FileRangeSource({self.path!r})"


if hasattr(os, "preadv"):

    def _pread_into(fd: int, mv: memoryview, offset: int) -> int:
        # preadv writes directly into the caller's buffer; os.pread would allocate
        # a bytes object and cost a second copy.
        return os.preadv(fd, [mv], offset)

else:  # pragma: no cover - platforms without preadv

    def _pread_into(fd: int, mv: memoryview, offset: int) -> int:
        data = os.pread(fd, len(mv), offset)
        mv[: len(data)] = data
        return len(data)
