#!/usr/bin/env python3
"""Where Thaw's GPU weight streamer loses throughput: one-shot breakdown for a lent GPU.

    python3 loadtests/gpu/stream_breakdown.py --out $OUT/stream_breakdown.json
    python3 loadtests/gpu/stream_breakdown.py --device cpu --size-gb 0.2 --out /tmp/sb.json  # smoke

Known (docs/BENCHMARKS.md, H200): pinned host->device ceiling 55.4 GB/s, the streamer
(``load_many``, page cache, 16 threads x 32 MiB) 35 GB/s. This run splits the gap. The
model is gpu_bench's 8B-shaped one (16 GB, 4 shards) in ``--dir``, reused if present and
read once so it sits in the page cache. Sections (each records its own error; the JSON
is rewritten after each, so a timeout keeps what was measured):

1. ``alloc``: pinning the staging buffer (32 slots x 32 MiB), first and cached; a 16 GB
   device allocation fresh, cached, after ``empty_cache``, and as one buffer per shard.
2. ``host_read_only``: the reader threads alone: T threads ``preadv`` chunks of the shards
   into their own slots of one reused pinned buffer (and one non-pinned run). Host limit.
3. ``device_copy_only``: pinned -> device in chunk-sized async copies, 16 GB worth, (a) one
   thread, one stream; (b) 16 threads sharing a stream, an event per copy waited before
   the slot is reused, as the streamer does; (c) as (b) with a stream per thread. Device
   limit at chunk granularity, and what per-copy Python/launch overhead costs.
4. ``pipeline_variants``: the streamer's pipeline re-written here (read into slot, async
   copy, event, wait before reuse) over the real shards, varying threads, slots per
   thread, chunk size and streams one factor at a time, then the best combinations; also
   chunks handed out as the streamer does (ThreadPoolExecutor + ``wait(FIRST_COMPLETED)``)
   vs a shared iterator, and spinning vs blocking events. Per variant: GB/s, process CPU
   time, and how reader threads split their time (waiting on events / reading / issuing).
5. ``thaw_streamer``: ``load_many`` itself (3 reps) against the single 4 GiB pinned copy
   and section 3's best single-stream figure; one more load timed inside (device
   allocation, pinning, reader pool, rest); then ``load_many`` with the chunk hand-out
   it replaced (an executor), alternating, and ``worker_path``: what a GPU worker's
   cold start does today (into host memory, then vLLM's per-tensor copies to the
   device) against ``load_many`` straight to the device.
6. ``summary``: headline figures, which side (host or device) bounds, and the ratios.

Needs only torch and numpy, this repo's ``weight_streaming`` and ``gpu_bench.py`` (next to
this file; its helpers are reused). About 70 s on an H200 with the model files present,
~1 min more to write them.

One piece: the device machine runs this file as one short, prepared script; each section
is a few functions, and splitting them into modules would only spread one measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import threading
import time
import types
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import gpu_bench as gb
import torch

GiB, MiB, GB = gb.GiB, gb.MiB, gb.GB
log, med = gb.log, gb.med
T = TypeVar("T")


class Dev:
    """The device calls the pipeline makes; on CPU, copies are plain and synchronous and
    there are no streams or events, so the whole script smoke-runs without a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def empty(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.cuda)

    def enter_thread(self) -> None:
        if self.cuda:
            torch.cuda.set_device(self.device)

    def stream(self) -> Any:
        if not self.cuda:
            return None
        s = torch.cuda.Stream(device=self.device)
        s.wait_stream(torch.cuda.current_stream(self.device))
        return s

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Any) -> None:
        if not self.cuda:
            dst.copy_(src)
            return
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)

    def record(self, stream: Any, spin: bool) -> Any:
        if not self.cuda:
            return None
        event = torch.cuda.Event(blocking=not spin)
        event.record(stream)
        return event

    def sync(self) -> None:
        gb.sync(self.device)


@dataclass(frozen=True)
class Chunk:
    fd: int
    offset: int
    length: int
    dst: int  # offset in the one device buffer that holds all shards' data regions


