"""Sweeps over warm-pool settings, their Pareto frontier, and recommendations.

`thaw simulate --sweep` runs one simulation per combination of the sweep's axes (every
pool's ``budget_usd_per_hour``, every model's ``idle_grace_s`` and ``keep_alive``,
optionally every pool's ``standby_max``) plus four baselines, marks the points no other
point beats on cost, cold-start share and TTFT p99 at once (the Pareto frontier), and
writes ``sweep.json`` and a PNG of the frontier. `thaw pool recommend` runs the same
sweep and prints the cheapest variant that meets a TTFT p99 target as a config fragment.

The baselines:

``always-on``
    every model the trace requests ``min_replicas: 1``: a replica per model all the
    time, the cost of not scaling to zero. (Models the trace never requests, such as
    a ``--model-template`` model, are left out: they would add a replica nobody uses.)
``knative-defaults``
    fixed keep-alive at Knative's defaults: the autoscaler decides zero after its 60 s
    stable window, then ``scale-to-zero-grace-period`` (30 s) passes before the pod
    goes, so a replica outlives its last request by 90 s
    (https://knative.dev/docs/serving/autoscaling/scale-to-zero/). Thaw's own
    stable/panic window defaults (60 s, 6 s, 2x) are Knative's too.
``keepalive-10min``
    fixed keep-alive of 600 s (a common serverless default).
``no-standby``
    no standby workers in any pool (``standby_min = standby_max = 0``), the base
    keep-alive: every cold start boots an instance.

Every variant is the base config with a few keys changed (:class:`Settings`), built by
:func:`apply_settings`; simulations are deterministic, so the results do not depend on
how many processes ran them, nor whether they ran here or as tasks on a Ray cluster
(``--backend ray``, :mod:`simulator.ray_backend`).

One piece: the sweep, its baselines, frontier and recommendation share the variants'
naming and the report's columns.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal, TypeVar, assert_never, get_args

import yaml
from pydantic import ValidationError

from simulator import ray_backend
from simulator.gen_cli import fail
from simulator.oracle import Gaps, distance, gaps_of, oracle_report
from simulator.run import Inputs, simulate
from thaw.cli.aliases import add_renamed_flag
from thaw.config import Autoscaling, Pool, ThawConfig, format_errors
from thaw.exits import EXIT_FAILED, EXIT_INVALID, EXIT_OK

KeepAlive = Literal["fixed", "histogram"]
KEEP_ALIVES: tuple[KeepAlive, ...] = get_args(KeepAlive)
Backend = Literal["local", "ray"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)
# A pool budget of "none": no budget (``budget_usd_per_hour: null``).
UNLIMITED = math.inf

DEFAULT_BUDGETS: tuple[float, ...] = (0.0, 2.0, 5.0, 10.0, 20.0, 50.0, UNLIMITED)
DEFAULT_IDLE_GRACE_S: tuple[float, ...] = (30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)

# Knative: stable window 60 s + scale-to-zero-grace-period 30 s (module docstring).
KNATIVE_IDLE_GRACE_S = 90.0
TEN_MINUTES_S = 600.0


_T = TypeVar("_T")


# -- typed comma lists (argparse ``type=``) ---------------------------------------------


def _comma_list(text: str, what: str, parse: Callable[[str], _T]) -> tuple[_T, ...]:
    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not s for s in items):
        raise argparse.ArgumentTypeError(f"{what}: {text!r} has an empty item; give values separated by commas")
    values = tuple(parse(s) for s in items)
    twice = sorted({items[i] for i, v in enumerate(values) if values.index(v) != i})
    if twice:
        raise argparse.ArgumentTypeError(f"{what}: {text!r} lists {', '.join(twice)} more than once")
    return values


def _non_negative(what: str, s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: {s!r} is not a number") from None
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"{what}: {s!r} must be a finite number >= 0")
    return v


def budgets_arg(text: str) -> tuple[float, ...]:
    """``0,2.5,10,none`` → USD per hour; ``none`` is :data:`UNLIMITED` (no budget)."""
    def one(s: str) -> float:
        return UNLIMITED if s.lower() == "none" else _non_negative("budgets", s)
    return _comma_list(text, "budgets", one)


def seconds_list_arg(text: str) -> tuple[float, ...]:
    """``30,60,300`` → seconds (each >= 0)."""
    return _comma_list(text, "idle-grace-s", lambda s: _non_negative("idle-grace-s", s))


def keep_alive_arg(text: str) -> tuple[KeepAlive, ...]:
    """``fixed,histogram`` → keep-alive policies (config ``autoscaling.keep_alive``)."""
    def one(s: str) -> KeepAlive:
        for k in KEEP_ALIVES:
            if s == k:
                return k
        raise argparse.ArgumentTypeError(f"keep-alive: unknown policy {s!r}; valid: {', '.join(KEEP_ALIVES)}")
    return _comma_list(text, "keep-alive", one)


def _whole(what: str, s: str, minimum: int) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: {s!r} is not a whole number") from None
    if v < minimum:
        raise argparse.ArgumentTypeError(f"{what}: {s!r} must be >= {minimum}")
    return v


def counts_arg(text: str) -> tuple[int, ...]:
    """``0,2,8`` → whole numbers >= 0."""
    return _comma_list(text, "standby-max", lambda s: _whole("standby-max", s, 0))


def positive_int_arg(text: str) -> int:
    return _whole("value", text, 1)


def positive_float_arg(text: str) -> float:
    v = _non_negative("value", text)
    if v == 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return v


def share_arg(text: str) -> float:
    v = _non_negative("share", text)
    if v > 1:
        raise argparse.ArgumentTypeError(f"{text!r} is a share: between 0 and 1 (0.05 is 5%)")
    return v


# -- variants -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """What a variant changes in the base config; ``None``: as the base has it.

    Pool keys apply to every pool; autoscaling keys to every model, or with
    ``traced_models_only`` to the models the trace requests.
    ``budget_usd_per_hour`` :data:`UNLIMITED` means no budget (``null`` in the config).
    """

    budget_usd_per_hour: float | None = None
    standby_min: int | None = None
    standby_max: int | None = None
    idle_grace_s: float | None = None
    keep_alive: KeepAlive | None = None
    min_replicas: int | None = None
    traced_models_only: bool = False

    def to_json(self) -> dict[str, Any]:
        """The keys set (absent: the base's); an unlimited budget is ``null``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None and v is not False:
                out[f.name] = None if v == UNLIMITED else v
        return out


_POOL_KEYS = ("budget_usd_per_hour", "standby_min", "standby_max")
_AUTOSCALING_KEYS = ("idle_grace_s", "keep_alive", "min_replicas")


@dataclass(frozen=True)
class Variant:
    name: str
    kind: Literal["sweep", "baseline"]
    settings: Settings


@dataclass(frozen=True)
class Axes:
    """The sweep's ranges: every combination is one variant."""

    budgets_usd_per_hour: tuple[float, ...] = DEFAULT_BUDGETS
    idle_grace_s: tuple[float, ...] = DEFAULT_IDLE_GRACE_S
    keep_alive: tuple[KeepAlive, ...] = KEEP_ALIVES
    standby_max: tuple[int, ...] | None = None  # None: as the base has it

    def to_json(self) -> dict[str, Any]:
        return {"budgets_usd_per_hour": [None if b == UNLIMITED else b for b in self.budgets_usd_per_hour],
                "idle_grace_s": list(self.idle_grace_s), "keep_alive": list(self.keep_alive),
                "standby_max": list(self.standby_max) if self.standby_max is not None else None}


BASELINES: dict[str, tuple[Settings, str]] = {
    "always-on": (Settings(min_replicas=1, traced_models_only=True),
                  "every model of the trace min_replicas 1: a replica per model all the time"),
    "knative-defaults": (Settings(idle_grace_s=KNATIVE_IDLE_GRACE_S, keep_alive="fixed"),
                         "fixed keep-alive of 90 s: Knative's 60 s stable window + 30 s scale-to-zero grace"),
    "keepalive-10min": (Settings(idle_grace_s=TEN_MINUTES_S, keep_alive="fixed"), "fixed keep-alive of 600 s"),
    "no-standby": (Settings(standby_min=0, standby_max=0), "no standby workers; the base keep-alive"),
}
ALWAYS_ON = "always-on"


def _num(v: float) -> str:
    return "none" if v == UNLIMITED else f"{v:g}"


def variant_name(s: Settings) -> str:
    """``budget=10 idle_grace=300 keep_alive=fixed`` (``standby_max=N`` when swept)."""
    parts = []
    if s.budget_usd_per_hour is not None:
        parts.append(f"budget={_num(s.budget_usd_per_hour)}")
    if s.idle_grace_s is not None:
        parts.append(f"idle_grace={_num(s.idle_grace_s)}")
    if s.keep_alive is not None:
        parts.append(f"keep_alive={s.keep_alive}")
    if s.standby_max is not None:
        parts.append(f"standby_max={s.standby_max}")
    return " ".join(parts) or "base"


def sweep_variants(axes: Axes) -> list[Variant]:
    """Every combination of the axes, in a fixed order (budget slowest, standby_max fastest)."""
    out = []
    for budget, grace, keep, smax in itertools.product(
            axes.budgets_usd_per_hour, axes.idle_grace_s, axes.keep_alive, axes.standby_max or (None,)):
        s = Settings(budget_usd_per_hour=budget, idle_grace_s=grace, keep_alive=keep, standby_max=smax)
        out.append(Variant(variant_name(s), "sweep", s))
    return out


def baseline_variants() -> list[Variant]:
    return [Variant(name, "baseline", s) for name, (s, _) in BASELINES.items()]


def apply_settings(cfg: ThawConfig, s: Settings, traced: Collection[str] = ()) -> ThawConfig:
    """``cfg`` with ``s`` applied to every pool and every model's autoscaling (with
    ``s.traced_models_only``, the models named in ``traced``: the trace's).

    Each changed pool and autoscaling block is validated again (``model_copy`` does not
    validate), so an impossible variant (``standby_max`` above ``max_instances``) raises
    :class:`ValueError` naming the field. A ``standby_max`` below the base's
    ``standby_min`` lowers ``standby_min`` with it.
    """
    pool_update: dict[str, Any] = {}
    if s.budget_usd_per_hour is not None:
        pool_update["budget_usd_per_hour"] = None if s.budget_usd_per_hour == UNLIMITED else s.budget_usd_per_hour
    if s.standby_min is not None:
        pool_update["standby_min"] = s.standby_min
    if s.standby_max is not None:
        pool_update["standby_max"] = s.standby_max
    auto_update = {k: getattr(s, k) for k in _AUTOSCALING_KEYS if getattr(s, k) is not None}
    update: dict[str, Any] = {}
    if pool_update:
        pools = []
        for p in cfg.pools:
            u = dict(pool_update)
            if s.standby_max is not None and s.standby_min is None:
                u["standby_min"] = min(p.standby_min, s.standby_max)
            pools.append(_validated(Pool, p, u, f"pool {p.shape}"))
        update["pools"] = pools
    if auto_update:
        chosen = set(traced)
        update["models"] = [
            m.model_copy(update={"autoscaling": _validated(
                Autoscaling, m.autoscaling, auto_update, f"model {m.name}: autoscaling")})
            if not s.traced_models_only or m.name in chosen or m.resolved_served_name in chosen else m
            for m in cfg.models]
    return cfg.model_copy(update=update) if update else cfg


_M = TypeVar("_M", Pool, Autoscaling)


def _validated(cls: type[_M], base: _M, update: dict[str, Any], where: str) -> _M:
    try:
        return cls.model_validate({**base.model_dump(), **update})
    except ValidationError as exc:
        problems = [e.removeprefix("(top level): ") for e in format_errors(exc)]
        raise ValueError(f"{where}: {'; '.join(problems)}") from None


# -- the Pareto frontier ----------------------------------------------------------------


def pareto_front(costs: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the points no other point dominates, every coordinate minimised.

    ``a`` dominates ``b`` when it is no worse in every coordinate and better in one; two
    equal points do not dominate each other, so both stay.
    """
    front = []
    for i, b in enumerate(costs):
        if not any(all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))
                   for j, a in enumerate(costs) if j != i):
            front.append(i)
    return front


def objectives(summary: dict[str, Any]) -> tuple[float, float, float]:
    """(USD, cold-start share, TTFT p99 s) of a run; a run that served nothing has p99 inf."""
    p99 = summary["ttft_s"]["p99"]
    return summary["usd"], summary["cold_start_share"], math.inf if p99 is None else p99


@dataclass(frozen=True)
class Point:
    variant: Variant
    summary: dict[str, Any]  # SimResult.summary without per_model
    frontier: bool

    @property
    def name(self) -> str:
        return self.variant.name

    @property
    def p99(self) -> float | None:
        return self.summary["ttft_s"]["p99"]


def mark_frontier(variants: Sequence[Variant], summaries: Sequence[dict[str, Any]]) -> list[Point]:
    front = set(pareto_front([objectives(s) for s in summaries]))
    return [Point(v, s, i in front) for i, (v, s) in enumerate(zip(variants, summaries, strict=True))]


# -- running ------------------------------------------------------------------------------

# One process pool worker's inputs, set once by its initializer so each task carries
# only its small Settings rather than the whole trace.
_worker_inputs: Inputs | None = None


def _init_worker(inputs: Inputs) -> None:
    global _worker_inputs
    _worker_inputs = inputs


def _run_in_worker(s: Settings) -> dict[str, Any]:
    assert _worker_inputs is not None
    return run_one(_worker_inputs, s)


def run_one(inputs: Inputs, s: Settings) -> dict[str, Any]:
    """One variant's summary, without per_model."""
    result, _ = simulate(inputs, cfg=apply_settings(inputs.cfg, s, inputs.trace.models))
    return {k: v for k, v in result.summary.items() if k != "per_model"}


def run_variants(inputs: Inputs, variants: Sequence[Variant], jobs: int | None = None,
                 backend: Backend = "local", ray_address: str | None = None) -> list[Point]:
    """Simulate every variant and mark the frontier: ``local``, in ``jobs`` processes (None:
    the CPU count); ``ray``, as tasks on a Ray cluster, ``jobs`` at most at a time (None: no
    cap), which may raise ``ray_backend.RayMissing`` or ``RayUnreachable``. The order and
    the numbers are the same for any ``jobs`` and either backend."""
    settings = [v.settings for v in variants]
    if backend == "local":
        jobs = max(1, min(jobs or os.cpu_count() or 1, len(settings)))
        if jobs == 1:
            summaries = [run_one(inputs, s) for s in settings]
        else:
            with ProcessPoolExecutor(max_workers=jobs, initializer=_init_worker, initargs=(inputs,)) as ex:
                summaries = list(ex.map(_run_in_worker, settings))
    elif backend == "ray":
        summaries = ray_backend.map_shared(run_one, inputs, settings, max_in_flight=jobs, address=ray_address)
    else:
        assert_never(backend)
    return mark_frontier(variants, summaries)


def check_variants(cfg: ThawConfig, variants: Sequence[Variant], traced: Collection[str] = ()) -> str | None:
    """The first variant that cannot be built from ``cfg``, as a message; None if all can."""
    for v in variants:
        try:
            apply_settings(cfg, v.settings, traced)
        except ValueError as exc:
            return f"variant {v.name!r}: {exc}"
    return None


# -- output -------------------------------------------------------------------------------


def _fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def against_oracle(g: Gaps, summary: dict[str, Any]) -> dict[str, Any]:
    """A simulated run against the keep-alive oracle (``simulator.oracle``) at its idle
    replica time (its replica-seconds less the trace's busy time). Its cold starts are
    all the run's, scale-ups and loads included, so the distance is an upper bound on
    what its keep-alive alone lost."""
    return distance(g, max(summary["replica_seconds"] - g.busy_s, 0.0), summary["cold_starts"])


def versus_fixed(points: Sequence[Point], oracle: Sequence[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """Each learned keep-alive point (``keep_alive=histogram``) against the fixed
    timeouts swept with the same other settings, at the same idle replica time: their
    cold starts interpolated between the two fixed points either side (None outside
    their range, and for every other point). ``oracle``: ``against_oracle`` of each
    point, in the points' order."""
    def peers_key(p: Point) -> Settings:
        return replace(p.variant.settings, idle_grace_s=None, keep_alive=None)

    fixed: dict[Settings, list[tuple[float, int]]] = {}
    for p, o in zip(points, oracle, strict=True):
        if p.variant.kind == "sweep" and p.variant.settings.keep_alive == "fixed":
            fixed.setdefault(peers_key(p), []).append((o["idle_replica_hours"], o["cold_starts"]))
    out: list[dict[str, Any] | None] = []
    for p, o in zip(points, oracle, strict=True):
        line = sorted(fixed.get(peers_key(p), []))
        idle = o["idle_replica_hours"]
        if p.variant.kind != "sweep" or p.variant.settings.keep_alive != "histogram" or len(line) < 2 \
                or not line[0][0] <= idle <= line[-1][0]:
            out.append(None)
            continue
        i = next(i for i in range(1, len(line)) if line[i][0] >= idle)
        (x0, y0), (x1, y1) = line[i - 1], line[i]
        at = y0 if x1 == x0 else y0 + (y1 - y0) * (idle - x0) / (x1 - x0)
        out.append({"fixed_cold_starts_at_same_idle": round(at, 1),
                    "vs_fixed": round(o["cold_starts"] / at, 3) if at else None})
    return out


def format_table(points: Sequence[Point], oracle: Sequence[dict[str, Any]] | None = None,
                 fixed: Sequence[dict[str, Any] | None] | None = None) -> str:
    """Every point sorted by cost, the frontier marked; ``oracle``: each point's
    distance to the keep-alive oracle (``against_oracle``), ``fixed``: a learned
    keep-alive's to the fixed timeouts (``versus_fixed``), in the points' order."""
    rows = [("variant", "usd", "cold_share", "ttft_p50_s", "ttft_p99_s", "slo_met", "timeouts", "x_oracle",
             "x_fixed", "frontier")]
    ratio: dict[int, float | None] = {id(p): None for p in points}
    vs_fixed: dict[int, float | None] = {id(p): None for p in points}
    for p, o in zip(points, oracle or [], strict=False):
        ratio[id(p)] = o["vs_oracle"]
    for p, f in zip(points, fixed or [], strict=False):
        vs_fixed[id(p)] = f["vs_fixed"] if f else None
    for p in sorted(points, key=lambda p: (p.summary["usd"], p.name)):
        s = p.summary
        rows.append((p.name + (" (baseline)" if p.variant.kind == "baseline" else ""), f"{s['usd']:.2f}",
                     f"{s['cold_start_share']:.2%}", _fmt_s(s["ttft_s"]["p50"]), _fmt_s(s["ttft_s"]["p99"]),
                     f"{s['slo_met_share']:.2%}", str(s["activation_timeouts"]), _fmt_s(ratio[id(p)]),
                     _fmt_s(vs_fixed[id(p)]), "yes" if p.frontier else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(("* " if r[-1] == "yes" else "  ") + "  ".join(
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
        for r in rows)


def trace_info(inputs: Inputs, trace_file: str | None) -> dict[str, Any]:
    tr = inputs.whole
    return {"file": trace_file, "source": tr.source, "requests": len(tr), "models": len(tr.models),
            "duration_s": tr.duration_s}


def sweep_document(points: Sequence[Point], axes: Axes, inputs: Inputs, meta: dict[str, Any],
                   g: Gaps) -> dict[str, Any]:
    """``sweep.json``: every point's settings and summary, its distance to the keep-alive
    oracle (on the trace's gaps ``g``) and a learned keep-alive's to the fixed
    timeouts, the frontier, the baselines."""
    oracle = [against_oracle(g, p.summary) for p in points]
    fixed = versus_fixed(points, oracle)
    return {
        **meta,
        "ttft_slo_s": inputs.ttft_slo_s,
        "tick_s": inputs.tick_s,
        "axes": axes.to_json(),
        "objectives": ["usd", "cold_start_share", "ttft_s.p99"],
        "points": [{"name": p.name, "kind": p.variant.kind, "settings": p.variant.settings.to_json(),
                    "frontier": p.frontier, "summary": p.summary, "oracle": o, "versus_fixed": f}
                   for p, o, f in zip(points, oracle, fixed, strict=True)],
        "oracle": {k: v for k, v in oracle_report(g, ()).items() if k != "policies"},
        "frontier": [p.name for p in points if p.frontier],
        "baselines": {name: desc for name, (_, desc) in BASELINES.items()},
    }


# Marker, colour and label offset (points): baselines often coincide, so their labels
# point different ways.
_BASELINE_STYLE = {"always-on": ("s", "tab:red", (8, -14)), "knative-defaults": ("D", "tab:green", (8, 8)),
                   "keepalive-10min": ("P", "tab:purple", (8, 20)), "no-standby": ("X", "tab:brown", (-70, 10))}
_KEEP_STYLE = {"fixed": ("o", "tab:blue"), "histogram": ("^", "tab:orange")}


def _plot_against_oracle(ax: Any, points: Sequence[Point], oracle: Sequence[dict[str, Any]], g: Gaps) -> None:
    """Cold starts against idle replica-hours: each swept point, the fixed timeouts
    computed on the gaps, and the oracle (the fewest any keep-alive can have)."""
    swept = [o for p, o in zip(points, oracle, strict=True) if p.variant.kind == "sweep"]
    idle_max = max([o["idle_replica_hours"] for o in swept] + [float(g.gaps.sum()) / 3600]) * 1.02
    xs = [idle_max * i / 400 for i in range(401)]
    ax.plot(xs, [g.oracle_cold_starts(x * 3600) for x in xs], color="black", lw=1.4,
            label="oracle (perfect foresight)")
    if g.by_model:
        ax.plot(xs, [g.per_model_timeouts_cold_starts(x * 3600) for x in xs], color="grey", lw=1.0, ls="--",
                label="a timeout per model, chosen in hindsight")
    timeouts = [60.0 * 1.15 ** i for i in range(60)]
    fixed = [g.fixed_timeout(t) for t in timeouts]
    ax.plot([i / 3600 for i, _ in fixed], [c for _, c in fixed], color="tab:blue", lw=1.0, ls=":",
            label="fixed timeouts, on the gaps")
    for keep, (marker, color) in _KEEP_STYLE.items():
        mine = [o for p, o in zip(points, oracle, strict=True)
                if p.variant.kind == "sweep" and p.variant.settings.keep_alive == keep]
        if mine:
            ax.scatter([o["idle_replica_hours"] for o in mine], [o["cold_starts"] for o in mine], marker=marker,
                       s=30, color=color, alpha=0.8, label=f"simulated, keep_alive={keep}")
    ax.set_yscale("log")
    ax.set_xlabel("idle replica-hours (replica time less the trace's busy time)")
    ax.set_ylabel("cold starts")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def plot_frontier(points: Sequence[Point], path: Path, title: str,
                  against: tuple[Sequence[dict[str, Any]], Gaps] | None = None) -> None:
    """Two panels, USD against cold-start share and against TTFT p99; with ``against``
    (each point's ``against_oracle`` and the trace's gaps) a third, cold starts against
    idle replica time with the keep-alive oracle's line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(19 if against else 13, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    panels = [("cold_start_share", "cold-start share (% of requests)", 100.0),
              ("p99", "TTFT p99 (s)", 1.0)]
    axes = fig.subplots(1, 3 if against else 2)
    if against:
        _plot_against_oracle(axes[2], points, *against)
    for ax, (key, label, scale) in zip(axes[:2], panels, strict=True):
        def y(p: Point, key: str = key, scale: float = scale) -> float | None:
            v = p.p99 if key == "p99" else p.summary[key]
            return None if v is None else v * scale

        sweep = [p for p in points if p.variant.kind == "sweep" and y(p) is not None]
        for keep, (marker, color) in _KEEP_STYLE.items():
            mine = [p for p in sweep if p.variant.settings.keep_alive == keep]
            if mine:
                ax.scatter([p.summary["usd"] for p in mine], [y(p) for p in mine], marker=marker, s=22,
                           color=color, alpha=0.55, label=f"sweep, keep_alive={keep}")
        # The frontier is over three objectives; in each panel its line is the best
        # value of this one reached at or below each cost (the panel's own frontier).
        front = sorted((p.summary["usd"], v) for p in points if p.frontier and (v := y(p)) is not None)
        line_x, line_y, best = [], [], math.inf
        for usd, v in front:
            if v < best:
                best = v
                line_x.append(usd)
                line_y.append(v)
        if line_x:
            ax.step(line_x, line_y, where="post", color="black", lw=1.4, label="Pareto frontier")
        fx = [p.summary["usd"] for p in points if p.frontier and y(p) is not None]
        ax.scatter(fx, [y(p) for p in points if p.frontier and y(p) is not None], s=70,
                   facecolors="none", edgecolors="black", lw=1.0, label="on the frontier")
        for p in points:
            if p.variant.kind != "baseline" or y(p) is None:
                continue
            marker, color, offset = _BASELINE_STYLE.get(p.name, ("*", "tab:gray", (8, 8)))
            ax.scatter([p.summary["usd"]], [y(p)], marker=marker, s=90, color=color, edgecolors="black",
                       zorder=3, label=p.name)
            ax.annotate(p.name, (p.summary["usd"], y(p)), textcoords="offset points", xytext=offset,
                        fontsize=8, color=color)
        values = [v for p in points if (v := y(p)) is not None and v > 0]
        if key == "p99" and values and max(values) / min(values) > 20:
            ax.set_yscale("log")
        ax.set_xlabel("simulated cost over the trace (USD)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _title(info: dict[str, Any]) -> str:
    name = Path(info["file"]).name if info["file"] else (info["source"] or "trace")
    return (f"{name}: {info['requests']:,} requests, {info['models']} models, "
            f"{info['duration_s'] / 3600:.1f} h — cost vs cold starts and TTFT")


# -- CLI: `thaw simulate --sweep` -------------------------------------------------------


def _add_range_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budgets", metavar="USD[,USD...]", type=budgets_arg, default=DEFAULT_BUDGETS,
                   help="pool budget_usd_per_hour values, applied to every pool; 'none' is no budget "
                        "(default 0,2,5,10,20,50,none)")
    add_renamed_flag(p, "--idle-grace", "--idle-grace-s", dest="idle_grace", type=seconds_list_arg)
    p.add_argument("--idle-grace-s", dest="idle_grace", metavar="S[,S...]", type=seconds_list_arg,
                   default=DEFAULT_IDLE_GRACE_S, help="models' idle_grace_s values (default 30,60,120,300,600,1800)")
    p.add_argument("--keep-alive", metavar="POLICY[,POLICY...]", type=keep_alive_arg, default=KEEP_ALIVES,
                   help="keep-alive policies: fixed, histogram (default both)")
    p.add_argument("--standby-max", metavar="N[,N...]", type=counts_arg, default=None,
                   help="pools' standby_max values (default: the config's; standby_min is lowered to fit)")
    p.add_argument("--jobs", metavar="N", type=positive_int_arg, default=None,
                   help="simulations run at once: local processes (default: the CPU count); with "
                        "--backend ray, the most tasks submitted at a time (default: all, the cluster's "
                        "CPUs decide)")
    p.add_argument("--backend", choices=BACKENDS, default="local",
                   help="local: a process pool here (default); ray: each variant a task on a Ray cluster "
                        "('ray start --head' on one machine, 'ray start --address=HEAD:6379' on the others, "
                        "thaw-serve installed on each); RAY_ADDRESS or --ray-address picks the cluster, with "
                        "neither a local Ray instance runs for the sweep and stops after it. Ray is an "
                        "optional extra: pip install 'thaw-serve[ray]'")
    p.add_argument("--ray-address", metavar="ADDR", default=None,
                   help="the Ray cluster for --backend ray, e.g. HEAD:6379 (default: RAY_ADDRESS)")


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    """`thaw simulate`'s sweep options (the run's inputs and ``--out-dir`` are its own)."""
    p.add_argument("--sweep", action="store_true",
                   help="sweep pool budgets, idle_grace_s and keep-alive policies, with baselines; writes "
                        "OUT/sweep.json and a PNG of the Pareto frontier")
    _add_range_arguments(p)
    p.add_argument("--png", metavar="FILE", type=Path, default=None,
                   help="where the frontier plot goes (default OUT/frontier.png)")


def axes_from(args: argparse.Namespace) -> Axes:
    return Axes(args.budgets, args.idle_grace, args.keep_alive, args.standby_max)


def _sweep(args: argparse.Namespace, inputs: Inputs) -> tuple[list[Point], Axes, float] | int:
    if args.ray_address is not None and args.backend != "ray":
        return fail("--ray-address is for --backend ray", EXIT_INVALID)
    axes = axes_from(args)
    variants = [*baseline_variants(), *sweep_variants(axes)]
    problem = check_variants(inputs.cfg, variants, inputs.trace.models)
    if problem:
        return fail(problem, EXIT_INVALID)
    t0 = time.perf_counter()
    try:
        points = run_variants(inputs, variants, args.jobs, args.backend, args.ray_address)
    except ray_backend.RayMissing as exc:
        return fail(str(exc), EXIT_INVALID)
    except ray_backend.RayUnreachable as exc:
        return fail(str(exc), EXIT_FAILED)
    return points, axes, time.perf_counter() - t0


def _ran(args: argparse.Namespace) -> str:
    """Where the sweep's simulations ran, for its closing line."""
    if args.backend == "ray":
        return "on Ray" + (f", {args.jobs} task(s) at a time" if args.jobs else "")
    return f"with {args.jobs or os.cpu_count() or 1} job(s)"


def _write(out: Path, png: Path, points: Sequence[Point], axes: Axes, inputs: Inputs,
           meta: dict[str, Any]) -> dict[str, Any]:
    """Write sweep.json and the plot; the document written."""
    out.mkdir(parents=True, exist_ok=True)
    g = gaps_of(inputs.whole, inputs.costs)
    doc = sweep_document(points, axes, inputs, meta, g)
    (out / "sweep.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot_frontier(points, png, _title(meta["trace"]), ([p["oracle"] for p in doc["points"]], g))
    return doc


def run_sweep(args: argparse.Namespace, inputs: Inputs) -> int:
    """`thaw simulate --sweep`: the table on stdout, sweep.json and the PNG under --out-dir."""
    swept = _sweep(args, inputs)
    if isinstance(swept, int):
        return swept
    points, axes, wall_s = swept
    png = args.png or args.out / "frontier.png"
    meta = {"command": "thaw simulate --sweep", "config": str(args.config), "model_template": args.model_template,
            "trace": trace_info(inputs, args.trace)}
    doc = _write(args.out, png, points, axes, inputs, meta)
    print(format_table(points, [p["oracle"] for p in doc["points"]], [p["versus_fixed"] for p in doc["points"]]),
          flush=True)
    front = sum(p.frontier for p in points)
    print(f"{len(points)} variants ({len(BASELINES)} baselines) in {wall_s:.1f} s {_ran(args)}; "
          f"{front} on the frontier (*); wrote {args.out / 'sweep.json'} and {png}", file=sys.stderr)
    return EXIT_OK


# -- CLI: `thaw pool recommend` ---------------------------------------------------------


def add_recommend_arguments(p: argparse.ArgumentParser) -> None:
    """`thaw pool recommend`'s own options (the trace options are added beside them)."""
    p.add_argument("--ttft-p99-s", type=positive_float_arg, required=True,
                   help="the TTFT p99 to meet, in seconds, over every request of the trace")
    p.add_argument("--max-cold-start-share", metavar="F", type=share_arg, default=None,
                   help="also keep the share of requests that wait for a cold start at or under F (0.05 = 5%%)")
    _add_range_arguments(p)
    add_renamed_flag(p, "--out", "--out-dir", dest="out", type=Path)
    p.add_argument("--out-dir", dest="out", metavar="DIR", type=Path, default=None,
                   help="also write the sweep there (sweep.json, frontier.png)")


def meets(p: Point, ttft_p99_s: float, max_cold_start_share: float | None) -> bool:
    s = p.summary
    return (p.p99 is not None and p.p99 <= ttft_p99_s and _unanswered(s) == 0
            and (max_cold_start_share is None or s["cold_start_share"] <= max_cold_start_share))


def _unanswered(s: Mapping[str, Any]) -> int:
    """Requests that got no replica: timed out waiting, or refused by a full pool."""
    return int(s["activation_timeouts"]) + int(s["capacity_refusals"])


def choose(points: Sequence[Point], ttft_p99_s: float, max_cold_start_share: float | None = None) -> Point | None:
    """The cheapest point other than always-on that meets the target (ties: lower p99,
    then sweep order)."""
    ok = [p for p in points if p.name != ALWAYS_ON and meets(p, ttft_p99_s, max_cold_start_share)]
    return min(ok, key=lambda p: (p.summary["usd"], p.p99, points.index(p)), default=None)


def closest(points: Sequence[Point], ttft_p99_s: float, max_cold_start_share: float | None = None) -> Point:
    """The point nearest the target: fewest requests unanswered (timed out or refused
    at capacity), then the smallest
    relative excess over the p99 target (plus over the cold-start share cap), then cost."""
    def shortfall(p: Point) -> tuple[int, float, float]:
        s = p.summary
        excess = math.inf if p.p99 is None else max(0.0, p.p99 / ttft_p99_s - 1)
        if max_cold_start_share is not None:
            cap = max(max_cold_start_share, 1e-9)
            excess += max(0.0, s["cold_start_share"] / cap - 1)
        return _unanswered(s), excess, s["usd"]
    return min((p for p in points if p.name != ALWAYS_ON), key=shortfall)


def why_not(p: Point, ttft_p99_s: float, max_cold_start_share: float | None, inputs: Inputs) -> str:
    s = p.summary
    reasons = []
    if s["activation_timeouts"]:
        reasons.append(f"{s['activation_timeouts']} requests timed out waiting for a replica")
    if s["capacity_refusals"]:
        reasons.append(f"{s['capacity_refusals']} requests were refused: their pool was full")
    if p.p99 is None:
        reasons.append("no request was served")
    elif p.p99 > ttft_p99_s:
        share = s["cold_start_share"]
        fastest = min((c.standby_load_s for c in inputs.costs.models.values()), default=0.0)
        if share >= 0.01:
            reasons.append(f"TTFT p99 {p.p99:.2f} s > {ttft_p99_s:g} s: {share:.2%} of requests waited for a cold "
                           f"start (1% or more puts a cold-start wait into p99), and the fastest, from a standby "
                           f"worker, takes {fastest:.1f} s to load")
        else:
            reasons.append(f"TTFT p99 {p.p99:.2f} s > {ttft_p99_s:g} s with only {share:.2%} of requests cold: "
                           f"warm requests alone are that slow (prefill of long prompts, queueing)")
    if max_cold_start_share is not None and s["cold_start_share"] > max_cold_start_share:
        reasons.append(f"cold-start share {s['cold_start_share']:.2%} > {max_cold_start_share:.2%}")
    return "; ".join(reasons) or "it meets the target"


def fragment(base: ThawConfig, chosen: Point, configured_models: Sequence[str] | None = None) -> dict[str, Any]:
    """The config keys to paste: every pool's budget and standby band, and each
    configured model's autoscaling keys that the variant changed."""
    cfg = apply_settings(base, chosen.variant.settings)
    out: dict[str, Any] = {}
    if cfg.pools:
        out["pools"] = [{"shape": p.shape, **{k: getattr(p, k) for k in _POOL_KEYS}} for p in cfg.pools]
    names = set(configured_models) if configured_models is not None else {m.name for m in cfg.models}
    models = []
    for old, new in zip(base.models, cfg.models, strict=True):
        if old.name not in names:
            continue
        before, after = old.autoscaling.model_dump(), new.autoscaling.model_dump()
        changed = {k: after[k] for k in after if after[k] != before[k]}
        if changed:
            models.append({"name": new.name, "autoscaling": changed})
    if models:
        out["models"] = models
    return out


def recommendation_text(base: ThawConfig, chosen: Point, always_on: Point | None, info: dict[str, Any],
                        ttft_p99_s: float, max_cold_start_share: float | None = None,
                        configured_models: Sequence[str] | None = None) -> str:
    """The YAML fragment with its comments (the whole text parses as YAML)."""
    s = chosen.summary
    hours = info["duration_s"] / 3600
    cap = "" if max_cold_start_share is None else f", cold-start share <= {max_cold_start_share:.2%}"
    lines = [
        f"# thaw pool recommend: {chosen.name} (the cheapest variant with TTFT p99 <= {ttft_p99_s:g} s{cap} and "
        "no activation timeouts)",
        f"# simulated: ${s['usd']:.2f} over {hours:.2f} h, cold-start share {s['cold_start_share']:.2%}, "
        f"TTFT p99 {chosen.p99:.2f} s; trace {info['file'] or info['source']} ({info['requests']:,} requests, "
        f"{info['models']} models)",
        "# merge these keys into your config; the others stay as they are",
    ]
    body = yaml.safe_dump(fragment(base, chosen, configured_models), sort_keys=False, default_flow_style=False)
    lines.append(body.rstrip("\n"))
    if always_on is not None:
        a = always_on.summary["usd"]
        saved = f"saves ${a - s['usd']:.2f} ({(a - s['usd']) / a:.0%})" if a > 0 else "always-on cost nothing"
        lines.append(f"# vs always-on (a replica per model all the time): ${a:.2f}, TTFT p99 "
                     f"{_fmt_s(always_on.p99)} s; this {saved}")
    return "\n".join(lines) + "\n"


def recommend(args: argparse.Namespace, inputs: Inputs, configured_models: Sequence[str] | None = None) -> int:
    """`thaw pool recommend`: the YAML on stdout; exit 1 (saying what came closest)
    when no variant meets the target."""
    swept = _sweep(args, inputs)
    if isinstance(swept, int):
        return swept
    points, axes, wall_s = swept
    info = trace_info(inputs, args.trace)
    if args.out is not None:
        meta = {"command": "thaw pool recommend", "config": str(args.config),
                "model_template": args.model_template, "trace": info}
        _write(args.out, args.out / "frontier.png", points, axes, inputs, meta)
    print(f"simulated {len(points)} variants in {wall_s:.1f} s {_ran(args)}", file=sys.stderr)
    target, cap = args.ttft_p99_s, args.max_cold_start_share
    always_on = next((p for p in points if p.name == ALWAYS_ON), None)
    chosen = choose(points, target, cap)
    if chosen is None:
        near = closest(points, target, cap)
        cap_text = f", cold-start share <= {cap:.2%}" if cap is not None else ""
        msg = (f"thaw: error: no variant meets TTFT p99 <= {target:g} s{cap_text} with no activation timeouts; "
               f"closest: {near.name} (${near.summary['usd']:.2f}, TTFT p99 {_fmt_s(near.p99)} s, cold-start "
               f"share {near.summary['cold_start_share']:.2%}): {why_not(near, target, cap, inputs)}")
        if always_on is not None and meets(always_on, target, cap):
            msg += f". Only always-on meets it, at ${always_on.summary['usd']:.2f}"
        print(msg, file=sys.stderr)
        return EXIT_FAILED
    sys.stdout.write(recommendation_text(inputs.cfg, chosen, always_on, info, target, cap, configured_models))
    return EXIT_OK
