"""Stream safetensors files into host or device memory as fast as the hardware allows.

How a load works:

1. Read and validate every header first (:mod:`weight_streaming.safetensors_header`),
   and map every dtype to torch, so a bad file is refused before any data moves.
2. Plan which byte ranges to read. Without tensor parallelism that is the whole data
   region of each file; with it, a rank reads only the rows it owns of tensors split
   along dim 0. Ranges are cut into chunks of ``chunk_bytes``.
3. A thread pool reads chunks in parallel with ``RangeSource.read_into`` (``preadv``
   for local files, which releases the GIL) straight into preallocated memory:
   - CPU target: one host buffer per file holds the planned bytes; tensors are
     zero-copy views of it.
   - CUDA target: one device buffer per file; reads land in one pinned staging
     buffer (two chunk-sized slots per reader thread) and each chunk is copied to
     the device asynchronously on a side stream as soon as it is read, so copies
     overlap reads. Staging is bounded (2 x concurrency x chunk_bytes) rather than
     the size of the data region: pinning a 16 GB region costs seconds and as much
     host RAM, and buys no extra overlap. Tensors are views of the device buffer.
4. Any failure cancels the remaining chunks and raises; a load never returns a
   partial set of tensors.

One piece: the plan, the reader threads and the copy to the target share one
buffer-ownership discipline, which is easier to check in one place.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from thaw.units import MiB
from weight_streaming.host_pool import HostBufferPool
from weight_streaming.safetensors_header import (
    MalformedSafetensors,
    SafetensorsHeader,
    TensorInfo,
    header_length,
    parse_header,
    read_header_from_file,
)
from weight_streaming.sources import FileRangeSource, RangeSource, StreamError

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_CONCURRENCY",
    "HostBufferPool",
    "LoadResult",
    "LoadStats",
    "MalformedSafetensors",
    "ProgressFn",
    "RangeSource",
    "ShardDimFn",
    "StreamError",
    "load",
    "load_dir",
    "load_many",
    "read_header",
    "torch_dtype",
]

DEFAULT_CHUNK_BYTES = 32 * MiB
DEFAULT_CONCURRENCY = 8
# One read covers the length prefix and, for almost every file, the whole header:
# a second round trip matters for S3 sources.
_HEADER_PROBE_BYTES = 256 * 1024
# Buffer positions keep file offsets' alignment modulo this, so a tensor that is
# aligned in the file (safetensors writers align them) stays viewable in place.
_ALIGN = 16

ProgressFn = Callable[[int, int], None]
"""``progress(bytes_done, bytes_total)``, called from the calling thread after each chunk."""

ShardDimFn = Callable[[str], int | None]
"""Maps a tensor name to the dim it is split along for tensor parallelism, or None."""

Source = str | os.PathLike[str] | RangeSource

# Safetensors dtype -> torch dtype. getattr: fp8 and unsigned 16/32/64-bit types exist
# only in newer torch; a missing one is refused by name at plan time.
_TORCH_DTYPES: dict[str, torch.dtype | None] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": getattr(torch, "uint16", None),
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I32": torch.int32,
    "U32": getattr(torch, "uint32", None),
    "F32": torch.float32,
    "I64": torch.int64,
    "U64": getattr(torch, "uint64", None),
    "F64": torch.float64,
    "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
    "F8_E5M2": getattr(torch, "float8_e5m2", None),
    # Written by newer safetensors; used once the header parser accepts them.
    "F8_E4M3FNUZ": getattr(torch, "float8_e4m3fnuz", None),
    "F8_E5M2FNUZ": getattr(torch, "float8_e5m2fnuz", None),
    "F8_E8M0": getattr(torch, "float8_e8m0fnu", None),
    "C64": torch.complex64,
}


@dataclass(frozen=True)
class LoadStats:
    """What a load moved and how fast. ``bytes`` counts bytes read from the sources."""

    bytes: int
    seconds: float
    files: int
    chunks: int

    @property
    def gbps(self) -> float:
        """Decimal GB/s over the whole load (headers, allocation and reads included)."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class LoadResult:
    tensors: dict[str, torch.Tensor]
    stats: LoadStats


def torch_dtype(st_dtype: str) -> torch.dtype:
    """The torch dtype for a safetensors dtype string; StreamError if torch lacks it."""
    dtype = _TORCH_DTYPES.get(st_dtype)
    if dtype is None:
        raise StreamError(f"dtype {st_dtype} cannot be represented in torch {torch.__version__}")
    return dtype