class Shards:
    """The shard files held open; their data regions cut into chunks as the streamer does."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.fds = [os.open(p, os.O_RDONLY) for p in paths]
        self.regions: list[tuple[int, int, int]] = []
        for fd in self.fds:
            start = 8 + int.from_bytes(os.pread(fd, 8, 0), "little")
            self.regions.append((fd, start, os.fstat(fd).st_size - start))
        self.nbytes = sum(r[2] for r in self.regions)
        self._plans: dict[int, list[Chunk]] = {}

    def chunks(self, chunk: int) -> list[Chunk]:
        if chunk not in self._plans:
            plan, dst = [], 0
            for fd, start, length in self.regions:
                for off in range(0, length, chunk):
                    n = min(chunk, length - off)
                    plan.append(Chunk(fd, start + off, n, dst))
                    dst += n
            self._plans[chunk] = plan
        return self._plans[chunk]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


class Staging:
    """One reused pinned buffer, grown to a power of two when a variant needs more. Pinning
    costs ~0.5 s/GiB, so it is paid outside timed passes and logged in ``pins``."""

    def __init__(self, dev: Dev) -> None:
        self.dev = dev
        self.buf: torch.Tensor | None = None
        self.pins: list[dict[str, float]] = []

    def get(self, nbytes: int) -> torch.Tensor:
        if self.buf is None or self.buf.numel() < nbytes:
            self.buf = None  # back to torch's host cache before the larger one is pinned
            size = 1 << max(0, nbytes - 1).bit_length()
            t = time.perf_counter()
            self.buf = self.dev.pinned(size)
            self.pins.append({"bytes": size, "s": round(time.perf_counter() - t, 3)})
        return self.buf


def pread_full(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise OSError(f"short read at offset {offset + done}")
        done += got


@dataclass(frozen=True)
class Knobs:
    threads: int = 16
    slots: int = 2
    chunk_mib: int = 32
    per_thread_streams: bool = False
    dispatch: str = "iterator"  # or "executor": _run_pool's submit-all + wait(FIRST_COMPLETED)
    spin_events: bool = False


@dataclass(frozen=True)
class PassStats:
    seconds: float
    cpu_s: float
    threads: int
    read_s: float
    wait_s: float
    issue_s: float


def run_pass(
    dev: Dev,
    plan: list[Chunk],
    knobs: Knobs,
    src: torch.Tensor,
    dst: torch.Tensor | None,
    *,
    read: bool,
) -> PassStats:
    """One pass of the streamer's reader loop over ``plan``. Each thread owns ``slots``
    chunk-sized slots of ``src`` (wrapping, for copy-only passes from a smaller buffer)
    and waits on a slot's last copy before reusing it. ``dst=None``: no device copy."""
    chunk = knobs.chunk_mib * MiB
    src_view = src.numpy().data
    nthreads = min(knobs.threads, len(plan))
    shared = dev.stream() if dst is not None else None
    ids = itertools.count()
    local = threading.local()
    accs: list[list[float]] = []

    def init_thread() -> None:
        dev.enter_thread()
        k = next(ids)  # atomic under the GIL: each thread gets its own slots
        local.slots = [((k * knobs.slots + j) * chunk) % src.numel() for j in range(knobs.slots)]
        local.events = [None] * knobs.slots
        local.turn = 0
        local.stream = dev.stream() if knobs.per_thread_streams and dst is not None else shared
        local.acc = [0.0, 0.0, 0.0]  # wait, read, issue
        accs.append(local.acc)

    def step(c: Chunk) -> int:
        k = local.turn % knobs.slots
        local.turn += 1
        t0 = time.perf_counter()
        if local.events[k] is not None:
            local.events[k].synchronize()
        t1 = time.perf_counter()
        start = local.slots[k]
        if read:
            pread_full(c.fd, src_view[start : start + c.length], c.offset)
        t2 = time.perf_counter()
        if dst is not None:
            dev.copy(dst[c.dst : c.dst + c.length], src[start : start + c.length], local.stream)
            local.events[k] = dev.record(local.stream, knobs.spin_events)
        t3 = time.perf_counter()
        acc = local.acc
        acc[0] += t1 - t0
        acc[1] += t2 - t1
        acc[2] += t3 - t2
        return c.length

    dev.sync()
    cpu, t = time.process_time(), time.perf_counter()
    if knobs.dispatch == "executor":
        with ThreadPoolExecutor(nthreads, initializer=init_thread) as pool:
            pending = {pool.submit(step, c) for c in plan}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    fut.result()
    else:
        chunks = iter(plan)

        def loop() -> None:
            init_thread()
            for c in chunks:  # a list iterator's next runs under the GIL: no chunk twice
                step(c)

        with ThreadPoolExecutor(nthreads) as pool:
            for worker in [pool.submit(loop) for _ in range(nthreads)]:
                worker.result()
    dev.sync()
    seconds = time.perf_counter() - t
    w, r, i = (sum(a[j] for a in accs) for j in range(3))
    # len(accs): the executor starts threads only as it needs them.
    return PassStats(seconds, time.process_time() - cpu, len(accs), r, w, i)


