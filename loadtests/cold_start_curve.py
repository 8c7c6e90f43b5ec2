"""How a cold start grows with the weights: the size curve of ``thaw bench cold-start --sizes``.

Two parts:

- **the physical reference**, measured on this machine beside each size
  (:func:`copy_reference`): the model's bytes copied into memory already mapped (the
  best a load that writes into an engine's existing tensors could do) and into fresh
  pages (what a load into newly allocated memory pays: every 4 KiB page faults on its
  first write). Each is the best of a sweep over thread counts, so it is the
  machine's, not our code's. For the tiers that read the store, the store's ceiling
  (:func:`store_ceiling`): the same bytes read with plain ranged GETs, the best of a
  sweep over chunk size and concurrency;
- **the lines** (:func:`fit_line`, :func:`curve`): per tier, a least-squares line
  ``seconds = fixed_s + s_per_gb * GB`` over the sizes, for the time to first token
  and for the weights alone (the loader's time; a swap's weights step), with each
  point's residual, the bandwidth the slope implies, and that bandwidth over the
  reference's. :func:`extrapolate` prolongs a line to real model sizes, labelled as
  such: nothing at those sizes was run here.

Pure but for :func:`copy_reference` (torch, memory), :func:`store_ceiling` (the store) and
:func:`plot_curve` (matplotlib).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

GB = 1e9
# Real models' weights in bf16 (2 bytes a parameter), for the extrapolated column.
MODEL_BYTES = {"8B": 16.06e9, "70B": 141.1e9, "405B": 810.0e9}
# A tier's metrics, each a key of a variant's summary: time to first token, and the
# weights alone (the loader's time, or for a swap its weights step in the engine host).
METRICS = {"ttft": "median_ttft_s", "weights": "median_weights_s"}
# The references a line's bandwidth is put over (a size's ``reference`` has ``<key>_gbps``
# for each measured): the copy into mapped memory, into fresh pages, the store's GETs.
REFERENCES = {"mapped": "mapped_copy", "fresh": "fresh_copy", "store": "store_ceiling"}


# --- the reference ------------------------------------------------------------------------


def copy_reference(nbytes: int, *, reps: int = 3, threads: Sequence[int] | None = None) -> dict[str, Any]:
    """GB/s of copying ``nbytes`` into mapped memory and into fresh pages on this
    machine, each the best of ``reps`` at each thread count (default 1 and every core),
    with the thread count that gave it. Holds two (fresh: up to three) copies of
    ``nbytes`` while it runs."""
    import torch

    counts = sorted(set(threads or (1, os.cpu_count() or 1)))
    before = torch.get_num_threads()
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)  # every page written once: mapped
    best = {"mapped": (0.0, 0), "fresh": (0.0, 0)}
    try:
        for n in counts:
            torch.set_num_threads(n)
            for _ in range(reps):
                t0 = time.perf_counter()
                dst.copy_(src)
                _keep_best(best, "mapped", nbytes / (time.perf_counter() - t0) / GB, n)
                t0 = time.perf_counter()
                fresh = torch.empty(nbytes, dtype=torch.uint8)
                fresh.copy_(src)
                _keep_best(best, "fresh", nbytes / (time.perf_counter() - t0) / GB, n)
                del fresh
    finally:
        torch.set_num_threads(before)
    return {"bytes": nbytes, "reps": reps, "threads_swept": counts,
            "mapped_gbps": round(best["mapped"][0], 3), "mapped_threads": best["mapped"][1],
            "fresh_gbps": round(best["fresh"][0], 3), "fresh_threads": best["fresh"][1]}


def _keep_best(best: dict[str, tuple[float, int]], key: str, gbps: float, threads: int) -> None:
    if gbps > best[key][0]:
        best[key] = (gbps, threads)


# The store's grid: chunk MiB x GETs in flight (Thaw's own setting, 16 MiB x 8, among them).
STORE_CHUNKS_MIB = (16, 64)
STORE_CONCURRENCY = (4, 8, 16)


def store_ceiling(endpoint: Any, uri: str, *, chunks_mib: Sequence[int] = STORE_CHUNKS_MIB,
                  concurrency: Sequence[int] = STORE_CONCURRENCY, reps: int = 2) -> dict[str, Any]:
    """GB/s the store delivers to one process: every byte of the model's safetensors
    objects at ``uri`` read with plain parallel ranged GETs into buffers faulted in
    beforehand and discarded (``loadtests.bench_stream.read_all_ranged``: no parsing, no
    checks, no tensors), at each chunk size x concurrency, after one untimed read that
    leaves the objects as warm in the store's page cache as a tier's load finds them.
    Each point's figure is the median of ``reps``; the ceiling is the best point's.
    Holds the largest point's buffers (concurrency x chunk) while it runs."""
    from loadtests.bench_stream import (
        arena_bytes,
        ceiling_grid,
        prefaulted,
        read_all_ranged,
        summarize_grid,
    )
    from weight_streaming.s3_loader import resolve_objects

    grid = ceiling_grid(chunks_mib, concurrency)
    clients = {n: endpoint.client(max_pool_connections=n, response_checksum_validation="when_required",
                                  request_checksum_calculation="when_required") for n in sorted(set(concurrency))}
    top = max(clients)
    objects = resolve_objects(clients[top], uri)
    total = sum(o.size for o in objects)
    arena = prefaulted(max(arena_bytes([o.size for o in objects], p.chunk_bytes, p.concurrency) for p in grid))
    read_all_ranged(clients[top], objects, grid[-1].chunk_bytes, top, arena=arena)  # warm, untimed
    seconds: dict[Any, list[float]] = {p: [] for p in grid}
    for _ in range(reps):
        for p in grid:
            r = read_all_ranged(clients[p.concurrency], objects, p.chunk_bytes, p.concurrency, arena=arena)
            if r.bytes != total:
                raise RuntimeError(f"the store's GETs read {r.bytes} of {total} bytes at {p}")
            seconds[p].append(r.seconds)
    summary = summarize_grid(total, seconds)
    grid_rows = [{"chunk_mib": r["chunk_mib"], "concurrency": r["concurrency"],
                  "gbps": round(total / r["seconds_median"] / GB, 3)} for r in summary["grid"]]
    best = max(grid_rows, key=lambda r: r["gbps"])
    return {"bytes": total, "reps": reps, "store_gbps": best["gbps"],
            "store_best": {"chunk_mib": best["chunk_mib"], "concurrency": best["concurrency"]},
            "store_grid": grid_rows}