def safetensors_dtype(dtype: torch.dtype) -> str | None:
    """The safetensors dtype string a torch dtype loads from (None: none does)."""
    return _SAFETENSORS_DTYPES.get(dtype)


# The reverse of _TORCH_DTYPES (the FNUZ names last: a dtype read as one reads back as it).
_SAFETENSORS_DTYPES = {d: name for name, d in reversed(_TORCH_DTYPES.items()) if d is not None}


def read_header(source: RangeSource, *, name: str | None = None) -> SafetensorsHeader:
    """Read and validate the header of any :class:`RangeSource`."""
    where = name or repr(source)
    # A FileRangeSource is read through its open descriptor like any other source (not
    # reopened by path): a cache entry evicted after it was opened still reads whole.
    try:
        size = source.size()
        probe = bytearray(min(size, _HEADER_PROBE_BYTES))
        source.read_into(0, memoryview(probe))
        n = header_length(bytes(probe[:8]), source=where)
        if 8 + n > size:
            raise MalformedSafetensors(
                f"{where}: header length {n} runs past the end of the {size}-byte file"
            )
        if 8 + n <= len(probe):
            header_bytes = bytes(probe[8 : 8 + n])
        else:
            buf = bytearray(n)
            source.read_into(8, memoryview(buf))
            header_bytes = bytes(buf)
    except (StreamError, MalformedSafetensors):
        raise
    except Exception as exc:  # a source's own error type (OSError, botocore...) gets context
        raise StreamError(f"{where}: reading the header failed: {exc!r}") from exc
    return parse_header(header_bytes, file_size=size, source=where)


def load(
    source: Source,
    *,
    device: str | torch.device = "cpu",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    concurrency: int = DEFAULT_CONCURRENCY,
    progress: ProgressFn | None = None,
    tp_rank: int = 0,
    tp_size: int = 1,
    shard_dims: ShardDimFn | None = None,
) -> LoadResult:
    """Load every tensor of one safetensors file onto ``device``.

    ``source`` is a path or a :class:`RangeSource`. With ``tp_size > 1``, a tensor
    for which ``shard_dims(name)`` returns a dim comes back as this rank's part,
    equal to ``tensor.chunk(tp_size, dim)[tp_rank]`` (an empty slice for a rank past
    the last chunk); the others come back whole.
    """
    return load_many(
        [source],
        device=device,
        chunk_bytes=chunk_bytes,
        concurrency=concurrency,
        progress=progress,
        tp_rank=tp_rank,
        tp_size=tp_size,
        shard_dims=shard_dims,
    )


def load_dir(
    directory: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    concurrency: int = DEFAULT_CONCURRENCY,
    progress: ProgressFn | None = None,
    tp_rank: int = 0,
    tp_size: int = 1,
    shard_dims: ShardDimFn | None = None,
) -> LoadResult:
    """Load every ``*.safetensors`` file of a model directory (HF-style shards)."""
    paths = sorted(Path(directory).glob("*.safetensors"))
    if not paths:
        raise StreamError(f"{directory}: no *.safetensors files")
    return load_many(
        paths,
        device=device,
        chunk_bytes=chunk_bytes,
        concurrency=concurrency,
        progress=progress,
        tp_rank=tp_rank,
        tp_size=tp_size,
        shard_dims=shard_dims,
    )


