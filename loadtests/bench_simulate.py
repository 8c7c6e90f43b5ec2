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

``--scenarios`` picks what runs: ``cold-heavy`` (the above) and ``production``: the
production-scale day (``simulator.stream.ProductionDay``: one 70B model at a diurnal mean
of 10,000 requests a second beside 1,000 low-traffic models), read as a stream, with
its day starting at midnight (its trough), for its first ``--production-hours``, on the
fleet of ``examples/simulate-production.yaml``; and on its first ``--fidelity-minutes``
the fast mode against the exact mode (:func:`fidelity`: the same decisions, those other
than the stops and ends of instances, the cost and each TTFT percentile's relative
difference). ``--fidelity-traces`` adds the same comparison on the first hours of trace
files (the shared traces, say).

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
from simulator.costs import CostModel, ModelCosts, cost_model, read_overrides
from simulator.run import with_trace_models
from simulator.sim import Simulator
from simulator.stream import ProductionDay
from simulator.traces import Trace, read_trace, window
from thaw.config import ThawConfig, load_config
from warm_pool.policy.decisions import Stop, Terminate

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


# The production scenario's fleet and its two models' figures: the files of the worked
# day in docs/OPERATIONS.md (examples/simulate-production.yaml says what they are).
_EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PRODUCTION_CONFIG = _EXAMPLES / "simulate-production.yaml"
PRODUCTION_COSTS = _EXAMPLES / "simulate-production-costs.json"
SCENARIOS = ("cold-heavy", "production")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="FILE", type=Path, default=Path("bench_simulate.json"))
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--production-hours", type=float, default=0.25,
                   help="how much of the production day runs, from midnight, its trough (default 0.25)")
    p.add_argument("--fidelity-minutes", type=float, default=5.0,
                   help="the production slice on which the fast and the exact mode both run (default 5)")
    p.add_argument("--models", type=int, default=100)
    p.add_argument("--days", type=float, default=21.0)
    p.add_argument("--rate-per-hour", type=float, default=20.0, help="mean requests per model per hour")
    p.add_argument("--baseline-hours", type=float, default=2.0,
                   help="slice of the trace on which exact mode (the baseline) and fast mode both run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fidelity-traces", nargs="*", default=[], metavar="FILE[@MODEL]",
                   help="traces (any format thaw simulate reads; @MODEL keeps one model of a multi-model "
                        "one) whose first --fidelity-trace-hours both modes run, each model served as the "
                        "template")
    p.add_argument("--fidelity-trace-hours", type=float, default=1.0)


def _run(cfg: ThawConfig, costs: CostModel, trace: Trace | ProductionDay, *, exact: bool) -> tuple[Any, float]:
    t0 = time.perf_counter()
    result = Simulator(cfg, costs, trace, exact=exact, record_decisions=True).run()
    return result, time.perf_counter() - t0


def fidelity(fast: Any, exact: Any) -> dict[str, Any]:
    """The fast mode against the exact mode on one trace: whether they decided alike (all
    decisions; all but the stops and ends of instances, which can move with a drained
    replica's end: ``simulator.lanes``), how many decisions only one made, and each
    TTFT percentile's relative difference."""
    def moves(r: Any) -> list[Any]:
        return [(t, d) for t, d in r.decisions if not isinstance(d, Stop | Terminate)]
    f, e = set(fast.decisions), set(exact.decisions)
    diffs: dict[str, float | None] = {
        q: (None if exact.summary["ttft_s"][q] in (None, 0) or fast.summary["ttft_s"][q] is None
            else round(fast.summary["ttft_s"][q] / exact.summary["ttft_s"][q] - 1.0, 6)) for q in ("p50", "p90", "p99")}
    return {"requests": exact.summary["requests"], "decisions": len(exact.decisions),
            "same_decisions": fast.decisions == exact.decisions,
            "same_launches_releases_assignments": moves(fast) == moves(exact),
            "decisions_only_one_made": len(f ^ e),
            "usd_fast_over_exact_minus_1": round(fast.summary["usd"] / exact.summary["usd"] - 1.0, 6)
            if exact.summary["usd"] else None,
            "ttft_fast_over_exact_minus_1": diffs}