# --- the lines (pure) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """``seconds = fixed_s + s_per_gb * GB``, least squares over ``points``."""

    fixed_s: float
    s_per_gb: float
    # (GB, measured seconds, residual over the measured: (fit - measured) / measured).
    points: tuple[tuple[float, float, float], ...]

    @property
    def gbps(self) -> float | None:
        """The bandwidth the slope implies (None: no cost per byte was measured)."""
        return 1 / self.s_per_gb if self.s_per_gb > 0 else None

    @property
    def max_residual(self) -> float:
        return max((abs(r) for _, _, r in self.points), default=0.0)

    def at(self, gb: float) -> float:
        return self.fixed_s + self.s_per_gb * gb

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["points"] = [{"gb": round(x, 4), "seconds": y, "residual": round(r, 4)} for x, y, r in self.points]
        d["fixed_s"], d["s_per_gb"] = round(self.fixed_s, 4), round(self.s_per_gb, 4)
        d["gbps"] = None if self.gbps is None else round(self.gbps, 3)
        d["max_residual"] = round(self.max_residual, 4)
        return d


def fit_line(points: Sequence[tuple[float, float]]) -> Line | None:
    """The least-squares line through ``(GB, seconds)`` points at two sizes or more
    (None with fewer)."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None
    n = len(points)
    mx = sum(xs) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    fixed = my - slope * mx
    return Line(fixed, slope, tuple((x, y, (fixed + slope * x - y) / y if y else math.inf) for x, y in points))


def curve(sizes: Sequence[Mapping[str, Any]], rows: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The size curve from one report per size (each with ``size_bytes``, ``reference``
    and ``variants``), for the tiers ``rows`` names (tier -> the variant measuring it).

    Per tier and metric (``METRICS``): the points, the line (with two sizes or more),
    its bandwidth over the reference's copy into mapped memory and into fresh pages,
    and the line extrapolated to real model sizes.
    """
    ref = {k: fit_line([(s["size_bytes"] / GB, s["size_bytes"] / GB / s["reference"][f"{k}_gbps"])
                        for s in sizes if (s.get("reference") or {}).get(f"{k}_gbps")]) for k in REFERENCES}
    ref_gbps = {k: _gbps(line, sizes, k) for k, line in ref.items()}
    tiers: dict[str, Any] = {}
    for tier, variant in rows:
        out: dict[str, Any] = {"variant": variant}
        for metric, key in METRICS.items():
            pts = [(s["size_bytes"] / GB, float(v[key])) for s in sizes
                   if (v := s["variants"].get(variant)) and v.get(key) is not None]
            if not pts:
                continue
            line = fit_line(pts)
            m: dict[str, Any] = {"points": [{"gb": round(x, 4), "seconds": y} for x, y in pts]}
            if line is not None:
                m["line"] = line.to_json()
                for k, g in ref_gbps.items():
                    if g is not None:
                        m[f"gbps_over_{REFERENCES[k]}"] = None if line.gbps is None else round(line.gbps / g, 4)
                m["extrapolated"] = extrapolate(line)
            out[metric] = m
        if len(out) > 1:
            tiers[tier] = out
    return {"reference": {k: {"gbps": None if g is None else round(g, 3),
                              "line": None if (r := ref[k]) is None else r.to_json()} for k, g in ref_gbps.items()},
            "tiers": tiers,
            "extrapolated_note": "prolonged from the lines measured on this machine (CPU, sizes above); "
                                 "nothing at these sizes was run"}


