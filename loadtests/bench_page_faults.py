"""`thaw bench page-faults`: what first-touching fresh host memory costs a load, and
what each way around it saves.

    thaw bench page-faults --out bench_page_faults.json [--size 1GiB] [--reps 3]

A load writes the weights into host memory. Where that memory is fresh, the first
write to each page is a page fault (the kernel maps and zeroes it): the cost that keeps
the streamer below the store's ceiling on a CPU-bound machine (docs/BENCHMARKS.md). This
benchmark writes ``--size`` bytes in 16 MiB copies (the streamer's chunk) into memory
obtained four ways, reps interleaved, and reports wall time, CPU time and faults for the
allocation and the writes together:

- ``fresh``: ``torch.empty`` (what a load allocates): 4 KiB pages faulted by the writes;
- ``huge_pages``: an anonymous mapping with ``MADV_HUGEPAGE`` (transparent huge pages:
  one fault per 2 MiB, but the kernel must find or assemble each 2 MiB page);
- ``populate``: an anonymous mapping with ``MAP_POPULATE`` (every page faulted in by the
  kernel at once, before the writes);
- ``reused``: memory faulted in before the run (``HostBufferPool.reserve``, what a
  standby could hold): the writes alone, the floor.

One process, one core. Writes the medians, every rep and the machine's THP settings as
JSON.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from thaw.units import MiB, parse_size_bytes

CHUNK = 16 * MiB
METHODS = ("fresh", "huge_pages", "populate", "reused")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="FILE", type=Path, default=Path("bench_page_faults.json"))
    p.add_argument("--size", type=parse_size_bytes, default=parse_size_bytes("1GiB"), help="bytes written per rep (default 1GiB)")
    p.add_argument("--reps", type=int, default=3)


def _thp() -> dict[str, str]:
    out = {}
    for name in ("enabled", "defrag"):
        try:
            out[name] = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text().strip()
        except OSError:
            out[name] = "unknown"
    return out


def _mapping(nbytes: int, *, populate: bool = False, huge: bool = False) -> Any:
    import torch

    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (mmap.MAP_POPULATE if populate else 0)
    m = mmap.mmap(-1, nbytes, flags=flags)
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(m, dtype=torch.uint8)


def _one(make: Callable[[], Any], nbytes: int, src: Any) -> dict[str, float]:
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    dst = make()
    for off in range(0, nbytes, CHUNK):
        n = min(CHUNK, nbytes - off)
        dst[off : off + n].copy_(src[:n])
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    del dst
    return {"wall_s": round(wall, 4), "gib_per_s": round(nbytes / (1 << 30) / wall, 3),
            "cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 4),
            "kernel_cpu_s": round(r1.ru_stime - r0.ru_stime, 4), "faults": r1.ru_minflt - r0.ru_minflt}


def run(args: argparse.Namespace) -> int:
    import torch

    from weight_streaming.host_pool import HostBufferPool

    nbytes = int(args.size)
    src = torch.ones(CHUNK, dtype=torch.uint8)
    pool = HostBufferPool()
    pool.reserve(nbytes)
    makers: dict[str, Callable[[], Any]] = {
        "fresh": lambda: torch.empty(nbytes, dtype=torch.uint8),
        "huge_pages": lambda: _mapping(nbytes, huge=True),
        "populate": lambda: _mapping(nbytes, populate=True),
        "reused": lambda: pool.take_many([nbytes])[0],
    }
    reps: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    for _ in range(args.reps):
        for m in METHODS:
            reps[m].append(_one(makers[m], nbytes, src))
    medians = {m: {k: statistics.median(r[k] for r in reps[m]) for k in reps[m][0]} for m in METHODS}
    fresh = medians["fresh"]["wall_s"]
    vs_fresh = {m: round(medians[m]["wall_s"] / fresh, 3) for m in METHODS}
    out: dict[str, Any] = {
        "bytes": nbytes,
        "chunk_bytes": CHUNK,
        "medians": medians,
        "wall_vs_fresh": vs_fresh,
        "reps": reps,
        "transparent_hugepage": _thp(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for m in METHODS:
        x = medians[m]
        print(f"{m:10s} {x['gib_per_s']:.2f} GiB/s  cpu {x['cpu_s']:.2f} s (kernel {x['kernel_cpu_s']:.2f})  "
              f"faults {x['faults']:,.0f}  wall x{vs_fresh[m]:.2f} of fresh")
    print(f"wrote {args.out}")
    return 0
