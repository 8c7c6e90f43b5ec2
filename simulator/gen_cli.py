"""`thaw simulate gen` and `thaw simulate convert`: write request traces as generic CSV.

``gen {poisson,bursty,diurnal}`` draws a synthetic trace (:mod:`simulator.generate`);
``convert`` reads a public trace (:func:`simulator.traces.read_trace`), optionally
reshapes it (spread over models, thin, speed up, cut a window) and writes it. Both
print one line saying what was written.

Exit codes: 0 written, 1 the trace could not be read or the file written, 2 bad
arguments.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from simulator import generate
from simulator.stream import ProductionDay
from simulator.traces import (
    FORMATS,
    Trace,
    TraceError,
    head,
    read_trace,
    speedup,
    spread_models,
    thin,
    window,
    write_generic,
)
from thaw.exits import EXIT_FAILED, EXIT_INVALID, EXIT_OK

_UNIT_S = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|min|m|h|d|w)?\s*")


def parse_duration_s(text: str) -> float:
    """``3600``, ``90s``, ``15m``/``15min``, ``6h``, ``21d``, ``2w`` → seconds (> 0)."""
    m = _DURATION.fullmatch(text)
    if m is None:
        raise ValueError(f"duration {text!r} is not a number with an optional unit s, m, h, d or w "
                         "(e.g. 21d, 6h, 3600)")
    seconds = float(m.group(1)) * _UNIT_S[m.group(2) or "s"]
    if seconds <= 0:
        raise ValueError(f"duration {text!r} must be > 0")
    return seconds


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``gen`` and ``convert`` as subcommands of ``p`` (dest ``trace_command``)."""
    sub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", required=True)
    add_gen_arguments(sub.add_parser(
        "gen", help="Draw a synthetic trace of many low-traffic models.",
        description="Draw a synthetic trace of many low-traffic models and write it as generic CSV."))
    add_convert_arguments(sub.add_parser(
        "convert", help="Convert a public trace (Azure, Mooncake, ServeGen) to generic CSV.",
        description="Read a trace, optionally reshape it, and write it as generic CSV."))


def add_gen_arguments(p: argparse.ArgumentParser) -> None:
    """``{poisson,bursty,diurnal}`` and their options (dest ``gen_kind``)."""
    p.set_defaults(trace_command="gen")
    kinds = p.add_subparsers(dest="gen_kind", metavar="KIND", required=True)
    for kind, help_ in (
        ("poisson", "Each model Poisson at a constant rate."),
        ("bursty", "Each model on/off: exponential on and off periods, Poisson while on."),
        ("diurnal", "Each model Poisson with a rate that follows a 24 h sinusoid."),
    ):
        k = kinds.add_parser(kind, help=help_, description=help_)
        k.add_argument("--models", type=int, required=True, metavar="N", help="number of models (m000, m001, …)")
        k.add_argument("--duration", required=True, metavar="DURATION", help="e.g. 21d, 6h, 90m, 3600 (seconds)")
        if kind == "bursty":
            k.add_argument("--on-s", type=float, default=600.0, help="mean on period, s (default 600)")
            k.add_argument("--off-s", type=float, default=3600.0, help="mean off period, s (default 3600)")
            k.add_argument("--rate-on-per-s", type=float, default=0.05,
                           help="each model's request rate while on, req/s (default 0.05)")
        else:
            k.add_argument("--rate-per-hour", type=float, default=6.0,
                           help="each model's mean request rate, req/h (default 6)")
        if kind == "diurnal":
            k.add_argument("--peak-to-trough", type=float, default=4.0, help="peak rate / trough rate (default 4)")
            k.add_argument("--peak-hour", type=float, default=14.0, help="hour of the peak, t=0 is midnight (default 14)")
            k.add_argument("--phase-spread-h", type=float, default=6.0,
                           help="each model's peak is uniform within ± half this around --peak-hour (default 6)")
        k.add_argument("--sigma", type=float, default=0.0,
                       help="log-sd of the per-model lognormal rate spread; 0: all models alike (default 0)")
        k.add_argument("--input-tokens", type=int, default=1024, help="mean input tokens (default 1024)")
        k.add_argument("--output-tokens", type=int, default=256, help="mean output tokens (default 256)")
        k.add_argument("--token-sigma", type=float, default=generate.TOKEN_SIGMA,
                       help=f"log-sd of the lognormal token counts (default {generate.TOKEN_SIGMA})")
        k.add_argument("--seed", type=int, default=0, help="same seed, same trace (default 0)")
        k.add_argument("--out", required=True, metavar="FILE.csv")
    add_production_arguments(kinds.add_parser(
        "production", help="A day of one busy model at 10,000 requests a second beside a long tail "
                           "(a description the simulator draws as it reads: no requests are written).",
        description="Write the description of the production-scale scenario (simulator.stream.ProductionDay): "
                    "one busy model at a diurnal mean rate beside a long tail of low-traffic models, drawn "
                    "chunk by chunk by `thaw simulate --trace FILE.json`, the same requests for the same "
                    "description."))