def single_stream_pass(
    dev: Dev, plan: list[Chunk], src: torch.Tensor, dst: torch.Tensor
) -> PassStats:
    """All copies from one thread onto one stream, no events: the floor of per-copy cost."""
    stream, n, chunk = dev.stream(), src.numel(), plan[0].length
    dev.sync()
    cpu, t = time.process_time(), time.perf_counter()
    for i, c in enumerate(plan):
        s = (i * chunk) % n  # n is a multiple of every chunk size used
        dev.copy(dst[c.dst : c.dst + c.length], src[s : s + c.length], stream)
    dev.sync()
    return PassStats(time.perf_counter() - t, time.process_time() - cpu, 1, 0.0, 0.0, 0.0)


def measure(fn: Callable[[], PassStats], nbytes: int, reps: int = 2) -> dict[str, Any]:
    runs = [fn() for _ in range(reps)]
    share = {
        key: round(med([getattr(r, f"{key}_s") / (r.threads * r.seconds) for r in runs]), 3)
        for key in ("wait", "read", "issue")
    }
    out: dict[str, Any] = {
        "gbps": [round(nbytes / r.seconds / GB, 2) for r in runs],
        "median_gbps": round(med([nbytes / r.seconds / GB for r in runs]), 2),
        "median_s": round(med([r.seconds for r in runs]), 4),
        "cpu_s": round(med([r.cpu_s for r in runs]), 3),
        "cpu_cores_busy": round(med([r.cpu_s / r.seconds for r in runs]), 2),
    }
    if runs[0].threads > 1:
        out["thread_time_share"] = share | {"other": round(1 - sum(share.values()), 3)}
    return out


# --- sections -----------------------------------------------------------------------


def model_section(
    cfg: gb.ModelConfig, args: argparse.Namespace, dev: Dev, e: dict[str, Any]
) -> Shards:
    paths = gb.generate_model(cfg, args.dir, dev.device, e)
    shards = Shards(paths)
    e.update(files=[str(p) for p in paths], bytes=shards.nbytes, fs=gb.fs_type(args.dir))
    e["cached_kb_before_read"] = gb.meminfo_kb("Cached")
    # Plain memory: the first pinned allocation of the process belongs to section alloc.
    scratch = torch.empty(16 * 32 * MiB, dtype=torch.uint8)
    stats = run_pass(dev, shards.chunks(32 * MiB), Knobs(slots=1), scratch, None, read=True)
    e["first_read_s"] = round(stats.seconds, 3)
    e["first_read_gbps"] = round(shards.nbytes / stats.seconds / GB, 2)
    e["cached_kb_after_read"] = gb.meminfo_kb("Cached")
    return shards


def timed(fn: Callable[[], T], dev: Dev) -> tuple[T, float]:
    dev.sync()
    t = time.perf_counter()
    out = fn()
    dev.sync()
    return out, round(time.perf_counter() - t, 4)


