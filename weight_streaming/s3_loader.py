"""Load a model's safetensors from S3 into memory, through the local disk cache.

:func:`load_s3` is the entry point a worker (or vLLM's loader) calls::

    result = load_s3(endpoint, "s3://bucket/models/llama", cache=DiskCache(dir, 200 << 30))
    result.tensors["model.embed_tokens.weight"]

How a load goes:

1. **Which objects.** An ``s3://bucket/prefix`` URI is one LIST: every ``*.safetensors``
   directly under the prefix (with ``model.safetensors.index.json``, exactly the files
   its ``weight_map`` names, all of which must be there). The LIST also gives each
   object's size and ETag, so no HEAD is needed. Explicit ``(bucket, key)`` pairs cost
   one HEAD each (in parallel); :class:`S3Object` values cost nothing.
2. **Cache lookups** (with ``caches``, fastest tier first, e.g. host memory then local
   disk; ``cache`` is one tier named ``disk``): an entry for ``(bucket, key, ETag)`` of
   the right size whose safetensors header parses is a hit and is read from that tier;
   zero GETs. The ETag comes from step 1 (the LIST, or the HEAD), so a replaced object
   is a miss. Tiers that miss a file are filled from whichever source serves it, as it
   streams (a disk hit fills the host tier; an S3 read fills both).
3. **Headers** of the misses: one ranged GET of the first 1 MiB each, in parallel
   (a longer header costs a second GET). A malformed file is refused here, before any
   tensor bytes move.
4. **Data**: :func:`weight_streaming.streamer.load_many` over all files at once: parallel
   ranged GETs (``chunk_bytes`` each, cut at multiples of ``chunk_bytes`` in the object
   so they match its stored parts, ``concurrency`` at a time, every GET with
   ``If-Match: <ETag>`` so a replaced object fails the load instead of mixing versions)
   straight into one preallocated buffer per file (on CUDA: pinned staging slots and
   overlapped copies to the device). A miss is written to the cache as it streams: on
   the CPU path each chunk is queued to the cache's writer thread from the final
   buffer (the load does not wait for the disk); on CUDA it is written from its
   staging slot before the slot is reused. The entry is committed (fsync, rename) in
   the background once the load succeeded.
5. **Checks**: sizes (Content-Length and short bodies), the header against the object
   size, and with ``verify_sha256`` the sha256 of every file, hashed in file order as
   the chunks land. A cache entry that fails its checks is evicted and its object read
   from S3 again. Any failure raises; a load never returns a partial model.
6. **Records**: after a load of ``s3://bucket/prefix``, every tier records that it
   holds that model's files (``DiskCache.record_model``), which is how a worker tells
   the controller what it has cached.

With ``tp_size > 1`` a rank reads only its part of each file, so a miss cannot be
cached as it streams: the whole object is first fetched into the cache (same parallel
GETs), then the rank's part is read from local disk.

One piece: the load's steps (list, cache, stream, verify) in the order the numbered
list above gives them.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from thaw.log import get_logger
from thaw.units import MiB
from weight_streaming.cache import CacheWriter, DiskCache
from weight_streaming.host_pool import HostBufferPool
from weight_streaming.manifest import Manifest, TensorDigest, join_key, parse_s3_uri
from weight_streaming.s3_source import S3Error, S3NotFound, S3RangeSource, s3_error
from weight_streaming.safetensors_header import (
    MalformedSafetensors,
    SafetensorsHeader,
    header_length,
    parse_header,
)
from weight_streaming.sources import FileRangeSource, RangeSource, StreamError
from weight_streaming.streamer import (
    LoadResult,
    LoadStats,
    ProgressFn,
    ShardDimFn,
    load_many,
    read_header,
)

__all__ = [
    "DEFAULT_S3_CHUNK_BYTES",
    "DEFAULT_S3_CONCURRENCY",
    "HEADER_PROBE_BYTES",
    "ChecksumMismatch",
    "FileLoad",
    "S3LoadResult",
    "S3Object",
    "load_s3",
    "make_client",
    "manifest_digests",
    "manifest_sha256",
    "resolve_objects",
]

log = get_logger()

# Chosen with `thaw bench stream --sweep` (docs/BENCHMARKS.md). 16 MiB is the part size
# `thaw push` uploads, so an aligned range is one stored part; 16 GETs in flight keep
# the store busy while some readers are paging in fresh memory. On loopback SeaweedFS
# (2 cores, interleaved medians) 16 MiB x 16 gave 0.60 GiB/s against 0.55 for 16 x 8,
# 0.57 for 32 x 8 and 32 x 16, 0.49 for 8 x 8. Against AWS S3 (~100 MB/s per connection)
# more concurrency buys more bandwidth: raise it on big instances.
DEFAULT_S3_CHUNK_BYTES = 16 * MiB
DEFAULT_S3_CONCURRENCY = 16
# One GET covers the length prefix and the header of every model file we have seen
# (an 8B-shard header is ~30 KB); a longer header costs one more GET.
HEADER_PROBE_BYTES = 1 * MiB
INDEX_FILE = "model.safetensors.index.json"

Device = str | torch.device


class S3ClientFactory(Protocol):
    """What builds clients: :class:`thaw.objstore.S3Endpoint` has this shape."""

    def client(self, **config: Any) -> Any: ...


@dataclass(frozen=True)
class S3Object:
    """One object to load: where, how big, which version."""

    bucket: str
    key: str
    size: int
    etag: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


@dataclass(frozen=True)
class FileLoad:
    """How one file of a load was served."""

    uri: str
    size: int
    etag: str
    # "s3", or the name of the cache tier that served it ("host", "disk").
    source: str
    # Cache entries are being committed for it (tiers that missed it and had room).
    cache_written: bool = False


@dataclass(frozen=True)
class S3LoadResult(LoadResult):
    """:class:`LoadResult` plus where each file came from. ``stats.seconds`` covers the
    whole call (listing, cache lookups, header GETs, data)."""

    files: tuple[FileLoad, ...] = ()
    # Cached copies that failed a check during this load (evicted, read elsewhere):
    # (uri, tier, reason).
    rejected: tuple[tuple[str, str, str], ...] = ()

    @property
    def cache_hits(self) -> int:
        return sum(f.source != "s3" for f in self.files)

    def bytes_by_source(self) -> dict[str, int]:
        """Bytes read from each source ("s3", "host", "disk")."""
        out: dict[str, int] = {}
        for f in self.files:
            out[f.source] = out.get(f.source, 0) + f.size
        return out

    @property
    def s3_files(self) -> int:
        return sum(f.source == "s3" for f in self.files)


@dataclass(frozen=True)
class CacheTier:
    """One local copy of the store a load may read from: ``name`` says which
    ("host": memory-backed, "disk": the instance's disk)."""

    name: str
    cache: DiskCache


class ChecksumMismatch(StreamError):
    """A file's sha256 is not the one the manifest records; ``tier``: the cache tier
    the bytes came from (None: the store)."""

    def __init__(self, message: str, obj: S3Object, tier: str | None) -> None:
        super().__init__(message)
        self.obj = obj
        self.tier = tier

    @property
    def from_cache(self) -> bool:
        return self.tier is not None


# --- public helpers -----------------------------------------------------------------


def make_client(store: Any, concurrency: int = DEFAULT_S3_CONCURRENCY) -> Any:
    """A boto3 S3 client for ``store``: a client is used as is; an
    :class:`S3ClientFactory` (e.g. ``S3Endpoint``) builds one whose connection pool
    has room for ``concurrency`` parallel GETs plus the control requests."""
    if hasattr(store, "get_object"):
        pool = getattr(getattr(getattr(store, "meta", None), "config", None), "max_pool_connections", None)
        if isinstance(pool, int) and pool < concurrency:
            # Threads beyond the pool size wait for a connection: concurrency is capped silently.
            log.warning("s3_client_pool_too_small", max_pool_connections=pool, concurrency=concurrency)
        return store
    return store.client(
        max_pool_connections=concurrency + 4,
        # Ranged GETs carry no whole-object checksum; do not ask for one.
        response_checksum_validation="when_required",
        request_checksum_calculation="when_required",
    )


def manifest_sha256(manifest: Manifest) -> dict[str, str]:
    """``verify_sha256`` for :func:`load_s3` from a Thaw manifest: object key → sha256."""
    _, prefix = parse_s3_uri(manifest.uri)
    return {join_key(prefix, f.path): f.sha256 for f in manifest.files if f.path.endswith(".safetensors")}


def manifest_digests(manifest: Manifest) -> dict[str, dict[str, TensorDigest]]:
    """Per object key, every tensor of that safetensors file as the manifest records it
    (an empty dict for a file pushed before tensors were recorded)."""
    prefix = parse_s3_uri(manifest.uri)[1]
    return {join_key(prefix, path): dict(s.tensors) for path, s in manifest.safetensors.items()}


def resolve_objects(
    client: Any,
    objects: str | Sequence[tuple[str, str] | S3Object],
    *,
    concurrency: int = DEFAULT_S3_CONCURRENCY,
) -> list[S3Object]:
    """The objects a load reads, with size and ETag (see :func:`load_s3` for the forms)."""
    if isinstance(objects, str):
        bucket, prefix = parse_s3_uri(objects)
        if prefix.endswith(".safetensors"):
            return _head_all(client, [(bucket, prefix)], concurrency)
        return _list_model(client, bucket, prefix, objects)
    given = [o for o in objects if isinstance(o, S3Object)]
    pairs = [o for o in objects if not isinstance(o, S3Object)]
    if not given and not pairs:
        raise ValueError("no objects to load")
    return given + _head_all(client, [(b, k) for b, k in pairs], concurrency)


# --- the entry point ----------------------------------------------------------------


def load_s3(
    store: Any,
    objects: str | Sequence[tuple[str, str] | S3Object],
    *,
    device: Device = "cpu",
    chunk_bytes: int = DEFAULT_S3_CHUNK_BYTES,
    concurrency: int = DEFAULT_S3_CONCURRENCY,
    cache: DiskCache | None = None,
    caches: Sequence[CacheTier] = (),
    verify_sha256: Mapping[str, str] | None = None,
    progress: ProgressFn | None = None,
    tp_rank: int = 0,
    tp_size: int = 1,
    shard_dims: ShardDimFn | None = None,
    host_pool: HostBufferPool | None = None,
    unhashed_tiers: frozenset[str] = frozenset(),
) -> S3LoadResult:
    """Load every tensor of a model stored in S3 onto ``device`` (see the module docstring).

    ``store`` is a boto3 S3 client (shared by all reader threads; give it
    ``max_pool_connections >= concurrency``) or something with ``.client(**config)``
    such as :class:`thaw.objstore.S3Endpoint`. ``objects`` is ``"s3://bucket/prefix"``
    (the model's ``*.safetensors`` under it), ``"s3://bucket/key.safetensors"``, or a
    list of ``(bucket, key)`` pairs or :class:`S3Object`.

    ``caches``: local tiers, fastest first: serve hits from the first that has a file
    and fill the others as it streams; ``cache``: one more tier, named "disk", after
    them. ``verify_sha256``:
    object key → expected sha256 hex for every file (:func:`manifest_sha256` builds it
    from a manifest); with ``tp_size > 1`` it needs a ``cache`` (a rank reads only its
    part of a file, so the whole file is hashed from disk). ``progress``, ``tp_rank``,
    ``tp_size``, ``shard_dims``, ``host_pool``: as for
    :func:`weight_streaming.streamer.load_many` (``progress`` covers the streaming of the
    tensors; with ``tp_size > 1`` the whole-file fill of a cache miss comes before it).
    ``unhashed_tiers``: cache tiers whose hits skip ``verify_sha256`` (and fill no other
    tier), for a caller that checks every tensor itself (``weight_streaming.tensor_check``:
    a swap from the worker's memory copy, whose sha256 was checked when it was filled).

    Raises :class:`~weight_streaming.s3_source.S3Error` (not found, access denied,
    object changed), :class:`StreamError` (short reads, sizes, checksums) or
    :class:`MalformedSafetensors`; never returns a partial model.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"need 0 <= tp_rank < tp_size, got tp_rank={tp_rank} tp_size={tp_size}")
    tiers = [*caches, *([CacheTier("disk", cache)] if cache is not None else [])]
    if len({t.name for t in tiers}) != len(tiers) or any(t.name == "s3" for t in tiers):
        raise ValueError(f"cache tier names must be unique and not 's3': {[t.name for t in tiers]}")
    if verify_sha256 is not None and tp_size > 1 and not tiers:
        raise ValueError(
            "verify_sha256 with tp_size > 1 needs a cache: a rank reads only part of each file"
        )
    t0 = time.perf_counter()
    client = make_client(store, concurrency)
    objs = sorted(resolve_objects(client, objects, concurrency=concurrency), key=lambda o: (o.bucket, o.key))
    if verify_sha256 is not None:
        missing = [o.uri for o in objs if o.key not in verify_sha256]
        if missing:
            raise StreamError(f"verify_sha256 has no sha256 for {', '.join(missing)}")
    opts = _Options(device, chunk_bytes, concurrency, progress, tp_rank, tp_size, shard_dims, host_pool,
                    unhashed_tiers)
    # A cache entry that fails its sha256 is evicted and the load tried again (the
    # next tier, or S3): at most once per tier.
    rejected: list[tuple[str, str, str]] = []
    for attempt in range(len(tiers) + 1):
        try:
            result = _load_once(client, objs, opts, tiers, verify_sha256, rejected)
            break
        except ChecksumMismatch as exc:
            tier = next((t for t in tiers if t.name == exc.tier), None)
            if tier is None or attempt == len(tiers):
                raise
            log.warning("cache_entry_corrupt", object=exc.obj.uri, tier=tier.name, error=str(exc))
            rejected.append((exc.obj.uri, tier.name, str(exc)))
            tier.cache.evict(exc.obj.bucket, exc.obj.key, exc.obj.etag)
    if isinstance(objects, str) and tiers:
        files = [(o.bucket, o.key, o.etag, o.size) for o in objs if o.etag]
        for t in tiers:
            try:
                t.cache.record_model(objects, files)
            except OSError as exc:  # a full disk: the tier just does not say it has the model
                log.warning("cache_record_failed", tier=t.name, uri=objects, error=str(exc))
    seconds = time.perf_counter() - t0
    stats = LoadStats(
        bytes=result.stats.bytes, seconds=seconds, files=result.stats.files, chunks=result.stats.chunks
    )
    log.info(
        "s3_load_done", files=len(objs), bytes=stats.bytes, seconds=round(seconds, 3),
        gib_per_s=round(stats.bytes / seconds / 2**30, 3) if seconds > 0 else None,
        cache_hits=result.cache_hits, sources=result.bytes_by_source(), device=str(device),
    )
    return S3LoadResult(tensors=result.tensors, stats=stats, files=result.files, rejected=tuple(rejected))


# --- one attempt --------------------------------------------------------------------


@dataclass(frozen=True)
class _Options:
    device: Device
    chunk_bytes: int
    concurrency: int
    progress: ProgressFn | None
    tp_rank: int
    tp_size: int
    shard_dims: ShardDimFn | None
    host_pool: HostBufferPool | None
    unhashed_tiers: frozenset[str]


@dataclass
class _Attempt:
    """What one attempt builds as it goes: each file's source and how it is served, the
    checks and cache fills still to run, and what it opened and began (closed, and
    committed or aborted, whatever happens)."""

    sources: list[RangeSource] = field(default_factory=list)
    files: list[FileLoad] = field(default_factory=list)
    hashers: list[_Sha256Source] = field(default_factory=list)
    to_fill: list[tuple[RangeSource, CacheWriter, int, S3Object]] = field(default_factory=list)
    writers: list[CacheWriter] = field(default_factory=list)
    opened: list[FileRangeSource] = field(default_factory=list)


_Hit = tuple[CacheTier, FileRangeSource, SafetensorsHeader]


def _load_once(
    client: Any,
    objs: Sequence[S3Object],
    opts: _Options,
    tiers: Sequence[CacheTier],
    verify: Mapping[str, str] | None,
    rejected: list[tuple[str, str, str]],
) -> S3LoadResult:
    a = _Attempt()
    try:
        hits = _open_hits(objs, tiers, rejected, a.opened)
        misses = [i for i in range(len(objs)) if i not in hits]
        probes = _parallel(lambda i: _probe(client, objs[i]), misses, opts.concurrency)
        # On the host, chunks land in the final buffer, which outlives the load: the
        # cache files are written from it by background threads. On CUDA they land in
        # staging slots that are reused, so each chunk is written before the slot is.
        to_host = torch.device(opts.device).type == "cpu"
        for i, obj in enumerate(objs):
            _add_file(a, client, obj, hits.get(i), probes.get(i), opts, tiers, verify, to_host)

        if a.to_fill:
            _fill(a.to_fill, opts.chunk_bytes, opts.concurrency)
        result = load_many(
            a.sources,
            device=opts.device,
            chunk_bytes=opts.chunk_bytes,
            concurrency=opts.concurrency,
            progress=opts.progress,
            tp_rank=opts.tp_rank,
            tp_size=opts.tp_size,
            shard_dims=opts.shard_dims,
            host_pool=opts.host_pool,
        )
        for hs in a.hashers:
            hs.check_complete()
    except BaseException:
        for w in a.writers:
            w.abort()
        raise
    finally:
        for fs in a.opened:
            fs.close()
    # The load is whole: make its cache entries visible (in the background). A commit
    # that fails is logged by the cache and only costs a future download.
    for w in a.writers:
        w.commit()
    return S3LoadResult(tensors=result.tensors, stats=result.stats, files=tuple(a.files))


def _open_hits(
    objs: Sequence[S3Object], tiers: Sequence[CacheTier], rejected: list[tuple[str, str, str]],
    opened: list[FileRangeSource],
) -> dict[int, _Hit]:
    """Each object's copy in the first tier that has a sound one, opened (into ``opened``)."""
    hits: dict[int, _Hit] = {}
    for i, obj in enumerate(objs):
        if not obj.etag:  # without a version to key on, a cached copy could be stale
            continue
        for tier in tiers:
            hit = _open_hit(tier, obj, rejected)
            if hit is not None:
                hits[i] = (tier, *hit)
                opened.append(hit[0])
                break
    return hits


def _add_file(
    a: _Attempt,
    client: Any,
    obj: S3Object,
    hit: _Hit | None,
    probe: tuple[bytes, SafetensorsHeader] | None,
    opts: _Options,
    tiers: Sequence[CacheTier],
    verify: Mapping[str, str] | None,
    to_host: bool,
) -> None:
    """Add ``obj``'s source to the attempt: its cached copy (``hit``) or S3 (``probe``:
    its first bytes and header), teed into the tiers that get a copy, hashed where the
    load checks it."""
    whole_file = opts.tp_size == 1
    src: RangeSource
    head: bytes | None
    if hit is not None:
        source_tier, fs, header = hit
        src, head, kind = fs, None, source_tier.name
    else:
        assert probe is not None
        source_tier = None
        head, header = probe
        src = S3RangeSource(client, obj.bucket, obj.key, size=obj.size, etag=obj.etag, prefix=head)
        kind = "s3"
    # Every other tier that has room gets a copy, from whichever source serves the
    # file; none from a copy whose sha256 this load does not check.
    unhashed = source_tier is not None and source_tier.name in opts.unhashed_tiers
    writers = _begin_copies(obj, tiers, source_tier, whole_file, a.writers) if obj.etag and not unhashed else []
    if writers:
        if head is None:
            buf = bytearray(header.data_offset)
            src.read_into(0, memoryview(buf))
            head = bytes(buf)
        for w in writers:
            # The header goes in now; the data as it streams (or in the fill below).
            w.write(0, head[: header.data_offset])
    expected = verify[obj.key] if verify is not None and not unhashed else None
    if writers and whole_file:
        src = _TeeSource(src, writers, header.data_offset, later=to_host)
    elif writers:
        # A rank reads only its part: fetch the whole object into the cache, then read from disk.
        fill_src: RangeSource = src
        if expected is not None:
            fill_src = _hashing(src, obj, expected, header, head, tier=kind if source_tier else None)
        a.to_fill.append((fill_src, writers[0], header.data_offset, obj))
        fs = FileRangeSource(writers[0].tmp)
        a.opened.append(fs)
        src, expected = fs, None  # hashed during the fill
    if expected is not None:
        if whole_file:
            hs = _hashing(src, obj, expected, header, head, tier=kind if source_tier else None)
            a.hashers.append(hs)
            src = hs
        elif source_tier is not None:
            _hash_file(src, obj, expected, source_tier.name)
        else:
            raise StreamError(
                f"{obj.uri}: cannot verify sha256 with tp_size={opts.tp_size}: "
                "the file does not fit in the cache"
            )
    a.sources.append(src)
    a.files.append(FileLoad(obj.uri, obj.size, obj.etag, kind, bool(writers)))


def _begin_copies(
    obj: S3Object,
    tiers: Sequence[CacheTier],
    source_tier: CacheTier | None,
    whole_file: bool,
    begun: list[CacheWriter],
) -> list[CacheWriter]:
    """Cache writers for ``obj`` in every tier but its source that lacks it and has room;
    one tier at most when a rank reads only its part. Each is added to ``begun`` as it
    begins (aborted there if the attempt fails)."""
    writers: list[CacheWriter] = []
    for tier in tiers:
        if tier is source_tier or (not whole_file and writers):
            continue  # a rank's fill (tp_size > 1) goes to one tier only
        if source_tier is not None and tier.cache.lookup(obj.bucket, obj.key, obj.etag,
                                                         obj.size) is not None:
            continue  # this tier has it too
        w = tier.cache.begin(obj.bucket, obj.key, obj.etag, obj.size)
        if w is not None:
            writers.append(w)
            begun.append(w)
    return writers


def _open_hit(
    tier: CacheTier, obj: S3Object, rejected: list[tuple[str, str, str]]
) -> tuple[FileRangeSource, SafetensorsHeader] | None:
    cache = tier.cache
    path = cache.lookup(obj.bucket, obj.key, obj.etag, obj.size)
    if path is None:
        return None
    try:
        # Opened now: if the entry is evicted later in this load, the descriptor still reads it.
        fs = FileRangeSource(path)
    except FileNotFoundError:
        return None
    try:
        header = read_header(fs, name=str(path))
    except (MalformedSafetensors, StreamError) as exc:
        fs.close()
        log.warning("cache_entry_corrupt", object=obj.uri, tier=tier.name, path=str(path), error=str(exc))
        rejected.append((obj.uri, tier.name, str(exc)))
        cache.evict(obj.bucket, obj.key, obj.etag)
        return None
    return fs, header


def _probe(client: Any, obj: S3Object) -> tuple[bytes, SafetensorsHeader]:
    """The object's first bytes (at least its whole header) and the parsed header."""
    src = S3RangeSource(client, obj.bucket, obj.key, size=obj.size, etag=obj.etag)
    buf = bytearray(min(obj.size, HEADER_PROBE_BYTES))
    src.read_into(0, memoryview(buf))
    n = header_length(bytes(buf[:8]), source=obj.uri)
    if 8 + n > obj.size:
        raise MalformedSafetensors(
            f"{obj.uri}: header length {n} runs past the end of the {obj.size}-byte file"
        )
    if 8 + n > len(buf):
        rest = bytearray(8 + n - len(buf))
        src.read_into(len(buf), memoryview(rest))
        buf += rest
    header = parse_header(bytes(buf[8 : 8 + n]), file_size=obj.size, source=obj.uri)
    return bytes(buf), header


# --- listing ------------------------------------------------------------------------


def _list_model(client: Any, bucket: str, prefix: str, uri: str) -> list[S3Object]:
    key_prefix = join_key(prefix, "")
    found: dict[str, S3Object] = {}
    has_index = False
    try:
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=key_prefix, Delimiter="/"
        ):
            for o in page.get("Contents", []):
                name = o["Key"][len(key_prefix) :]
                if name == INDEX_FILE:
                    has_index = True
                elif name.endswith(".safetensors"):
                    found[name] = S3Object(bucket, o["Key"], int(o["Size"]), str(o["ETag"]).strip('"'))
        index = None
        if has_index:
            body = client.get_object(Bucket=bucket, Key=key_prefix + INDEX_FILE)["Body"]
            index = json.loads(body.read())
    except S3Error:
        raise
    except Exception as exc:
        raise s3_error(exc, bucket, key_prefix, action="LIST") from exc
    if index is not None:
        # A repository may also hold a consolidated copy: load only what the index names.
        wanted = set((index.get("weight_map") or {}).values())
        missing = sorted(wanted - set(found))
        if missing:
            raise S3NotFound(f"{uri}: {INDEX_FILE} names files that are not in the store: {missing}")
        found = {n: o for n, o in found.items() if n in wanted}
    if not found:
        raise S3NotFound(f"{uri}: no *.safetensors objects under this prefix")
    return [found[n] for n in sorted(found)]