# The production scenario's numeric flags: flag, ProductionDay's field (argparse's
# dest), type, what it is.
_PRODUCTION_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("--big-rps", "big_rps", float, "the busy model's mean requests a second over the day"),
    ("--peak-to-trough", "peak_to_trough", float, "peak rate / trough rate"),
    ("--peak-hour", "peak_hour", float, "hour of the peak, t=0 is midnight"),
    ("--tail-models", "tail_models", int, "low-traffic models beside it, m000, m001, ..."),
    ("--tail-rate-per-hour", "tail_rate_per_hour", float, "the tail's mean requests an hour per model"),
    ("--tail-sigma", "tail_sigma", float, "log-sd of the tail's rates across models"),
    ("--input-tokens", "input_tokens", int, "mean input tokens"),
    ("--output-tokens", "output_tokens", int, "mean output tokens"),
    ("--seed", "seed", int, "same seed, same requests"),
)


def add_production_arguments(p: argparse.ArgumentParser) -> None:
    d = ProductionDay()
    p.add_argument("--duration", default="1d", help="e.g. 1d, 6h (default 1d)")
    p.add_argument("--big-model", default=d.big_model, help=f"the busy model's name (default {d.big_model})")
    for flag, field, kind, help_ in _PRODUCTION_FLAGS:
        p.add_argument(flag, type=kind, default=getattr(d, field), help=f"{help_} (default {getattr(d, field):g})")
    p.add_argument("--out", required=True, metavar="FILE.json")


def add_convert_arguments(p: argparse.ArgumentParser) -> None:
    p.set_defaults(trace_command="convert")
    p.add_argument("--trace", required=True, metavar="FILE")
    p.add_argument("--format", choices=FORMATS, default=None, help="default: told from the file's first line")
    p.add_argument("--model", default=None, metavar="NAME",
                   help="azure/mooncake: the model's name (default: the file's stem); "
                        "generic/servegen: keep only this model")
    p.add_argument("--servegen-model-per", choices=["model", "tenant"], default="model",
                   help="servegen: one model per ServeGen model, or one per tenant (<model>-c<client>)")
    p.add_argument("--servegen-rate-scale", type=float, default=1.0,
                   help="servegen: multiply every window's rate (the full m-small trace is 1.4e9 requests)")
    p.add_argument("--input-tokens", type=int, default=1024, help="servegen: input tokens per request (default 1024)")
    p.add_argument("--output-tokens", type=int, default=256, help="servegen: output tokens per request (default 256)")
    p.add_argument("--spread-models", type=int, default=None, metavar="N",
                   help="give the requests N models of Zipf popularity (see --zipf-s)")
    p.add_argument("--zipf-s", type=float, default=1.0, help="Zipf exponent for --spread-models (default 1)")
    p.add_argument("--thin", type=float, default=None, metavar="K", help="keep each request with probability K")
    p.add_argument("--speedup", type=float, default=None, metavar="X", help="divide times by X")
    p.add_argument("--start", default=None, metavar="DURATION", help="keep from this time on (after --speedup)")
    p.add_argument("--duration", default=None, metavar="DURATION", help="keep this long (after --speedup)")
    p.add_argument("--head", type=int, default=None, metavar="N", help="keep the first N requests")
    p.add_argument("--seed", type=int, default=0, help="for servegen draws, --thin and --spread-models (default 0)")
    p.add_argument("--out", required=True, metavar="FILE.csv")


def run(args: argparse.Namespace) -> int:
    if args.trace_command == "gen" and args.gen_kind == "production":
        return _production(args)
    handler: Callable[[argparse.Namespace], Trace] = _COMMANDS[args.trace_command]
    try:
        trace = handler(args)
    except TraceError as exc:
        return fail(str(exc), EXIT_FAILED)
    except ValueError as exc:
        return fail(str(exc), EXIT_INVALID)
    try:
        write_generic(trace, args.out)
    except OSError as exc:
        return fail(f"cannot write {args.out}: {exc.strerror or exc}", EXIT_FAILED)
    print(f"wrote {args.out}: {summary(trace)}")
    return EXIT_OK