def alloc_section(dev: Dev, shards: Shards, e: dict[str, Any]) -> None:
    n, total = 32 * 32 * MiB, shards.nbytes
    steps: list[tuple[str, Callable[[], object], bool]] = [
        ("pin_32x32mib_first_s", lambda: dev.pinned(n), False),
        ("pin_32x32mib_cached_s", lambda: dev.pinned(n), False),
        ("device_first_s", lambda: dev.empty(total), False),
        ("device_cached_s", lambda: dev.empty(total), True),
        ("device_after_empty_cache_s", lambda: dev.empty(total), True),
        (
            "device_per_shard_after_empty_cache_s",
            lambda: [dev.empty(r[2]) for r in shards.regions],
            True,
        ),
    ]
    for key, fn, empty_cache_after in steps:
        e[key] = timed(fn, dev)[1]  # the buffer dies here, back to torch's cache
        if empty_cache_after:
            gb.free_device(dev.device)
    e["device_bytes"] = total
    e["pin_gbps"] = round(n / max(e["pin_32x32mib_first_s"], 1e-9) / GB, 2)


def host_read_section(dev: Dev, shards: Shards, staging: Staging, e: dict[str, Any]) -> None:
    runs = []
    for threads, chunk_mib in [(8, 32), (16, 32), (32, 32), (16, 8), (16, 16), (16, 64)]:
        k = Knobs(threads=threads, chunk_mib=chunk_mib)
        plan = shards.chunks(chunk_mib * MiB)
        src = staging.get(min(threads, len(plan)) * k.slots * chunk_mib * MiB)
        r = measure(functools.partial(run_pass, dev, plan, k, src, None, read=True), shards.nbytes)
        runs.append({"threads": threads, "chunk_mib": chunk_mib, "pinned": True} | r)
        log(f"  host read {threads} x {chunk_mib} MiB pinned: {r['gbps']} GB/s")
    k, plan = Knobs(), shards.chunks(32 * MiB)
    plain = torch.empty(k.threads * k.slots * 32 * MiB, dtype=torch.uint8)
    plain.fill_(0)  # a reused buffer is faulted in; first-touch cost is not read cost
    r = measure(lambda: run_pass(dev, plan, k, plain, None, read=True), shards.nbytes)
    runs.append({"threads": 16, "chunk_mib": 32, "pinned": False} | r)
    log(f"  host read 16 x 32 MiB non-pinned: {r['gbps']} GB/s")
    e["slots_per_thread"] = 2
    e["runs"] = runs
    e["best_pinned_gbps"] = max(x["median_gbps"] for x in runs if x["pinned"])


def device_copy_section(dev: Dev, shards: Shards, staging: Staging, e: dict[str, Any]) -> None:
    src = staging.get(GiB)[:GiB]
    dst = dev.empty(shards.nbytes)
    runs = []
    for chunk_mib in (8, 16, 32, 64):
        plan = shards.chunks(chunk_mib * MiB)
        k = Knobs(chunk_mib=chunk_mib)
        modes = {
            "one_thread_one_stream": functools.partial(single_stream_pass, dev, plan, src, dst),
            "16_threads_shared_stream_events": functools.partial(
                run_pass, dev, plan, k, src, dst, read=False
            ),
            "16_threads_own_streams_events": functools.partial(
                run_pass, dev, plan, replace(k, per_thread_streams=True), src, dst, read=False
            ),
        }
        for mode, fn in modes.items():
            r = measure(fn, shards.nbytes)
            runs.append({"mode": mode, "chunk_mib": chunk_mib} | r)
            log(f"  copy {mode} {chunk_mib} MiB: {r['gbps']} GB/s")
    e["runs"] = runs
    e["best_gbps"] = max(x["median_gbps"] for x in runs)
    e["best_single_stream_gbps"] = max(
        x["median_gbps"] for x in runs if x["mode"] == "one_thread_one_stream"
    )