def _head_all(client: Any, pairs: Sequence[tuple[str, str]], concurrency: int) -> list[S3Object]:
    def head(pair: tuple[str, str]) -> S3Object:
        bucket, key = pair
        try:
            h = client.head_object(Bucket=bucket, Key=key)
        except Exception as exc:
            raise s3_error(exc, bucket, key, action="HEAD") from exc
        return S3Object(bucket, key, int(h["ContentLength"]), str(h.get("ETag", "")).strip('"'))

    heads = _parallel(head, list(pairs), concurrency)
    return [heads[p] for p in pairs]


def _parallel(fn: Any, items: Sequence[Any], concurrency: int) -> dict[Any, Any]:
    """``{item: fn(item)}``, several at a time; the first failure is raised."""
    if len(items) <= 1:
        return {i: fn(i) for i in items}
    with ThreadPoolExecutor(min(concurrency, len(items)), thread_name_prefix="thaw-s3-meta") as pool:
        return dict(zip(items, pool.map(fn, items), strict=True))


# --- source wrappers ----------------------------------------------------------------


class _WrappedSource:
    """A RangeSource that adds to another's reads; everything else passes through."""

    _inner: RangeSource

    def size(self) -> int:
        return self._inner.size()

    @property
    def aligned_chunks(self) -> bool:
        return bool(getattr(self._inner, "aligned_chunks", False))

    def abort(self) -> None:
        abort = getattr(self._inner, "abort", None)
        if abort is not None:
            abort()

    def __repr__(self) -> str:
        return repr(self._inner)