def _production(args: argparse.Namespace) -> int:
    try:
        day = ProductionDay(duration_s=parse_duration_s(args.duration), big_model=args.big_model,
                            **{field: getattr(args, field) for _, field, _, _ in _PRODUCTION_FLAGS})
    except ValueError as exc:
        return fail(str(exc), EXIT_INVALID)
    try:
        Path(args.out).write_text(json.dumps(day.to_json(), indent=1) + "\n")
    except OSError as exc:
        return fail(f"cannot write {args.out}: {exc.strerror or exc}", EXIT_FAILED)
    print(f"wrote {args.out}: about {day.mean_rps * day.duration_s:,.0f} requests, {len(day.models):,} models, "
          f"over {_human_s(day.duration_s)}, drawn as `thaw simulate --trace {args.out}` reads it")
    return EXIT_OK


def summary(trace: Trace) -> str:
    """``"12,031 requests, 1 model, 1 tenant, over 59.0 min"``."""
    def n(count: int, what: str) -> str:
        return f"{count:,} {what}{'' if count == 1 else 's'}"

    return (f"{n(len(trace), 'request')}, {n(len(trace.models), 'model')}, "
            f"{n(len(trace.tenants), 'tenant')}, over {_human_s(trace.duration_s)}")


def _human_s(seconds: float) -> str:
    for unit, size in (("d", 86_400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def _gen(args: argparse.Namespace) -> Trace:
    common = dict(sigma=args.sigma, seed=args.seed, input_tokens=args.input_tokens,
                  output_tokens=args.output_tokens, token_sigma=args.token_sigma)
    duration_s = parse_duration_s(args.duration)
    if args.gen_kind == "poisson":
        return generate.poisson(args.models, duration_s, rate_per_hour=args.rate_per_hour, **common)
    if args.gen_kind == "bursty":
        return generate.bursty(args.models, duration_s, on_s=args.on_s, off_s=args.off_s,
                               rate_on_per_s=args.rate_on_per_s, **common)
    return generate.diurnal(args.models, duration_s, rate_per_hour=args.rate_per_hour,
                            peak_to_trough=args.peak_to_trough, peak_hour=args.peak_hour,
                            phase_spread_h=args.phase_spread_h, **common)


def _convert(args: argparse.Namespace) -> Trace:
    # Check every argument before reading, so a typo does not cost a long read.
    start_s = parse_duration_s(args.start) if args.start is not None else 0.0
    duration_s = parse_duration_s(args.duration) if args.duration is not None else None
    if args.thin is not None and not 0 < args.thin <= 1:
        raise ValueError(f"--thin must be in (0, 1], not {args.thin}")
    if args.speedup is not None and not args.speedup > 0:
        raise ValueError(f"--speedup must be > 0, not {args.speedup}")
    if args.spread_models is not None and args.spread_models < 1:
        raise ValueError(f"--spread-models must be >= 1, not {args.spread_models}")
    if args.head is not None and args.head < 0:
        raise ValueError(f"--head must be >= 0, not {args.head}")
    if not Path(args.trace).is_file():
        raise TraceError(args.trace, None, "no such file")
    trace = read_trace(args.trace, args.format, seed=args.seed, model=args.model,
                       servegen_model_per=args.servegen_model_per, input_tokens=args.input_tokens,
                       output_tokens=args.output_tokens, servegen_rate_scale=args.servegen_rate_scale)
    if args.spread_models is not None:
        trace = spread_models(trace, args.spread_models, args.seed, zipf_s=args.zipf_s)
    if args.thin is not None:
        trace = thin(trace, args.thin, args.seed)
    if args.speedup is not None:
        trace = speedup(trace, args.speedup)
    if args.start is not None or duration_s is not None:
        trace = window(trace, start_s, duration_s if duration_s is not None else float("inf"))
    if args.head is not None:
        trace = head(trace, args.head)
    return trace


_COMMANDS: dict[str, Callable[[argparse.Namespace], Trace]] = {"gen": _gen, "convert": _convert}


def fail(message: str, code: int) -> int:
    """Print ``thaw: error: message`` and return the exit code (the CLI's one error line)."""
    print(f"thaw: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":  # until `thaw simulate` registers these: python -m simulator.gen_cli gen …
    _parser = argparse.ArgumentParser(prog="thaw simulate")
    add_arguments(_parser)
    sys.exit(run(_parser.parse_args()))
