"""`thaw simulate`: replay a trace against the warm-pool policy (and `gen`, `convert`)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from simulator import gen_cli
from simulator.costs import CostError
from simulator.run import (
    DEFAULT_TTFT_SLO_S,
    Inputs,
    SimError,
    prepare,
    read_histograms,
    simulate,
    write,
    write_histograms,
)
from simulator.sim import engine_classes, tier_order
from simulator.stream import TraceStream, read_stream
from simulator.traces import FORMATS, Trace, TraceError, read_trace
from thaw.cli.aliases import add_renamed_flag
from thaw.config import ConfigError, load_config
from thaw.exits import EXIT_FAILED, EXIT_INVALID, EXIT_OK

ENGINE_CLASSES_HELP = (
    "Pre-built engines (pools[].prebuild): a cold start on a standby holding a built engine of the model's "
    "engine class is a swap (tier 'swap': the weights' load time less the engine start, plus swap_s). Offline "
    "there is no config.json, so the simulator assumes models of one size (weights_gib), the same engine "
    "settings and the same max_context_tokens are of one class (fine-tunes of one base; every trace model "
    "copied from --model-template); give models that are not different weights_gib in --costs.")


def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    """What `thaw simulate` and `thaw pool recommend` share: the inputs of a run."""
    p.add_argument("--trace", metavar="FILE", help="request trace to replay")
    p.add_argument("--format", choices=FORMATS, default=None, help="trace format (default: from the file)")
    p.add_argument("--config", metavar="FILE", help="Thaw config: shapes, pools, budgets, models")
    p.add_argument("--model-template", metavar="NAME", default=None,
                   help="configured model whose settings trace models missing from the config take")
    p.add_argument("--seed", type=int, default=0, help="seed for traces drawn at random (ServeGen)")
    p.add_argument("--servegen-model-per", choices=["model", "tenant"], default="model",
                   help="ServeGen: one model per ServeGen model, or one per tenant (default model)")
    p.add_argument("--catalog-model", default="llama-3.1-8b",
                   help="the planner's catalog model whose figures (size, speed) models take (default llama-3.1-8b)")
    p.add_argument("--costs", metavar="FILE", type=Path, default=None,
                   help="JSON of measured figures overriding the planner's (see docs/OPERATIONS.md)")
    p.add_argument("--ttft-slo-s", type=float, default=DEFAULT_TTFT_SLO_S,
                   help=f"TTFT SLO for models without autoscaling.ttft_slo_s (default {DEFAULT_TTFT_SLO_S:g})")
    p.add_argument("--tick-s", type=float, default=1.0, help="the controller's tick (default 1 s)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from simulator import oracle, packing, sweep

    add_trace_arguments(p)
    p.epilog = ENGINE_CLASSES_HELP
    add_renamed_flag(p, "--out", "--out-dir", dest="out", type=Path)
    p.add_argument("--out-dir", dest="out", metavar="DIR", type=Path, default=Path("sim-out"),
                   help="where summary.json, run.json and cold_starts.jsonl go (default sim-out); with "
                        "--compare-packing (--oracle), where compare-packing.json (oracle.json) goes (a path "
                        "ending in .json names the file itself)")
    p.add_argument("--exact", action="store_true",
                   help="judge every model on every tick, as the controller does (slow; same decisions)")
    p.add_argument("--keepalive-from", metavar="FILE", type=Path, default=None,
                   help="start every run from these keep-alive histograms (what --keepalive-to wrote): "
                        "the policy as it stands after that much history")
    p.add_argument("--keepalive-to", metavar="FILE", type=Path, default=None,
                   help="write each model's keep-alive histogram at the end of the run (one run only)")
    sweep.add_sweep_arguments(p)
    packing.add_compare_arguments(p)
    oracle.add_arguments(p)
    sub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", required=False)
    gen_cli.add_gen_arguments(sub.add_parser(
        "gen", help="Draw a synthetic trace of many low-traffic models.",
        description="Draw a synthetic trace of many low-traffic models and write it as generic CSV."))
    gen_cli.add_convert_arguments(sub.add_parser(
        "convert", help="Convert a public trace to generic CSV, optionally reshaped.",
        description="Read a public trace, optionally reshape it, and write it as generic CSV."))


def add_recommend_arguments(p: argparse.ArgumentParser) -> None:
    """`thaw pool recommend`: a run's inputs, the target and the sweep's ranges."""
    from simulator import sweep

    add_trace_arguments(p)
    sweep.add_recommend_arguments(p)


def cmd_recommend(args: argparse.Namespace) -> int:
    """`thaw pool recommend`: sweep on the trace, print the cheapest config that meets the target."""
    from simulator import sweep

    inputs = load_inputs(args)
    if isinstance(inputs, int):
        return inputs
    # The fragment names the file's models, not the copies made for trace models.
    configured = [m.name for m in load_config(args.config).models]
    return sweep.recommend(args, inputs, configured)


def load_inputs(args: argparse.Namespace) -> Inputs | int:
    """The run's inputs from the arguments, or an exit code (the error printed)."""
    if not args.trace or not args.config:
        return gen_cli.fail("--trace FILE and --config FILE are required", EXIT_INVALID)
    if args.tick_s <= 0 or args.ttft_slo_s <= 0:
        return gen_cli.fail("--tick-s and --ttft-slo-s must be > 0", EXIT_INVALID)
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        return gen_cli.fail(str(exc), EXIT_INVALID)
    try:
        stream = read_stream(args.trace) if args.format is None else None
    except ValueError as exc:
        return gen_cli.fail(str(exc), EXIT_INVALID)
    except OSError as exc:
        return gen_cli.fail(f"{args.trace}: {exc.strerror or exc}", EXIT_FAILED)
    trace: Trace | TraceStream
    if stream is not None:
        if args.sweep or args.compare_packing or args.oracle:
            return gen_cli.fail(f"{args.trace} describes a trace drawn as it is read: it runs as one simulation "
                                "(not --sweep, --compare-packing or --oracle)", EXIT_INVALID)
        trace = stream
    else:
        try:
            trace = read_trace(args.trace, args.format, seed=args.seed, servegen_model_per=args.servegen_model_per)
        except (TraceError, OSError) as exc:
            return gen_cli.fail(str(exc), EXIT_FAILED)
        if not len(trace):
            return gen_cli.fail(f"{args.trace}: the trace has no requests", EXIT_INVALID)
    try:
        return prepare(cfg, trace, template=args.model_template, catalog_model=args.catalog_model,
                       costs_file=args.costs, ttft_slo_s=args.ttft_slo_s, tick_s=args.tick_s)
    except (SimError, CostError) as exc:
        return gen_cli.fail(str(exc), EXIT_INVALID)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "trace_command", None):
        return gen_cli.run(args)
    # --sweep --oracle: the sweep (each point against the oracle), then the oracle's own
    # table against fixed timeouts, written beside it.
    if sum(bool(x) for x in (args.sweep, args.compare_packing, args.oracle and not args.sweep)) > 1:
        return gen_cli.fail("--sweep, --compare-packing and --oracle: choose one (or --sweep --oracle)",
                            EXIT_INVALID)
    if args.gpu_memory_utilization is not None and not args.compare_packing:
        return gen_cli.fail("--gpu-memory-utilization goes with --compare-packing", EXIT_INVALID)
    if args.keepalive_to is not None and (args.sweep or args.compare_packing or args.oracle):
        return gen_cli.fail("--keepalive-to goes with a single run (not --sweep, --compare-packing or --oracle)",
                            EXIT_INVALID)
    if args.keepalive_from is not None and args.oracle and not args.sweep:
        return gen_cli.fail("--keepalive-from goes with a run or a sweep: the oracle has no policy to start",
                            EXIT_INVALID)
    inputs = load_inputs(args)
    if isinstance(inputs, int):
        return inputs
    if args.keepalive_from is not None:
        try:
            histograms, dropped = read_histograms(args.keepalive_from, inputs.cfg)
        except SimError as exc:
            return gen_cli.fail(str(exc), EXIT_INVALID)
        for name, why in dropped.items():
            print(f"thaw: --keepalive-from: {name}'s histogram is not used: {why}", file=sys.stderr)
        inputs = replace(inputs, histograms=histograms)
    if args.sweep:
        from simulator import oracle, sweep

        code = sweep.run_sweep(args, inputs)
        if code != EXIT_OK or not args.oracle:
            return code
        return oracle.run_oracle(args, inputs.whole, inputs.costs)
    if args.compare_packing:
        from simulator import packing

        return packing.run_compare(args, inputs)
    if args.oracle:
        from simulator import oracle

        return oracle.run_oracle(args, inputs.whole, inputs.costs)
    result, wall_s = simulate(inputs, exact=args.exact)
    if args.keepalive_to is not None:
        write_histograms(args.keepalive_to, inputs.cfg, result.histograms)
        if not result.histograms:
            print(f"thaw: {args.keepalive_to} has no histogram: only models with keep_alive: histogram learn one",
                  file=sys.stderr)
    write(args.out, result, inputs, wall_s, {
        "command": "thaw simulate", "config": str(args.config), "trace_file": str(args.trace),
        "seed": args.seed, "model_template": args.model_template, "exact": args.exact,
    })
    s = result.summary
    p = s["ttft_s"]
    print(json.dumps({k: v for k, v in s.items() if k != "per_model"}))
    tiers = ", ".join(f"{tier} {n}" for tier, n in sorted(s["cold_starts_by_tier"].items(),
                                                          key=lambda kv: tier_order(kv[0])))
    print(f"{s['requests']} requests in {wall_s:.2f} s ({s['requests'] / wall_s:,.0f}/s): "
          f"{s['cold_starts']} cold starts{f' ({tiers})' if tiers else ''}, cold share {s['cold_start_share']:.2%}, "
          f"TTFT p99 {p['p99'] if p['p99'] is not None else float('nan'):.2f} s, ${s['usd']:.2f}, "
          f"{s['evictions']} evictions, {s['capacity_refusals']} refused at capacity; "
          f"wrote {args.out}/summary.json", file=sys.stderr)
    note = engine_classes_note(inputs)
    if note:
        print(note, file=sys.stderr)
    return 0


def engine_classes_note(inputs: Inputs) -> str | None:
    """What the run assumed of engine classes, where a pool pre-builds (None: none does)."""
    classes = engine_classes(inputs.cfg, inputs.costs)
    if not classes:
        return None
    pools = "; ".join(f"{p.shape}: {', '.join(p.prebuild)}" for p in inputs.cfg.pools if p.prebuild)
    return (f"pre-built engines ({pools}): {len(set(classes.values()))} engine classes over {len(classes)} models, "
            f"assumed: one class per size, engine settings and max_context_tokens (no config.json offline; "
            f"see --help)")