class _TeeSource(_WrappedSource):
    """Reads through ``inner`` and sends each data chunk to cache files as it lands.

    ``later``: queue the writes (the view must stay valid: the final host buffer);
    otherwise write before returning (the view is a staging slot about to be reused).
    Reads before ``data_offset`` are the streamer's header reads (served from the probe
    already in memory); the header was written to the cache files up front.
    """

    def __init__(self, inner: RangeSource, writers: Sequence[CacheWriter], data_offset: int, *,
                 later: bool) -> None:
        self._inner = inner
        self._writers = list(writers)
        self._data_offset = data_offset
        self._later = later

    def read_into(self, offset: int, view: memoryview) -> None:
        self._inner.read_into(offset, view)
        if offset < self._data_offset:
            return
        for writer in self._writers:
            if self._later:
                writer.write_later(offset, view)
                continue
            try:
                writer.write(offset, view)
            except OSError as exc:
                # Disk full or similar: this entry is dropped (commit will refuse it), the load goes on.
                log.warning("cache_write_failed", object=writer.uri, error=str(exc))
                writer.mark_failed()


class _Sha256Source(_WrappedSource):
    """Hashes the file's data in file order as the (parallel, unordered) chunks land.

    A reader whose chunk is not next waits (inside ``read_into``, so its buffer stays
    valid) until the chunks before it are hashed: chunks are handed out in file
    order, so the one it waits for is already being read. ``abort`` (called by the
    streamer when the load fails) releases waiters.
    """

    def __init__(
        self, inner: RangeSource, *, obj: S3Object, expected: str, head: bytes, tier: str | None
    ) -> None:
        self._inner = inner
        self._obj = obj
        self._expected = expected.lower()
        self._tier = tier
        self._sha = hashlib.sha256(head)
        self._start = len(head)
        self._next = len(head)
        self._size = obj.size
        self._cond = threading.Condition()
        self._aborted = False
        self._checked = False

    def read_into(self, offset: int, view: memoryview) -> None:
        self._inner.read_into(offset, view)
        if offset < self._start:
            return
        mv = memoryview(view).cast("B")
        with self._cond:
            while self._next != offset:
                if self._aborted:
                    raise StreamError(f"{self._obj.uri}: load aborted")
                if offset < self._next:
                    raise StreamError(f"{self._obj.uri}: chunk at {offset} read twice while hashing")
                self._cond.wait()
        # Only this thread holds the chunk at _next: hash outside the lock.
        self._sha.update(mv)
        with self._cond:
            self._next += len(mv)
            last = self._next == self._size
            self._cond.notify_all()
        if last:
            self._check()

    def abort(self) -> None:
        with self._cond:
            self._aborted = True
            self._cond.notify_all()
        super().abort()

    def check_complete(self) -> None:
        """After the load: every byte was hashed and the digest matched."""
        if self._next != self._size:
            raise StreamError(f"{self._obj.uri}: only {self._next} of {self._size} bytes were hashed")
        self._check()

    def _check(self) -> None:
        if self._checked:
            return
        got = self._sha.hexdigest()
        if got != self._expected:
            where = f"{self._tier}-cached copy of " if self._tier else ""
            raise ChecksumMismatch(
                f"{where}{self._obj.uri}: sha256 {got} does not match the manifest's {self._expected}",
                self._obj,
                self._tier,
            )
        self._checked = True