def traces_fidelity(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Both modes on the first hours of each of ``--fidelity-traces``."""
    out = []
    for spec in args.fidelity_traces:
        path, _, model = str(spec).partition("@")
        trace = window(read_trace(path, model=model or None), 0.0, args.fidelity_trace_hours * 3600)
        cfg = with_trace_models(ThawConfig.model_validate(_CONFIG), trace, "template")
        costs = CostModel({m.name: _COSTS for m in cfg.models})
        fast, fast_s = _run(cfg, costs, trace, exact=False)
        exact, exact_s = _run(cfg, costs, trace, exact=True)
        row = {"trace": Path(path).name + (f"@{model}" if model else ""), "hours": args.fidelity_trace_hours, "models": len(trace.models),
               "fast_s": round(fast_s, 3), "exact_s": round(exact_s, 3), **fidelity(fast, exact)}
        print(f"fidelity on {row['trace']}: {row}")
        out.append(row)
    return out


def run(args: argparse.Namespace) -> int:
    out: dict[str, Any] = {"machine": platform.machine(), "platform": platform.platform(),
                           "python": platform.python_version(), "cpus": os.cpu_count()}
    ok = True
    if "cold-heavy" in args.scenarios:
        out["cold_heavy"] = cold_heavy(args)
        ok = ok and out["cold_heavy"]["baseline"]["same_decisions"]
    if "production" in args.scenarios:
        out["production"] = production(args)
        ok = ok and out["production"]["fidelity"]["same_launches_releases_assignments"]
    if args.fidelity_traces:
        out["fidelity_traces"] = traces_fidelity(args)
        ok = ok and all(r["same_launches_releases_assignments"] for r in out["fidelity_traces"])
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if ok else 1


def production(args: argparse.Namespace) -> dict[str, Any]:
    """The production day from its peak: requests a second over ``--production-hours``,
    and the fast mode against the exact mode on ``--fidelity-minutes``."""
    def inputs(hours: float) -> tuple[ProductionDay, ThawConfig, CostModel]:
        day = ProductionDay(duration_s=hours * 3600.0, seed=args.seed)
        cfg = with_trace_models(load_config(PRODUCTION_CONFIG), day, "template")
        return day, cfg, cost_model(cfg, overrides=read_overrides(PRODUCTION_COSTS))

    day, cfg, costs = inputs(args.production_hours)
    t0 = time.perf_counter()
    sim = Simulator(cfg, costs, day)
    full = sim.run()
    wall_s = time.perf_counter() - t0
    s = full.summary
    big = s["per_model"].get("llama-70b", {})
    part, part_cfg, part_costs = inputs(args.fidelity_minutes / 60.0)
    fast, fast_s = _run(part_cfg, part_costs, part, exact=False)
    exact, exact_s = _run(part_cfg, part_costs, part, exact=True)
    fid = fidelity(fast, exact)
    rate = sim.requests / wall_s
    day_s = day.mean_rps * 86_400.0 / rate
    out: dict[str, Any] = {
        "requests": sim.requests,
        "wall_s": round(wall_s, 3),
        "requests_per_s": round(sim.requests / wall_s, 1),
        "simulated_s_per_wall_s": round(full.end_s / wall_s, 2),
        "day_at_this_rate_s": round(day_s, 0),
        "ticks": full.ticks,
        "models_judged": full.judged,
        "trace": {"scenario": day.source, "hours": args.production_hours, "from": "midnight"},
        "result": {k: s[k] for k in ("cold_starts", "cold_start_share", "usd", "ttft_s", "activation_timeouts",
                                     "capacity_refusals")},
        "big_model": {k: big.get(k) for k in ("requests", "ttft_s", "cold_starts", "replica_seconds", "queue_full",
                                              "activation_timeouts", "slo_met_share")},
        "fidelity": {"minutes": args.fidelity_minutes, "fast_s": round(fast_s, 3), "exact_s": round(exact_s, 3),
                     **fid},
    }
    print(f"production: {sim.requests:,} requests in {wall_s:.1f} s, {rate:,.0f} requests/s "
          f"(a day at this rate: {day_s / 3600:.1f} h); on {args.fidelity_minutes:g} min, "
          f"fidelity {fid}")
    return out


def cold_heavy(args: argparse.Namespace) -> dict[str, Any]:
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
    out: dict[str, Any] = {
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
    }
    b = out["baseline"]
    print(f"cold-heavy: {len(trace):,} requests, {len(trace.models)} models, {args.days:g} days: {full_s:.1f} s, "
          f"{out['requests_per_s']:,.0f} requests/s; on the first {args.baseline_hours:g} h, fast mode is "
          f"{b['fast_vs_exact']:.1f}x exact mode (same decisions: {b['same_decisions']})")
    return out