def pipeline_section(
    dev: Dev, shards: Shards, staging: Staging, report: gb.Report, e: dict[str, Any]
) -> None:
    dst = dev.empty(shards.nbytes)
    started = time.perf_counter()
    results: dict[Knobs, dict[str, Any]] = {}
    e["variants"] = []

    def out_of_time() -> bool:
        # ~120 s for the section, and thaw_streamer still has time after it.
        return time.perf_counter() - started > 110 or report.remaining() < 40

    def run(k: Knobs) -> None:
        if k in results or out_of_time():
            return
        plan = shards.chunks(k.chunk_mib * MiB)
        src = staging.get(min(k.threads, len(plan)) * k.slots * k.chunk_mib * MiB)
        r = measure(functools.partial(run_pass, dev, plan, k, src, dst, read=True), shards.nbytes)
        results[k] = r
        e["variants"].append(asdict(k) | r)
        log(f"  pipeline {asdict(k)}: {r['gbps']} GB/s, {r['cpu_cores_busy']} cores")

    base = Knobs()
    warm = staging.get(base.threads * base.slots * base.chunk_mib * MiB)
    run_pass(dev, shards.chunks(32 * MiB), base, warm, dst, read=True)  # streams, threads
    one_factor = [
        base,
        *(replace(base, threads=t) for t in (8, 24, 32)),
        *(replace(base, slots=s) for s in (3, 4)),
        replace(base, chunk_mib=16),
    ]
    for k in one_factor + [replace(k, per_thread_streams=True) for k in one_factor]:
        run(k)
    for k in (
        replace(base, dispatch="executor"),
        replace(base, dispatch="executor", chunk_mib=16),
        # 8 MiB: 4x the chunks of the default, where a per-chunk cost shows most.
        replace(base, chunk_mib=8),
        replace(base, dispatch="executor", chunk_mib=8),
        replace(base, spin_events=True),
    ):
        run(k)
    # Best value of each factor (others at the baseline, best stream mode), then combined.
    mode = max(results, key=lambda k: results[k]["median_gbps"]).per_thread_streams
    like = replace(base, per_thread_streams=mode)

    def best(field: str) -> Any:
        rows = [k for k in results if replace(k, **{field: getattr(like, field)}) == like]
        return getattr(max(rows, key=lambda k: results[k]["median_gbps"]), field)

    top = replace(like, threads=best("threads"), slots=best("slots"))
    for chunk_mib, streams in itertools.product((16, 32), (False, True)):
        run(replace(top, chunk_mib=chunk_mib, per_thread_streams=streams))
    k_best = max(results, key=lambda k: results[k]["median_gbps"])
    e["best"] = asdict(k_best) | {"median_gbps": results[k_best]["median_gbps"]}
    e["baseline"] = results[base]
    e["executor_vs_iterator"] = {
        f"{mib}_mib": round(results[x]["median_gbps"] / results[i]["median_gbps"], 3)
        for mib in (8, 16, 32)
        if (x := replace(base, chunk_mib=mib, dispatch="executor")) in results
        and (i := replace(base, chunk_mib=mib)) in results
    }
    e["stopped_for_time"] = out_of_time()


def thaw_section(
    dev: Dev, streamer: types.ModuleType, paths: list[Path], e: dict[str, Any]
) -> None:
    e.update(ceiling(dev, 4 * GiB if dev.cuda else 256 * MiB))
    gb.free_device(dev.device)
    runs = [gb.thaw_load(streamer, paths, dev.device, 32 * MiB, 16) for _ in range(3)]
    e.update(
        chunk_mib=32,
        concurrency=16,
        gbps=[round(r[1], 2) for r in runs],
        median_gbps=round(med([r[1] for r in runs]), 2),
        median_s=round(med([r[0] for r in runs]), 4),
    )
    e["vs_ceiling"] = round(e["median_gbps"] / e["ceiling_gbps"], 3)
    e["inside_one_load"] = timed_load(streamer, paths, dev)