def _hashing(
    src: RangeSource,
    obj: S3Object,
    expected: str,
    header: SafetensorsHeader,
    head: bytes | None,
    *,
    tier: str | None,
) -> _Sha256Source:
    if head is None:  # a cache hit: the header bytes come from the file
        buf = bytearray(header.data_offset)
        src.read_into(0, memoryview(buf))
        head = bytes(buf)
    return _Sha256Source(src, obj=obj, expected=expected, head=head[: header.data_offset], tier=tier)


def _hash_file(src: RangeSource, obj: S3Object, expected: str, tier: str) -> None:
    """Hash a whole (cached) file; ChecksumMismatch if it is not what the manifest says."""
    sha = hashlib.sha256()
    buf = bytearray(8 * MiB)
    pos = 0
    while pos < obj.size:
        mv = memoryview(buf)[: min(len(buf), obj.size - pos)]
        src.read_into(pos, mv)
        sha.update(mv)
        pos += len(mv)
    got = sha.hexdigest()
    if got != expected.lower():
        raise ChecksumMismatch(
            f"{tier}-cached copy of {obj.uri}: sha256 {got} does not match the manifest's {expected}", obj, tier
        )


def _fill(
    jobs: Sequence[tuple[RangeSource, CacheWriter, int, S3Object]], chunk_bytes: int, concurrency: int
) -> None:
    """Copy the data of whole objects into their cache files with parallel ranged GETs."""
    tasks = [
        (src, writer, off, min(chunk_bytes, obj.size - off))
        for src, writer, data_offset, obj in jobs
        for off in range(data_offset, obj.size, chunk_bytes)
    ]
    local = threading.local()
    stop = threading.Event()

    def run(task: tuple[RangeSource, CacheWriter, int, int]) -> None:
        if stop.is_set():
            return
        src, writer, off, n = task
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = bytearray(min(chunk_bytes, max(t[3] for t in tasks)))
        mv = memoryview(buf)[:n]
        src.read_into(off, mv)
        writer.write(off, mv)

    if not tasks:
        return
    with ThreadPoolExecutor(min(concurrency, len(tasks)), thread_name_prefix="thaw-cache-fill") as pool:
        futures = [pool.submit(run, t) for t in tasks]
        try:
            for fut in futures:
                fut.result()
        except BaseException:
            stop.set()
            for fut in futures:
                fut.cancel()
            for src, *_ in jobs:
                abort = getattr(src, "abort", None)
                if abort is not None:
                    abort()
            raise
