"""`thaw simulate --compare-packing`: one trace, one model per instance against several
engines per instance (``pools[].pack``), side by side.

Both runs take the config as it is, every pool's ``pack`` set off in one and on in the
other (and, with ``--gpu-memory-utilization``, every model's engine share set in both,
so that several engines fit on one GPU). Everything else, the cost model included, is
the same; the figures that differ are the ones packing changes: instance-hours and
their cost, cold starts by tier ("packed": a start beside another model's engine on a
worker already up, with no boot and no standby taken) and the TTFT they give.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from simulator.gen_cli import fail
from simulator.run import Inputs, simulate
from simulator.sim import engine_sizes, tier_order
from simulator.sweep import trace_info
from thaw.config import ThawConfig
from thaw.exits import EXIT_INVALID, EXIT_OK
from thaw.fit import engine_capacity
from thaw.units import GiB

# The two runs, in the order they are printed.
RUNS = ("one_per_instance", "packed")
_HEADERS = {"one_per_instance": "one per instance", "packed": "packed"}


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    """`thaw simulate`'s packing comparison (the run's inputs and ``--out-dir`` are its own)."""
    p.add_argument("--compare-packing", action="store_true",
                   help="run the trace twice, every pool with pack: false (one model per instance) and with "
                        "pack: true (several engines per instance), and print them side by side; writes "
                        "compare-packing.json into --out-dir, or to --out-dir itself when it ends in .json")
    p.add_argument("--gpu-memory-utilization", metavar="F", type=_share, default=None,
                   help="with --compare-packing: every model's engine.gpu_memory_utilization in both runs "
                        "(its engine's share of a GPU: 0.45 fits two on one GPU; default: the config's)")


def _share(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is a share of the GPU's memory: above 0, at most 1")
    return v


def packing_variants(cfg: ThawConfig, gpu_memory_utilization: float | None = None) -> tuple[ThawConfig, ThawConfig]:
    """``cfg`` with every pool's ``pack`` off, and on; with ``gpu_memory_utilization``,
    every model's engine share set to it in both. Raises :class:`ValueError` for a pool
    that pre-builds engines (``pack`` and ``prebuild`` do not go together yet)."""
    prebuilding = [p.shape for p in cfg.pools if p.prebuild]
    if prebuilding:
        raise ValueError(f"pools {prebuilding} pre-build engines (prebuild), which pack does not support yet: "
                         "remove prebuild from the config to compare packing")
    if gpu_memory_utilization is not None:
        cfg = cfg.model_copy(update={"models": [
            m.model_copy(update={"engine": m.engine.model_copy(
                update={"gpu_memory_utilization": gpu_memory_utilization})}) for m in cfg.models]})
    off, on = ({"pools": [p.model_copy(update={"pack": pack}) for p in cfg.pools]} for pack in (False, True))
    return cfg.model_copy(update=off), cfg.model_copy(update=on)


def fit_notes(cfg: ThawConfig, inputs: Inputs) -> list[str]:
    """How many engines fit on an instance of each packing pool, and a warning for
    models whose weights leave their engine no room for a KV cache (``thaw config
    check`` refuses those; the policy would pack them all the same)."""
    sizes = engine_sizes(cfg, inputs.costs)
    shapes = {s.name: s for s in cfg.shapes}
    notes = []
    for pool in cfg.pools:
        shape = shapes[pool.shape]
        cap = engine_capacity(shape)
        per_size: dict[int, int] = {}
        for m in cfg.models:
            if m.shape == pool.shape and m.name in sizes:
                per_size[sizes[m.name]] = per_size.get(sizes[m.name], 0) + 1
        engines = "; ".join(f"{n} model(s) of {size / GiB:.1f} GiB: {cap // size if size else 0} per instance"
                            for size, n in sorted(per_size.items()))
        notes.append(f"packing {pool.shape}: {cap / GiB:.1f} GiB per instance; {engines or 'no models'}")
        if shape.gpu_count > 0:
            tight = [m.name for m in cfg.models
                     if m.name in sizes and m.shape == pool.shape
                     and inputs.costs.models[m.name].weights_gib * GiB >= sizes[m.name]]
            if tight:
                notes.append(f"warning: {len(tight)} model(s) ({', '.join(tight[:3])}{', ...' if len(tight) > 3 else ''}) "
                             "have weights as large as their engine's share of the GPU: no room for a KV cache "
                             "(raise --gpu-memory-utilization)")
    return notes


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_comparison(summaries: dict[str, dict[str, Any]]) -> str:
    """The two runs' figures side by side, one row per figure."""
    a, b = (summaries[k] for k in RUNS)
    rows: list[tuple[str, str, str]] = [("", _HEADERS[RUNS[0]], _HEADERS[RUNS[1]])]

    def add(label: str, f: Any) -> None:
        rows.append((label, f(a), f(b)))

    add("instance-hours", lambda s: f"{s['instance_seconds'] / 3600:.2f}")
    add("replica-hours", lambda s: f"{s['replica_seconds'] / 3600:.2f}")
    add("cost (USD)", lambda s: f"{s['usd']:.2f}")
    add("requests", lambda s: str(s["requests"]))
    add("cold-start share", lambda s: f"{s['cold_start_share']:.2%}")
    add("TTFT p50 (s)", lambda s: _fmt(s["ttft_s"]["p50"], ".2f"))
    add("TTFT p90 (s)", lambda s: _fmt(s["ttft_s"]["p90"], ".2f"))
    add("TTFT p99 (s)", lambda s: _fmt(s["ttft_s"]["p99"], ".2f"))
    add("activation timeouts", lambda s: str(s["activation_timeouts"]))
    add("cold starts", lambda s: str(s["cold_starts"]))
    tiers = sorted(set(a["cold_starts_by_tier"]) | set(b["cold_starts_by_tier"]), key=tier_order)
    for tier in tiers:
        add(f"  {tier}", lambda s, tier=tier: str(s["cold_starts_by_tier"].get(tier, 0)))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0].ljust(widths[0])}  {r[1].rjust(widths[1])}  {r[2].rjust(widths[2])}".rstrip()
                     for r in rows)


