"""`thaw load report`: figures for one `thaw load run` directory.

    thaw load report DIR [--ttft-slo-s X] [--tpot-slo-ms Y]

Reads ``DIR/run.json`` and ``DIR/requests.jsonl`` (and ``DIR/replicas.jsonl`` if the
run polled the controller) and writes ``DIR/report.json``, ``DIR/ttft_cdf.png`` (TTFT
CDF per tier) and ``DIR/timeline.png`` (per model: TTFT of each request at its send
time, and replicas over time), and prints a table. TTFT and TPOT p50/p90/p99 overall,
per tier and per model; errors by status; goodput (requests within both SLOs per second
of the run); the generator's lag flag. The arithmetic is :mod:`loadtests.load_stats`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.load_schema import (
    REPLICAS_FILE,
    REPORT_FILE,
    REQUESTS_FILE,
    RUN_FILE,
    TIERS,
    GroupStats,
    ReplicaSample,
    Report,
    RequestRecord,
    RunInfo,
    Slo,
)
from loadtests.load_stats import build_report, completed, replicas_in_use

DEFAULT_TTFT_SLO_S = 2.0
DEFAULT_TPOT_SLO_MS = 100.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `thaw load report`."""
    p.add_argument("dir", metavar="DIR", help="a `thaw load run --out-dir` directory")
    p.add_argument("--ttft-slo-s", type=float, default=DEFAULT_TTFT_SLO_S,
                   help="TTFT target for goodput, seconds (default %(default)s)")
    p.add_argument("--tpot-slo-ms", type=float, default=DEFAULT_TPOT_SLO_MS,
                   help="time per output token target for goodput, ms (default %(default)s)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs")


def read_records(path: Path) -> list[RequestRecord]:
    """The records of a requests.jsonl, in index order."""
    with open(path, encoding="utf-8") as f:
        return sorted((RequestRecord.model_validate_json(line) for line in f if line.strip()), key=lambda r: r.index)


def read_samples(path: Path) -> list[ReplicaSample]:
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        return [ReplicaSample.model_validate_json(line) for line in f if line.strip()]


