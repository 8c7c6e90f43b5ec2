"""`thaw plan`: from a traffic forecast to GPUs and dollars, every assumption printed.

Exit codes: 0 a plan, 1 no plan meets the request (the model does not fit the GPU's
largest shape, or the SLOs cannot be met; the message has the numbers), 2 bad input
(an unknown model, GPU or instance id: the message lists the valid ones).
"""

from __future__ import annotations

import argparse
import sys

from thaw.exits import EXIT_INVALID, EXIT_NO_PLAN
from thaw.planner import catalog, render
from thaw.planner.sizing import DEFAULT_HEADROOM, DEFAULT_TPOT_P99_MS, DEFAULT_TTFT_P99_S, plan


def add_arguments(p: argparse.ArgumentParser) -> None:
    ids = ", ".join
    p.add_argument("--model", required=True, help=f"one of: {ids(m.id for m in catalog.MODELS)}")
    p.add_argument("--gpu", required=True, help=f"one of: {ids(g.id for g in catalog.GPUS)}")
    p.add_argument("--rps", type=float, required=True, help="requests per second")
    p.add_argument("--input-tokens", type=int, required=True, help="prompt tokens per request")
    p.add_argument("--output-tokens", type=int, required=True, help="generated tokens per request")
    p.add_argument("--prefix-hit-rate", type=float, default=0.0,
                   help="share of prompt tokens found in the prefix cache (default 0)")
    p.add_argument("--ttft-p99-s", type=float, default=DEFAULT_TTFT_P99_S,
                   help=f"p99 time-to-first-token target in seconds (default {DEFAULT_TTFT_P99_S:g})")
    p.add_argument("--tpot-p99-ms", type=float, default=DEFAULT_TPOT_P99_MS,
                   help=f"p99 time-per-output-token target in ms (default {DEFAULT_TPOT_P99_MS:g})")
    p.add_argument("--instance", default=None,
                   help=f"AWS instance type (default: the cheapest fit of the GPU's): "
                        f"{ids(i.id for i in catalog.INSTANCES)}")
    p.add_argument("--gpus-per-replica", type=int, default=None,
                   help="tensor-parallel GPUs per replica (default: the cheapest power of two that fits)")
    p.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM,
                   help=f"spare capacity over the tightest constraint (default {DEFAULT_HEADROOM:g})")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the plan as JSON")
    out.add_argument("--markdown", action="store_true", help="the plan as Markdown tables")


def run(args: argparse.Namespace) -> int:
    try:
        model = catalog.model(args.model)
        gpu = catalog.gpu(args.gpu)
        instance = catalog.instance(args.instance) if args.instance else None
        result = plan(model, gpu, rps=args.rps, input_tokens=args.input_tokens, output_tokens=args.output_tokens,
                      prefix_hit_rate=args.prefix_hit_rate, ttft_p99_s=args.ttft_p99_s,
                      tpot_p99_ms=args.tpot_p99_ms, instance=instance, headroom=args.headroom,
                      gpus_per_replica=args.gpus_per_replica)
    except ValueError as exc:
        print(f"thaw: error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.json:
        print(render.to_json(result))
    elif args.markdown:
        print(render.markdown(result))
    else:
        print(render.table(result))
    if result.problem is not None:
        print(f"thaw: error: {result.problem}", file=sys.stderr)
        return EXIT_NO_PLAN
    return 0