def out_file(out: Path) -> Path:
    """``--out-dir``: a ``.json`` file itself, else the directory it goes in."""
    return out if out.suffix == ".json" else out / "compare-packing.json"


def run_compare(args: argparse.Namespace, inputs: Inputs) -> int:
    """`thaw simulate --compare-packing`: the table on stdout, both runs' results in JSON."""
    try:
        variants = dict(zip(RUNS, packing_variants(inputs.cfg, args.gpu_memory_utilization), strict=True))
    except ValueError as exc:
        return fail(str(exc), EXIT_INVALID)
    for note in fit_notes(variants["packed"], inputs):
        print(note, file=sys.stderr)
    t0 = time.perf_counter()
    runs: dict[str, dict[str, Any]] = {}
    for name, cfg in variants.items():
        result, wall_s = simulate(inputs, cfg=cfg, exact=args.exact)
        runs[name] = {"pack": name == "packed", "wall_s": round(wall_s, 3), "ticks": result.ticks,
                      "simulated_s": result.end_s, "summary": result.summary}
    wall_s = time.perf_counter() - t0
    packed = variants["packed"]
    doc = {
        "command": "thaw simulate --compare-packing", "config": str(args.config), "model_template": args.model_template,
        "seed": args.seed, "exact": args.exact, "gpu_memory_utilization": args.gpu_memory_utilization,
        "trace": trace_info(inputs, args.trace), "tick_s": inputs.tick_s, "ttft_slo_s": inputs.ttft_slo_s,
        # What the packed run's policy was told: each model's engine and each shape's room.
        "engine_bytes": engine_sizes(packed, inputs.costs),
        "capacity_bytes": {p.shape: engine_capacity(s) for p in packed.pools
                           for s in packed.shapes if s.name == p.shape},
        "runs": runs,
    }
    path = out_file(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(format_comparison({k: r["summary"] for k, r in runs.items()}), flush=True)
    print(f"2 runs of {len(inputs.whole):,} requests in {wall_s:.1f} s; wrote {path}", file=sys.stderr)
    return EXIT_OK