def load_many(
    sources: Sequence[Source],
    *,
    device: str | torch.device = "cpu",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    concurrency: int = DEFAULT_CONCURRENCY,
    progress: ProgressFn | None = None,
    tp_rank: int = 0,
    tp_size: int = 1,
    shard_dims: ShardDimFn | None = None,
    host_pool: HostBufferPool | None = None,
) -> LoadResult:
    """Load several safetensors files as one model; chunks of all files share one pool.

    A tensor name present in two files is refused (it would silently shadow).
    ``host_pool`` (CPU target only): take the host buffers from this pool of memory
    faulted in ahead of time, instead of fresh memory (see :mod:`weight_streaming.host_pool`).
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"need 0 <= tp_rank < tp_size, got tp_rank={tp_rank} tp_size={tp_size}")
    target = _resolve_device(device)

    t0 = time.perf_counter()
    opened: list[FileRangeSource] = []
    try:
        plans: list[_FilePlan] = []
        for src in sources:
            if isinstance(src, (str, os.PathLike)):
                fs = FileRangeSource(src)
                opened.append(fs)
                rs: RangeSource = fs
                name = fs.path
            else:
                rs, name = src, repr(src)
            plans.append(
                _plan_file(rs, name, tp_rank, tp_size, shard_dims if tp_size > 1 else None)
            )
        _check_unique_names(plans)
        chunks = _cut_chunks(plans, chunk_bytes)
        buffers = _read_all(plans, chunks, target, concurrency, progress, host_pool)
    finally:
        for fs in opened:
            fs.close()

    tensors: dict[str, torch.Tensor] = {}
    for plan, buf in zip(plans, buffers, strict=True):
        tensors.update(_materialize(plan, buf))
    if target.type == "cuda":
        # Misaligned or column-sharded tensors were copied on the current stream;
        # the caller gets tensors it can use from any stream or thread.
        _cuda.synchronize_current(target)
    seconds = time.perf_counter() - t0
    stats = LoadStats(
        bytes=sum(c.length for c in chunks), seconds=seconds, files=len(plans), chunks=len(chunks)
    )
    return LoadResult(tensors=tensors, stats=stats)


# --- planning -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Placement:
    name: str
    dtype: torch.dtype
    # Bytes of this tensor (or of this rank's rows) in the file's buffer.
    buf_begin: int
    length: int
    shape: tuple[int, ...]
    # (dim, start, stop) to cut after viewing: a split along dim > 0 is not one
    # contiguous byte range in a row-major tensor, so the whole tensor is read and
    # sliced in memory. Simple and exact; costs the other ranks' bytes for those tensors.
    post_slice: tuple[int, int, int] | None


@dataclass(frozen=True)
class _FilePlan:
    name: str
    source: RangeSource
    data_offset: int
    buf_bytes: int
    # (file offset, length, buffer offset) of each contiguous range to read.
    segments: tuple[tuple[int, int, int], ...]
    placements: tuple[_Placement, ...]


@dataclass(frozen=True)
class _Chunk:
    file_index: int
    file_offset: int
    length: int
    buf_offset: int


def _resolve_device(device: str | torch.device) -> torch.device:
    d = torch.device(device)
    if d.type == "cuda":
        if not _cuda.is_available():
            raise StreamError(f"device {d} requested but CUDA is not available")
        return torch.device("cuda", d.index if d.index is not None else _cuda.current_device())
    if d.type == "cpu":
        return d
    raise ValueError(f"unsupported device {d}: use 'cpu' or 'cuda[:N]'")


def _chunk_bounds(dim_size: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of ``torch.chunk(parts)[index]`` along a dim of ``dim_size``."""
    step = math.ceil(dim_size / parts)
    start = min(index * step, dim_size)
    return start, min(start + step, dim_size)


def _plan_file(
    source: RangeSource, name: str, tp_rank: int, tp_size: int, shard_dims: ShardDimFn | None
) -> _FilePlan:
    header = read_header(source, name=name)
    infos = sorted(header.tensors.values(), key=lambda t: (t.begin, t.end))
    placements: list[_Placement] = []
    segments: list[list[int]] = []  # [file_offset, length, buf_offset], mutable while merging
    buf_pos = 0
    for info in infos:
        dtype = _dtype_for(info, name)
        begin, end, shape, post = _rank_range(info, name, tp_rank, tp_size, shard_dims)
        if begin == end:
            placements.append(_Placement(info.name, dtype, 0, 0, shape, post))
            continue
        last = segments[-1] if segments else None
        if last is not None and last[0] + last[1] == header.data_offset + begin:
            last[1] += end - begin  # contiguous in the file: same read, same buffer run
        else:
            buf_pos += (begin - buf_pos) % _ALIGN
            segments.append([header.data_offset + begin, end - begin, buf_pos])
        tensor_buf = segments[-1][2] + (header.data_offset + begin - segments[-1][0])
        placements.append(_Placement(info.name, dtype, tensor_buf, end - begin, shape, post))
        buf_pos = tensor_buf + (end - begin)
    return _FilePlan(
        name=name,
        source=source,
        data_offset=header.data_offset,
        buf_bytes=buf_pos,
        segments=tuple((s[0], s[1], s[2]) for s in segments),
        placements=tuple(placements),
    )


