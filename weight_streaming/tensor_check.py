"""Per-tensor digests: the proof that the tensors a swap hands an engine are the
model's, as pushed.

`thaw push` records in the manifest, for every tensor of every safetensors file, its
dtype, shape and CRC-32 (:func:`file_digests`). A swap checks each tensor it hands the
engine against them (:func:`check_tensors`): a name the manifest does not list, another
shape or dtype, or other bytes refuse the swap, naming the tensor.

What each check guarantees. A file's sha256 (the manifest's, checked when the bytes
come from the store or a disk copy) is the proof against a wrong or tampered object.
The worker's copy in its own memory (``/dev/shm``) was written by the worker itself
after that check; what can go wrong with it later is accidental: a flipped bit, a
file overwritten or cut short, a bug. CRC-32 catches every error confined to 32
consecutive bits (one flipped byte always) and all but one in 2^32 of any other. It is
summed with ISA-L's CRC-32 (``isal``: the same polynomial and values as zlib's, about
13 GB/s a core on this machine against zlib's 3.6 and sha256's 1.5), on every core at
once (it releases the GIL); where ``isal`` is not installed (a GPU machine given only
the project's files), zlib's. It is not a defence against someone who can write the
worker's memory: they could change the engine directly.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from weight_streaming.safetensors_header import SafetensorsHeader

try:
    from isal.isal_zlib import crc32

    CRC32_IMPL = "isal"
except ImportError:  # pragma: no cover - every set-up installs isal
    from zlib import crc32  # type: ignore[assignment]

    CRC32_IMPL = "zlib"

if TYPE_CHECKING:
    import torch


class Digest(Protocol):
    """A tensor as the manifest records it (``weight_streaming.manifest.TensorDigest``)."""

    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def crc32(self) -> int: ...


class TensorMismatch(ValueError):
    """A tensor is not the one the manifest records; ``name`` says which."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


class TensorCrcs:
    """The CRC-32 of every tensor of one safetensors file, fed the file's bytes in
    order in chunks of any size (``thaw push`` feeds it as it hashes the file)."""

    def __init__(self, header: SafetensorsHeader) -> None:
        self.header = header
        base = header.data_offset
        # (absolute begin, end, name) in file order; the tensors tile the data region.
        self._spans = sorted((base + t.begin, base + t.end, name) for name, t in header.tensors.items())
        self._crcs = dict.fromkeys(header.tensors, 0)
        self._next = 0

    def update(self, offset: int, chunk: bytes | memoryview) -> None:
        """Feed the file's bytes at ``offset`` (chunks in order, none skipped)."""
        end = offset + len(chunk)
        view = memoryview(chunk)
        while self._next < len(self._spans):
            b, e, name = self._spans[self._next]
            if b >= end:
                return
            lo, hi = max(b, offset), min(e, end)
            if hi > lo:
                self._crcs[name] = crc32(view[lo - offset: hi - offset], self._crcs[name])
            if e > end:
                return
            self._next += 1

    def digests(self) -> dict[str, dict[str, Any]]:
        """Every tensor's dtype, shape and CRC-32, as the manifest records them."""
        return {name: {"dtype": t.dtype, "shape": list(t.shape), "crc32": self._crcs[name]}
                for name, t in self.header.tensors.items()}


def file_digests(path: str, header: SafetensorsHeader) -> dict[str, dict[str, Any]]:
    """Every tensor of the local safetensors file at ``path`` (its parsed ``header``):
    dtype, shape and CRC-32 of its bytes, as the manifest records them."""
    crcs = TensorCrcs(header)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)
        try:
            crcs.update(0, view)
        finally:
            view.release()
    return crcs.digests()


def check_tensors(tensors: Mapping[str, torch.Tensor], expected: Mapping[str, Digest], where: str,
                  threads: int | None = None) -> None:
    """Raise :class:`TensorMismatch` unless ``tensors`` are exactly those in ``expected``,
    each with its dtype, shape and CRC-32 (``where`` names the file in the message).
    ``threads``: how many tensors are summed at once (default: every core)."""
    from weight_streaming.streamer import safetensors_dtype

    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise TensorMismatch(missing[0], f"{where}: the manifest lists tensors the file does not hold: "
                                         + ", ".join(missing[:10]))

    for name, t in tensors.items():
        d = expected.get(name)
        if d is None:
            raise TensorMismatch(name, f"{where}: tensor {name!r} is not in the model's manifest")
        got = (safetensors_dtype(t.dtype), tuple(t.shape))
        if got != (d.dtype, d.shape):
            raise TensorMismatch(name, f"{where}: tensor {name!r} is {got[0]} {list(got[1])}, the manifest "
                                       f"says {d.dtype} {list(d.shape)}")
    names = list(tensors)
    workers = max(1, min(threads or os.cpu_count() or 1, len(names)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="thaw-crc") as pool:
        sums = list(pool.map(lambda n: crc32_of(tensors[n]), names))
    for name, got_crc in zip(names, sums, strict=True):
        want = expected[name].crc32
        if got_crc != want:
            raise TensorMismatch(name, f"{where}: tensor {name!r} does not match the manifest (CRC-32 "
                                       f"{got_crc:08x}, expected {want:08x}): this copy of the weights is corrupt")


def crc32_of(t: torch.Tensor) -> int:
    """CRC-32 of a tensor's bytes, as laid out in its safetensors file."""
    import torch

    flat = t.detach().reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    return crc32(flat.view(torch.uint8).numpy().data)