def executor_run_pool(
    reader: Any,
    chunks: Any,
    threads: int,
    progress: Any,
    on_abort: Callable[[], None] | None = None,
) -> None:
    """The streamer's ``_run_pool`` before it took chunks from a shared iterator (every
    chunk submitted to an executor, then ``wait(FIRST_COMPLETED)`` in a loop), kept here
    to measure the change against it in one run."""
    if not chunks:
        return
    stop = threading.Event()

    def task(chunk: Any) -> int:
        if stop.is_set():
            return 0
        try:
            reader.read(chunk)
        except BaseException:
            stop.set()
            raise
        return int(chunk.length)

    with ThreadPoolExecutor(max_workers=threads, initializer=reader.init_thread) as pool:
        pending = {pool.submit(task, c) for c in chunks}
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    fut.result()
        except BaseException:
            stop.set()
            for fut in pending:
                fut.cancel()
            if on_abort is not None:
                on_abort()
            raise


def dispatch_section(dev: Dev, streamer: Any, paths: list[Path], e: dict[str, Any]) -> None:
    """``load_many`` with its own dispatch against the executor one it replaced,
    alternating, 3 reps each, at 8, 16 and 32 MiB chunks and 16 threads."""
    current = streamer._run_pool
    for mib in (8, 16, 32):
        got: dict[str, list[float]] = {"iterator": [], "executor": []}
        for _ in range(3):
            for name, pool in (("iterator", current), ("executor", executor_run_pool)):
                streamer._run_pool = pool
                try:
                    got[name].append(gb.thaw_load(streamer, paths, dev.device, mib * MiB, 16)[1])
                finally:
                    streamer._run_pool = current
                gb.free_device(dev.device)
        m = {k: round(med(v), 2) for k, v in got.items()}
        e[f"{mib}_mib"] = {"gbps": {k: [round(x, 2) for x in v] for k, v in got.items()},
                           "median_gbps": m, "iterator_over_executor": round(m["iterator"] / m["executor"], 3)}
        log(f"  load_many {mib} MiB: iterator {m['iterator']} GB/s, executor {m['executor']} GB/s")


def worker_path_section(dev: Dev, streamer: Any, paths: list[Path], e: dict[str, Any]) -> None:
    """What a cold start on a GPU worker does today, against ``load_many`` straight to the
    device: Thaw's vLLM loader streams the files into fresh host memory
    (``load_many(device="cpu")``), then vLLM's ``load_weights`` copies each tensor into
    its parameter on the device (``param.copy_``, from pageable memory). The parameters
    are allocated once beforehand, as the engine has them. 2 reps each, 32 MiB x 16."""
    first = streamer.load_many(paths, device="cpu", chunk_bytes=32 * MiB, concurrency=16)
    params = {k: torch.empty_like(t, device=dev.device) for k, t in first.tensors.items()}
    nbytes = first.stats.bytes
    del first
    runs = []
    for _ in range(2):
        dev.sync()
        t0 = time.perf_counter()
        res = streamer.load_many(paths, device="cpu", chunk_bytes=32 * MiB, concurrency=16)
        t1 = time.perf_counter()
        for name, t in res.tensors.items():
            params[name].copy_(t)
        dev.sync()
        t2 = time.perf_counter()
        del res
        runs.append({"stream_to_host_s": round(t1 - t0, 3), "copy_to_device_s": round(t2 - t1, 3),
                     "total_s": round(t2 - t0, 3), "gbps": round(nbytes / (t2 - t0) / GB, 2)})
    del params
    gb.free_device(dev.device)
    direct = [gb.thaw_load(streamer, paths, dev.device, 32 * MiB, 16) for _ in range(2)]
    e.update(bytes=nbytes, as_the_worker_does=runs,
             direct_to_device_s=[round(d[0], 3) for d in direct],
             direct_to_device_gbps=[round(d[1], 2) for d in direct])
    worker_s, direct_s = med([r["total_s"] for r in runs]), med([d[0] for d in direct])
    e["worker_over_direct_time"] = round(worker_s / direct_s, 2)
    log(f"  as the worker does: {runs}; straight to the device: {e['direct_to_device_gbps']} GB/s")