def _dtype_for(info: TensorInfo, file_name: str) -> torch.dtype:
    try:
        return torch_dtype(info.dtype)
    except StreamError as exc:
        raise StreamError(f"{file_name}: tensor {info.name!r}: {exc}") from None


def _rank_range(
    info: TensorInfo, file_name: str, tp_rank: int, tp_size: int, shard_dims: ShardDimFn | None
) -> tuple[int, int, tuple[int, ...], tuple[int, int, int] | None]:
    """Data-region byte range to read for this rank, its shape, and any slice still to cut."""
    dim = shard_dims(info.name) if shard_dims is not None else None
    if dim is None:
        return info.begin, info.end, info.shape, None
    ndim = len(info.shape)
    if not -ndim <= dim < ndim:
        raise StreamError(
            f"{file_name}: tensor {info.name!r} of shape {info.shape} cannot be split along dim {dim}"
        )
    dim %= ndim
    start, stop = _chunk_bounds(info.shape[dim], tp_size, tp_rank)
    if dim == 0:
        row_bytes = info.nbytes // info.shape[0] if info.shape[0] else 0
        shape = (stop - start, *info.shape[1:])
        return info.begin + start * row_bytes, info.begin + stop * row_bytes, shape, None
    return info.begin, info.end, info.shape, (dim, start, stop)


def _check_unique_names(plans: Sequence[_FilePlan]) -> None:
    seen: dict[str, str] = {}
    for plan in plans:
        for p in plan.placements:
            if p.name in seen:
                raise StreamError(f"tensor {p.name!r} is in both {seen[p.name]} and {plan.name}")
            seen[p.name] = plan.name


def _cut_chunks(plans: Sequence[_FilePlan], chunk_bytes: int) -> list[_Chunk]:
    chunks: list[_Chunk] = []
    for i, plan in enumerate(plans):
        # A source that sets ``aligned_chunks`` (S3) gets chunk boundaries at multiples of
        # chunk_bytes in the file: an object store serves ranges that match its stored
        # parts with less work (loopback SeaweedFS, 16 MiB ranges of a 16 MiB-part
        # object: 0.63 vs 0.59 GiB/s, and 0.64 vs 0.52 in a quieter run).
        aligned = bool(getattr(plan.source, "aligned_chunks", False))
        for file_offset, length, buf_offset in plan.segments:
            off = 0
            while off < length:
                n = min(chunk_bytes, length - off)
                if aligned:
                    n = min(n, chunk_bytes - (file_offset + off) % chunk_bytes)
                chunks.append(_Chunk(i, file_offset + off, n, buf_offset + off))
                off += n
    return chunks


# --- reading ------------------------------------------------------------------------


def _read_all(
    plans: Sequence[_FilePlan],
    chunks: Sequence[_Chunk],
    target: torch.device,
    concurrency: int,
    progress: ProgressFn | None,
    host_pool: HostBufferPool | None = None,
) -> list[torch.Tensor]:
    """Fill one buffer per file (on ``target``) with the planned bytes."""
    if target.type == "cuda":
        buffers = [_cuda.empty(p.buf_bytes, target) for p in plans]
        reader: _Reader = _CudaReader(plans, buffers, chunks, target, concurrency)
    else:
        if host_pool is not None:
            buffers = host_pool.take_many([p.buf_bytes for p in plans])
        else:
            buffers = [torch.empty(p.buf_bytes, dtype=torch.uint8) for p in plans]
        reader = _HostReader(plans, buffers)

    def abort_sources() -> None:
        for plan in plans:
            abort = getattr(plan.source, "abort", None)
            if abort is not None:
                abort()

    try:
        _run_pool(
            reader, chunks, min(concurrency, max(1, len(chunks))), progress, on_abort=abort_sources
        )
    finally:
        reader.finish()
    return buffers


