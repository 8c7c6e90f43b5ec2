"""`thaw bench simulate`: how fast the simulator replays a long, many-model trace.

    thaw bench simulate --out bench_simulate.json [--models 100] [--days 21] [--rate-per-hour 20]

Draws a synthetic trace (``simulator.generate.diurnal``: many low-traffic models whose
rates follow the day, spread lognormally across models), then:

- ``fast``: the whole trace, in the simulator's default mode (a model is judged only on
  the ticks where its decision can change) -> ``requests_per_s``;
- the baseline, on the first ``--baseline-hours`` of the same trace: ``exact`` mode
  (every model and pool judged on every tick, the controller's own cadence) against
  ``fast`` on that slice; both must make the same decisions (``same_decisions``), and
  the ratio is the speed-up skipping buys.

One process, one core. Writes the figures, the trace and the machine as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from simulator import generate
from simulator.costs import CostModel, ModelCosts
from simulator.run import with_trace_models
from simulator.sim import Simulator
from simulator.traces import Trace, window
from thaw.config import ThawConfig

# One L40S instance per replica, a 90 s boot, 13 s loads (an 8B model): the figures of
# examples/simulate.yaml, written out so that the benchmark needs no file.
_CONFIG = {
    "shapes": [{"name": "g6e-xlarge", "gpu_type": "l40s-48gb", "gpu_count": 1, "gpu_memory_gib": 44.4,
                "host_memory_gib": 32, "price_per_hour_usd": 1.861, "boot_s": 90}],
    "pools": [{"shape": "g6e-xlarge", "standby_min": 1, "standby_max": 8, "max_instances": 400,
               "budget_usd_per_hour": 10, "standby_margin": 0.5, "standby_hold_s": 300}],
    "models": [{"name": "template", "uri": "s3://thaw/models/template", "shape": "g6e-xlarge",
                "max_context_tokens": 4096,
                "autoscaling": {"max_replicas": 4, "target_concurrency": 16, "max_concurrency_per_replica": 32,
                                "idle_grace_s": 300}}],
}
_COSTS = ModelCosts(weights_gib=15.0, standby_load_s=13.0, asleep_load_s=1.0, release_s=2.0,
                    prefill_tokens_per_s=10_000.0, tpot_s=0.05, source="bench: an 8B model on one L40S")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="FILE", type=Path, default=Path("bench_simulate.json"))
    p.add_argument("--models", type=int, default=100)
    p.add_argument("--days", type=float, default=21.0)
    p.add_argument("--rate-per-hour", type=float, default=20.0, help="mean requests per model per hour")
    p.add_argument("--baseline-hours", type=float, default=2.0,
                   help="slice of the trace on which exact mode (the baseline) and fast mode both run")
    p.add_argument("--seed", type=int, default=1)


def _run(cfg: ThawConfig, costs: CostModel, trace: Trace, *, exact: bool) -> tuple[Any, float]:
    t0 = time.perf_counter()
    result = Simulator(cfg, costs, trace, exact=exact, record_decisions=True).run()
    return result, time.perf_counter() - t0


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    trace = generate.diurnal(args.models, args.days * 86_400, rate_per_hour=args.rate_per_hour, sigma=1.0,
                             seed=args.seed, input_tokens=1024, output_tokens=256)
    gen_s = time.perf_counter() - t0
    cfg = with_trace_models(ThawConfig.model_validate(_CONFIG), trace, "template")
    costs = CostModel({m.name: _COSTS for m in cfg.models})

    full, full_s = _run(cfg, costs, trace, exact=False)
    part = window(trace, 0.0, args.baseline_hours * 3600)
    part_cfg = with_trace_models(ThawConfig.model_validate(_CONFIG), part, "template")
    part_costs = CostModel({m.name: _COSTS for m in part_cfg.models})
    exact, exact_s = _run(part_cfg, part_costs, part, exact=True)
    fast, fast_s = _run(part_cfg, part_costs, part, exact=False)

    s = full.summary
    out = {
        "requests_per_s": round(len(trace) / full_s, 1),
        "requests": len(trace),
        "wall_s": round(full_s, 3),
        "simulated_days": round(full.end_s / 86_400, 3),
        "simulated_s_per_wall_s": round(full.end_s / full_s, 1),
        "ticks": full.ticks,
        "models_judged": full.judged,
        "trace": {"generator": "diurnal", "models": len(trace.models), "days": args.days,
                  "rate_per_model_per_hour": args.rate_per_hour, "sigma": 1.0, "seed": args.seed,
                  "generate_s": round(gen_s, 3)},
        "result": {k: s[k] for k in ("cold_starts", "cold_start_share", "usd", "ttft_s", "activation_timeouts")},
        "baseline": {
            "hours": args.baseline_hours,
            "requests": len(part),
            "exact_requests_per_s": round(len(part) / exact_s, 1),
            "fast_requests_per_s": round(len(part) / fast_s, 1),
            "fast_vs_exact": round(exact_s / fast_s, 2),
            "exact_models_judged": exact.judged,
            "fast_models_judged": fast.judged,
            "same_decisions": exact.decisions == fast.decisions,
            "same_summary": exact.summary == fast.summary,
        },
        "machine": platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    b = out["baseline"]
    print(f"{len(trace):,} requests, {len(trace.models)} models, {args.days:g} days: {full_s:.1f} s, "
          f"{out['requests_per_s']:,.0f} requests/s; on the first {args.baseline_hours:g} h, fast mode is "
          f"{b['fast_vs_exact']:.1f}x exact mode (same decisions: {b['same_decisions']}); wrote {args.out}")
    return 0 if b["same_decisions"] else 1