def ceiling(dev: Dev, n: int) -> dict[str, Any]:
    """One plain pinned -> device copy of ``n`` bytes, median of 3."""
    src, pin_s = timed(lambda: dev.pinned(n), dev)
    dst, stream = dev.empty(n), dev.stream()
    secs = [timed(lambda: dev.copy(dst, src, stream), dev)[1] for _ in range(3)]
    return {
        "ceiling_pin_s": pin_s,
        "ceiling_bytes": n,
        "ceiling_gbps": round(n / med(secs) / GB, 2),
    }


def timed_load(streamer: Any, paths: list[Path], dev: Dev) -> dict[str, float]:
    """One ``load_many`` with its allocations and reader pool timed from inside (the
    module's ``_cuda`` shim and ``_run_pool`` are looked up at call time)."""
    times = {"device_alloc_s": 0.0, "pin_staging_s": 0.0, "reader_pool_s": 0.0}

    def clocked(fn: Callable[..., Any], key: str) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                times[key] += time.perf_counter() - t

        return wrapper

    cuda, orig_pool = streamer._cuda, streamer._run_pool
    # Instance attributes shadow the shim's methods until deleted.
    cuda.empty = clocked(cuda.empty, "device_alloc_s")
    cuda.empty_pinned = clocked(cuda.empty_pinned, "pin_staging_s")
    streamer._run_pool = clocked(orig_pool, "reader_pool_s")
    try:
        dt, gbps, _ = gb.thaw_load(streamer, paths, dev.device, 32 * MiB, 16)
    finally:
        del cuda.empty, cuda.empty_pinned
        streamer._run_pool = orig_pool
    out = {k: round(v, 4) for k, v in times.items()}
    out |= {"total_s": round(dt, 4), "gbps": round(gbps, 2)}
    out["rest_s"] = round(dt - sum(times.values()), 4)  # headers, plan, finish, views, sync
    return out