class _Reader:
    def init_thread(self) -> None:
        """Runs once in each pool thread before its first chunk."""

    def read(self, chunk: _Chunk) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Runs once after the pool is done, on success or failure."""


class _HostReader(_Reader):
    def __init__(self, plans: Sequence[_FilePlan], buffers: Sequence[torch.Tensor]) -> None:
        self._plans = plans
        # numpy views expose the torch storage through the buffer protocol, so
        # preadv writes into it directly.
        self._views = [b.numpy().data for b in buffers]

    def read(self, chunk: _Chunk) -> None:
        view = self._views[chunk.file_index][chunk.buf_offset : chunk.buf_offset + chunk.length]
        _read_chunk(self._plans[chunk.file_index], chunk, view)


class _CudaReader(_Reader):
    """Reads into per-thread pinned slots and copies each chunk to the device on a side stream."""

    def __init__(
        self,
        plans: Sequence[_FilePlan],
        buffers: Sequence[torch.Tensor],
        chunks: Sequence[_Chunk],
        target: torch.device,
        concurrency: int,
    ) -> None:
        self._plans = plans
        self._buffers = buffers
        self._target = target
        threads = min(concurrency, max(1, len(chunks)))
        self._slot_bytes = max((c.length for c in chunks), default=0)
        # Two slots per thread: a thread reads its next chunk into one slot while the
        # copy out of the other is still in flight. One chunk per thread needs one.
        self._slots_per_thread = 2 if len(chunks) > threads else 1
        nslots = threads * self._slots_per_thread
        self._staging = _cuda.empty_pinned(max(1, nslots * self._slot_bytes))
        self._staging_np = self._staging.numpy().data
        # Device buffers were allocated on the current stream; the side stream waits for that.
        self._stream = _cuda.side_stream(target)
        self._next_thread = itertools.count()
        self._local = threading.local()

    def init_thread(self) -> None:
        _cuda.set_device(self._target)
        k = next(self._next_thread)  # atomic under the GIL: each thread gets its own slots
        spt = self._slots_per_thread
        self._local.slots = [k * spt + j for j in range(spt)]
        self._local.events = [None] * spt
        self._local.turn = 0

    def read(self, chunk: _Chunk) -> None:
        loc = self._local
        k = loc.turn % len(loc.slots)
        loc.turn += 1
        event = loc.events[k]
        if event is not None:
            # The copy out of this slot must finish before the slot is overwritten.
            event.synchronize()
        start = loc.slots[k] * self._slot_bytes
        _read_chunk(
            self._plans[chunk.file_index], chunk, self._staging_np[start : start + chunk.length]
        )
        dst = self._buffers[chunk.file_index][chunk.buf_offset : chunk.buf_offset + chunk.length]
        loc.events[k] = _cuda.copy_async(
            dst, self._staging[start : start + chunk.length], self._stream
        )

    def finish(self) -> None:
        # Also on failure: the device buffers must not be freed (and their memory
        # reused) while copies into them are in flight.
        self._stream.synchronize()


class _TorchCuda:
    """The CUDA calls the streamer makes, in one place: a test swaps in a fake whose
    copies run late, to check the slot reuse logic without a GPU."""

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def set_device(self, device: torch.device) -> None:
        torch.cuda.set_device(device)

    def empty(self, nbytes: int, device: torch.device) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def empty_pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def side_stream(self, device: torch.device) -> Any:
        stream = torch.cuda.Stream(device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        return stream

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, stream: Any) -> Any:
        """Queue ``dst.copy_(src)`` on ``stream``; returns an event whose
        ``synchronize()`` waits for it (and everything queued before it)."""
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
            # blocking: a waiting reader thread sleeps instead of spinning on a core
            # another reader needs.
            event = torch.cuda.Event(blocking=True)
            event.record(stream)
        return event

    def synchronize_current(self, device: torch.device) -> None:
        torch.cuda.current_stream(device).synchronize()


_cuda = _TorchCuda()


def _read_chunk(plan: _FilePlan, chunk: _Chunk, view: memoryview) -> None:
    try:
        plan.source.read_into(chunk.file_offset, view)
    except StreamError:
        raise
    except Exception as exc:  # a source's own error type (OSError, botocore...) gets context
        raise StreamError(
            f"{plan.name}: reading {chunk.length} bytes at offset {chunk.file_offset} failed: {exc!r}"
        ) from exc


def _run_pool(
    reader: _Reader,
    chunks: Sequence[_Chunk],
    threads: int,
    progress: ProgressFn | None,
    on_abort: Callable[[], None] | None = None,
) -> None:
    """Read ``chunks`` on ``threads`` threads, each taking the next chunk in order when it
    is free; this thread reports progress and raises the first reader's exception.

    Threads pull from one iterator rather than an executor's futures: waiting on a set of
    futures costs the waiting thread time in proportion to the pending ones, under the
    GIL. On an H200 that cost ``load_many`` to the device 4 % at 32 MiB chunks, 30 % at
    16 MiB and 64 % at 8 MiB (docs/BENCHMARKS.md, the GPU breakdown)."""
    if not chunks:
        return
    total = sum(c.length for c in chunks)
    stop = threading.Event()
    todo = iter(chunks)
    taking = threading.Lock()
    # From each reader: a chunk's length when it is in, then one last message: None
    # when no chunk is left (or another reader failed), else the exception that ended it.
    reports: queue.SimpleQueue[int | BaseException | None] = queue.SimpleQueue()

    def work() -> None:
        try:
            reader.init_thread()
            while not stop.is_set():  # another reader failed: no new reads
                with taking:
                    chunk = next(todo, None)
                if chunk is None:
                    break
                reader.read(chunk)
                reports.put(chunk.length)
        except BaseException as exc:
            # Stop the other readers at once, not when this thread gets round to it.
            stop.set()
            reports.put(exc)
            return
        reports.put(None)

    def abort() -> None:
        stop.set()
        # A source whose reader is blocked (waiting for an earlier chunk that will now
        # never come) lets go, so the readers can be joined.
        if on_abort is not None:
            on_abort()

    workers = [threading.Thread(target=work, name=f"thaw-read-{i}") for i in range(threads)]
    for w in workers:
        w.start()
    done_bytes, running = 0, len(workers)
    failure: BaseException | None = None
    try:
        while running:
            msg = reports.get()
            if msg is None or isinstance(msg, BaseException):
                running -= 1
                if msg is not None and failure is None:
                    failure = msg
                    abort()
            else:
                done_bytes += msg
                if progress is not None:
                    progress(done_bytes, total)
    except BaseException:  # this thread interrupted, or progress raised
        abort()
        raise
    finally:
        for w in workers:
            w.join()
    if failure is not None:
        raise failure


# --- tensors ------------------------------------------------------------------------


# madvise(2)'s MADV_POPULATE_READ, where Python's mmap module does not name it.
_MADV_POPULATE_READ = 22


def map_file(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of a local safetensors file as a view of the file mapped into this
    process: for a file already in memory (the worker's tmpfs copy) nothing is copied
    and no fresh page is written, where a read into a new buffer copies every byte into
    pages that each fault on their first write. The mapping is private (writes to a
    tensor stay in this process) and lives as long as any of its tensors; its page
    tables are filled up front for reading (``MADV_POPULATE_READ``, Linux 5.14+; else
    each page faults on its first read). ``MAP_POPULATE`` would not do: on a private
    writable mapping it copies every page (2.1-2.4 GB/s here, against 13 GB/s)."""
    import mmap

    name = os.fspath(path)
    header = read_header_from_file(name)
    if header.data_len == 0:
        return {n: torch.empty(t.shape, dtype=_dtype_for(t, name)) for n, t in header.tensors.items()}
    with open(name, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    with contextlib.suppress(OSError):  # an older kernel: the pages fault in as they are read
        mm.madvise(getattr(mmap, "MADV_POPULATE_READ", _MADV_POPULATE_READ))
    buf = torch.frombuffer(mm, dtype=torch.uint8)
    return {n: _tensor_at(buf, header.data_offset + t.begin, t.nbytes, _dtype_for(t, name), t.shape)
            for n, t in header.tensors.items()}


def _tensor_at(buf: torch.Tensor, begin: int, length: int, dtype: torch.dtype,
               shape: Sequence[int]) -> torch.Tensor:
    """The tensor whose bytes are ``buf[begin:begin + length]``: a view of them, or a
    copy where ``begin`` is not a multiple of the element size (torch cannot view bytes
    there, and kernels assume aligned pointers)."""
    if length == 0:
        return torch.empty(tuple(shape), dtype=dtype, device=buf.device)
    raw = buf[begin: begin + length]
    if begin % dtype.itemsize:
        raw = raw.clone()
    return raw.view(dtype).view(tuple(shape))


def _materialize(plan: _FilePlan, buf: torch.Tensor) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for p in plan.placements:
        t = _tensor_at(buf, p.buf_begin, p.length, p.dtype, p.shape)
        if p.post_slice is not None:
            dim, start, stop = p.post_slice
            t = t.narrow(dim, start, stop - start).contiguous()
        out[p.name] = t
    return out