def _gbps(line: Line | None, sizes: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """The reference's bandwidth: its line's slope, or with one size its measured rate."""
    if line is not None and line.gbps is not None:
        return line.gbps
    rates = [r for s in sizes if (r := (s.get("reference") or {}).get(f"{key}_gbps"))]
    return sum(rates) / len(rates) if rates else None


def extrapolate(line: Line, models: Mapping[str, float] = MODEL_BYTES) -> dict[str, float]:
    """Seconds the line gives at each real model's weight size (labelled extrapolated)."""
    return {name: round(line.at(nbytes / GB), 2) for name, nbytes in models.items()}


def plot_curve(report: Mapping[str, Any], path: Path) -> None:
    """Time to first token and the weights' time against GB, one fitted line per tier
    (log seconds), measured points marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, metric, title in ((axes[0], "ttft", "request -> first token"),
                              (axes[1], "weights", "the weights alone (loader / swap step)")):
        for tier, t in report["curve"]["tiers"].items():
            m = t.get(metric)
            if not m:
                continue
            xs = [p["gb"] for p in m["points"]]
            (dots,) = ax.plot(xs, [p["seconds"] for p in m["points"]], "o", label=tier)
            if "line" in m:
                # Many points: on the log axis the straight line bends.
                f, hi = m["line"], max(xs) * 1.05
                line = [(x, f["fixed_s"] + f["s_per_gb"] * x) for x in (hi * i / 60 for i in range(61))]
                ax.plot([x for x, y in line if y > 0], [y for _, y in line if y > 0], "-",
                        color=dots.get_color(), linewidth=1)
        ax.set_xlabel("model weights (GB)")
        ax.set_ylabel("seconds")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