def read_run(run_dir: Path) -> tuple[RunInfo, list[RequestRecord], list[ReplicaSample]]:
    run = RunInfo.model_validate_json((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    return run, read_records(run_dir / REQUESTS_FILE), read_samples(run_dir / REPLICAS_FILE)


def run(args: argparse.Namespace) -> int:
    """`thaw load report`: 2 when DIR holds no run."""
    from pydantic import ValidationError

    run_dir = Path(args.dir)
    if not (args.ttft_slo_s > 0 and args.tpot_slo_ms > 0):
        print("thaw load report: --ttft-slo-s and --tpot-slo-ms must be > 0", file=sys.stderr)
        return 2
    try:
        info, records, samples = read_run(run_dir)
    except FileNotFoundError as exc:
        print(f"thaw load report: {exc.filename}: no such file (is {run_dir} a `thaw load run` directory?)",
              file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"thaw load report: {run_dir}: unreadable run files: {exc}", file=sys.stderr)
        return 2
    report = build_report(info, records, Slo(ttft_s=args.ttft_slo_s, tpot_ms=args.tpot_slo_ms), str(run_dir))
    (run_dir / REPORT_FILE).write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    print(format_table(report))
    if not args.no_plots:
        plot_ttft_cdf(records, run_dir / "ttft_cdf.png")
        plot_timeline(records, samples, info, run_dir / "timeline.png")
        print(f"plots: {run_dir / 'ttft_cdf.png'}, {run_dir / 'timeline.png'}")
    return 0


# -- the table -----------------------------------------------------------------------


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _row(label: str, g: GroupStats) -> str:
    t, p = g.ttft_s, g.tpot_ms
    return (f"{label:28s} {g.requests:5d} {g.completed:5d} {g.errors:5d} {g.cancelled:5d}  "
            f"{_f(t.p50, '8.3f')} {_f(t.p90, '8.3f')} {_f(t.p99, '8.3f')}  "
            f"{_f(p.p50, '7.1f')} {_f(p.p90, '7.1f')} {_f(p.p99, '7.1f')}  {g.good:5d}")


def format_table(r: Report) -> str:
    c, lag = r.counts, r.lag
    lines = [
        f"run {r.run_dir}: {r.duration_s:.1f} s; sent {c.sent} (of {c.scheduled} scheduled, {c.trace_requests} in "
        f"the trace): {c.completed} completed, {c.errors} errors, {c.cancelled} cancelled",
        f"generator fell behind: {'YES' if r.generator_fell_behind else 'no'} (send lag p99 {_f(lag.p99_ms, '.1f')} ms, "
        f"max {_f(lag.max_ms, '.1f')} ms, {lag.over_threshold} over {lag.threshold_ms:g} ms)",
        f"SLO: TTFT <= {r.slo.ttft_s:g} s, TPOT <= {r.slo.tpot_ms:g} ms; goodput {r.goodput_rps:.3f} req/s "
        f"({r.overall.good} requests)",
        "",
        f"{'group':28s} {'sent':>5s} {'done':>5s} {'err':>5s} {'canc':>5s}  "
        f"{'TTFT p50':>8s} {'p90':>8s} {'p99 s':>8s}  {'TPOT p50':>7s} {'p90':>7s} {'p99 ms':>7s}  {'good':>5s}",
        _row("all", r.overall),
    ]
    lines += [_row(f"tier {k}", g) for k, g in r.by_tier.items()]
    lines += [_row(f"model {k}", g) for k, g in r.by_model.items()]
    errors = ", ".join(f"{k}: {n}" for k, n in r.errors_by_status.items()) or "none"
    lines += ["", f"errors by status: {errors}"]
    return "\n".join(lines)


# -- plots ---------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _tier_color(tier: str) -> str:
    """The same colour for a tier in every plot."""
    order = [*TIERS, "none"]
    return f"C{order.index(tier) if tier in order else len(order)}"


def plot_ttft_cdf(records: Sequence[RequestRecord], path: Path) -> None:
    """TTFT CDF of completed requests, one line per tier."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    by_tier: dict[str, list[float]] = {}
    for r in records:
        if completed(r) and r.ttft_s is not None:
            by_tier.setdefault(r.tier or "none", []).append(r.ttft_s)
    for tier, xs in sorted(by_tier.items()):
        xs = sorted(xs)
        # From 0 at the first sample, so that a tier of one request is a visible step.
        ax.step([xs[0], *xs], [0.0] + [(i + 1) / len(xs) for i in range(len(xs))], where="post",
                color=_tier_color(tier), label=f"{tier} (n={len(xs)})")
    every = [x for xs in by_tier.values() for x in xs]
    if every and min(every) > 0 and max(every) / min(every) > 100:
        ax.set_xscale("log")  # hot and cold TTFTs are orders of magnitude apart
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of completed requests")
    ax.set_title("TTFT CDF per tier" if every else "TTFT CDF per tier (no completed requests)")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    if by_tier:
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_timeline(records: Sequence[RequestRecord], samples: Sequence[ReplicaSample], info: RunInfo,
                  path: Path) -> None:
    """Per model: each request's TTFT at its send time (errors marked at the bottom), and
    the replicas over time (the controller's ready count, or those seen serving)."""
    plt = _pyplot()
    models = sorted({r.model for r in records})
    fig, axes = plt.subplots(max(1, len(models)), 1, figsize=(9, 2.8 * max(1, len(models))), sharex=True,
                             squeeze=False)
    derived = replicas_in_use(records)
    for ax, model in zip(axes[:, 0], models or ["(no requests)"], strict=True):
        mine = [r for r in records if r.model == model]
        for tier in sorted({r.tier or "none" for r in mine}):
            pts = [(r.sent_s, r.ttft_s) for r in mine if (r.tier or "none") == tier and r.ttft_s is not None]
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, color=_tier_color(tier),
                           label=f"TTFT, {tier}")
        bad = [r.sent_s for r in mine if not completed(r)]
        if bad:
            ax.scatter(bad, [0.0] * len(bad), marker="x", color="red", s=24, clip_on=False,
                       label="error / cancelled (at 0)")
        ax.set_ylim(bottom=0)
        ax.set_ylabel("TTFT (s)")
        ax.grid(True, alpha=0.3)
        twin = ax.twinx()
        if info.replicas_source == "controller":
            pts2 = [(s.t_s, s.replicas.get("ready", 0)) for s in samples if s.model == model]
            what = "replicas ready (controller)"
        else:
            pts2 = derived.get(model, [])
            what = "replicas in use (distinct x-thaw-replica seen)"
        if pts2:
            twin.step([p[0] for p in pts2], [p[1] for p in pts2], where="post", color="gray", alpha=0.7)
        twin.set_ylabel("replicas", color="gray")
        twin.set_ylim(bottom=0, top=max([p[1] for p in pts2], default=0) + 1)
        ax.set_title(f"{model}: TTFT at send time; gray: {what}", fontsize=9)
        if mine:
            ax.legend(loc="best", fontsize=7)
    axes[-1, 0].set_xlabel("seconds from the run's start")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