def summary(S: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def put(name: str, fn: Callable[[], Any]) -> None:
        with contextlib.suppress(Exception):
            v = fn()
            out[name] = round(v, 3) if isinstance(v, float) else v

    host, copy = S.get("host_read_only", {}), S.get("device_copy_only", {})
    pipe, thaw = S.get("pipeline_variants", {}), S.get("thaw_streamer", {})
    put("host_read_only_best_gbps", lambda: host["best_pinned_gbps"])
    put("device_copy_only_best_gbps", lambda: copy["best_gbps"])
    put("device_copy_single_stream_best_gbps", lambda: copy["best_single_stream_gbps"])
    put("pipeline_best", lambda: pipe["best"])
    put("pipeline_baseline_gbps", lambda: pipe["baseline"]["median_gbps"])
    put("pipeline_baseline_thread_time_share", lambda: pipe["baseline"]["thread_time_share"])
    put("pipeline_executor_vs_iterator", lambda: pipe["executor_vs_iterator"])
    put("thaw_streamer_gbps", lambda: thaw["median_gbps"])
    put("ceiling_gbps", lambda: thaw["ceiling_gbps"])
    put("bound_gbps", lambda: min(host["best_pinned_gbps"], copy["best_gbps"]))
    put("bound_side", lambda: "host" if host["best_pinned_gbps"] < copy["best_gbps"] else "device")
    put("thaw_vs_ceiling", lambda: thaw["median_gbps"] / thaw["ceiling_gbps"])
    put("thaw_vs_single_stream", lambda: thaw["median_gbps"] / copy["best_single_stream_gbps"])
    put("thaw_vs_bound", lambda: thaw["median_gbps"] / out["bound_gbps"])
    put("pipeline_best_vs_bound", lambda: pipe["best"]["median_gbps"] / out["bound_gbps"])
    put("thaw_vs_pipeline_baseline", lambda: thaw["median_gbps"] / pipe["baseline"]["median_gbps"])
    put("thaw_vs_pipeline_best", lambda: thaw["median_gbps"] / pipe["best"]["median_gbps"])
    put(
        "thaw_alloc_share_of_load",
        lambda: (
            (thaw["inside_one_load"]["device_alloc_s"] + thaw["inside_one_load"]["pin_staging_s"])
            / thaw["inside_one_load"]["total_s"]
        ),
    )
    return out


# --- main ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, default=Path("stream_breakdown.json"))
    p.add_argument("--dir", type=Path, default=Path("/tmp/thaw_bench_model"))
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--size-gb", type=float, default=16.1, help="16.1 = Llama-3-8B bf16")
    p.add_argument("--budget-s", type=float, default=420.0, help="skip optional sections past this")
    return p.parse_args(argv)


@contextlib.contextmanager
def section(
    report: gb.Report, dev: Dev, name: str, min_remaining_s: float = 0.0
) -> Iterator[dict[str, Any] | None]:
    with report.section(name, min_remaining_s=min_remaining_s) as e:
        yield e
    # The section's tensors died with its function's frame. A device error here would
    # stop the run; it shows again, recorded, in the next section.
    with contextlib.suppress(Exception):
        gb.free_device(dev.device)


def need(x: T | None, what: str) -> T:
    if x is None:
        raise RuntimeError(f"needs {what}, which an earlier section failed to provide")
    return x


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    dev = Dev(device)
    report = gb.Report(args.out, args.budget_s)
    report.data["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    cfg = gb.config_for_size(args.size_gb)
    staging = Staging(dev)
    report.data["staging_pins"] = staging.pins  # the same list: each write shows pins so far
    S = report.data["sections"]
    shards: Shards | None = None
    log(f"device={device} size_gb={args.size_gb} out={args.out}")

    with section(report, dev, "environment") as e:
        assert e is not None
        if dev.cuda and not torch.cuda.is_available():
            raise RuntimeError("CUDA requested but torch.cuda.is_available() is False")
        e.update(gb.environment(device, args.dir))
        if dev.cuda:
            e["cuda_init_s"] = timed(lambda: torch.empty(1, device=device), dev)[1]
    with section(report, dev, "model") as e:
        assert e is not None
        shards = model_section(cfg, args, dev, e)
        log(f"model {shards.nbytes / GB:.2f} GB, first read {e['first_read_gbps']} GB/s")
    with section(report, dev, "alloc") as e:
        assert e is not None
        alloc_section(dev, need(shards, "the model"), e)
    with section(report, dev, "host_read_only", min_remaining_s=30) as e:
        if e is not None:
            host_read_section(dev, need(shards, "the model"), staging, e)
    with section(report, dev, "device_copy_only", min_remaining_s=30) as e:
        if e is not None:
            device_copy_section(dev, need(shards, "the model"), staging, e)
    with section(report, dev, "pipeline_variants", min_remaining_s=60) as e:
        if e is not None:
            pipeline_section(dev, need(shards, "the model"), staging, report, e)
    with section(report, dev, "thaw_streamer") as e:
        assert e is not None
        streamer = gb.import_streamer()
        thaw_section(dev, streamer, need(shards, "the model").paths, e)
        log(f"thaw {e['gbps']} GB/s, ceiling {e['ceiling_gbps']} GB/s")
    with section(report, dev, "dispatch_before_after", min_remaining_s=40) as e:
        if e is not None:
            dispatch_section(dev, gb.import_streamer(), need(shards, "the model").paths, e)
    with section(report, dev, "worker_path", min_remaining_s=40) as e:
        if e is not None:
            worker_path_section(dev, gb.import_streamer(), need(shards, "the model").paths, e)
    with section(report, dev, "summary") as e:
        assert e is not None
        e.update(summary(S))
        log(f"summary: {json.dumps(e)}")
    if shards is not None:
        shards.close()
    report.write()
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    rc = main()
    # A driver call stuck in a daemon thread must not keep the process alive.
    os._exit(rc)
