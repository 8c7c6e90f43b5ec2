"""The best any keep-alive policy could do on a trace, with perfect foresight
(`thaw simulate --oracle`): the yardstick a policy's cold starts are measured against.

The accounting, per model of the trace (one replica: keep-alive is about the time a
model has none):

- each request is busy from its arrival for its serving time (``input_tokens /
  prefill_tokens_per_s + output_tokens * tpot_s``, the simulator's cost model); the
  busy intervals merged are when the replica is in use, and the **gaps** between them
  are when a keep-alive policy decides;
- in each gap a policy either keeps the replica (it costs the gap's length in idle
  replica-seconds, and the next request is hot) or lets it go (it costs no idle time
  after the release, and the next request is a cold start);
- a model's first request is a cold start whatever the policy (no foresight before
  the trace: scheduled pre-warm is another matter).

A fixed timeout ``T`` keeps every gap up to ``T`` and pays ``T`` of idle time in each
longer gap before it lets go. The oracle, given a budget of idle replica-seconds, keeps
the shortest gaps that fit: every kept gap saves exactly one cold start, so the most
gaps for the budget are the shortest ones (exchange argument), and no policy with the
same idle time can have fewer cold starts. ``distance`` puts a policy's (idle time,
cold starts) against the oracle at the same idle time.

A second yardstick sits between the two: **each model its own fixed timeout, chosen
knowing its whole trace** (``per_model_timeouts_cold_starts``). It is the best any
policy that gives a model one timeout can do, so the distance from a learned policy
to it is what better learning could still win, and the distance from it to the oracle
is what only a policy that tells one gap from the next (pre-warm, the time of day) can.
For a model with sorted gaps ``g_1..g_m`` the timeout ``g_i`` (or 0) costs
``g_1 + .. + g_i + (m - i) g_i`` idle seconds and ``m - i`` cold starts; the frontier
over all models is the lower convex hull of each model's options, merged by slope
(the Lagrangian relaxation). Its vertices are real choices of timeouts, so the count at
a budget is the last vertex within it: what such a policy reaches at that cost, though a
choice off the hull might reach one or two cold starts fewer between vertices.

A per-model timeout chosen in hindsight is fitted to the very gaps it is judged on, so
part of its distance below a learned policy is that fit, which no learner can have.
**Each half of a model's gaps judged with the timeout the other half chooses**
(``cross_fitted_timeouts_cold_starts``: the first half's timeout is the one that serves
the second half best and so on, each at a price per cold start ``lam`` common to all
models, ``lam`` swept; a half with no gap gets the blind policy's timeout, ``lam``
itself) is what a policy with half a day of each model's own history could reach. It
still knows more than a policy learning on the day (the first half is judged with the
second half's choice); where a learned policy comes near it, what is left is not
learning.

A third asks whether a model's recent past tells its next gap: **a timeout per model
and per class of the gap before** (octaves from a minute; ``by_previous_gap``), again in
hindsight. Any split of the gaps into classes lowers a hindsight frontier (each class is
fitted to itself), so the same split with its labels shuffled within each model is
reported beside it (``shuffled_classes``, a seeded permutation): what the previous gap
wins beyond its shuffled control is what a policy that learns from recent gaps could
win; where the two agree the last gap says nothing of the next.

Pure: arrays in, numbers out; the CLI shell is ``run_oracle``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from simulator.costs import CostModel
from simulator.gen_cli import fail
from simulator.traces import Trace
from thaw.exits import EXIT_INVALID, EXIT_OK

# The fixed timeouts `thaw simulate --oracle` puts against the oracle (seconds).
TIMEOUTS_S = (60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14_400.0)
# The prices per cold start (idle seconds) the cross-fitted timeouts are chosen at.
CROSS_FIT_PRICES_S = tuple(float(x) for x in np.geomspace(1.0, 1e6, 4001))
# Classes of the gap before (``by_previous_gap``): below a minute, then octaves up to
# 256 minutes and longer; a model's first gap is a class of its own.
PREVIOUS_GAP_EDGES_S = tuple(60.0 * 2**k for k in range(9))
SHUFFLE_SEED = 1


def timeouts_frontier(groups: Sequence[np.ndarray], base_cold_starts: int) -> tuple[np.ndarray, np.ndarray]:
    """(idle seconds, cold starts) at the vertices of the frontier where each group of
    gaps has its own fixed timeout, from ``base_cold_starts`` (every gap cold)."""
    steps: list[tuple[float, float, int]] = []  # (slope, idle added, cold starts saved)
    for g in groups:
        if not len(g):
            continue
        _, idle = _timeout_options(g)
        hull = _lower_hull(idle)
        for a, b in zip(hull, hull[1:], strict=False):
            steps.append((float(idle[b] - idle[a]) / (b - a), float(idle[b] - idle[a]), b - a))
    steps.sort(key=lambda t: t[0])
    xs, ys = [0.0], [float(base_cold_starts)]
    for _, d_idle, saved in steps:
        xs.append(xs[-1] + d_idle)
        ys.append(ys[-1] - saved)
    return np.asarray(xs), np.asarray(ys)


def _timeout_at_prices(gaps: np.ndarray, prices: np.ndarray) -> np.ndarray:
    """The timeout that serves ``gaps`` best at each price per cold start (the least
    idle seconds plus price x cold starts; 0 or one of the gaps, the shorter on a tie),
    or the price itself where there is no gap."""
    if not len(gaps):
        return prices.copy()
    timeout, idle = _timeout_options(gaps)
    hull = _lower_hull(idle)
    # Each step along the hull saves cold starts at a rising cost in idle seconds per
    # cold start; a price takes every step that costs less than it.
    steps = np.diff(idle[hull]) / np.diff(hull)
    return timeout[np.asarray(hull)[np.searchsorted(steps, prices, side="left")]]


def _timeout_options(gaps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A group's timeouts worth trying, 0 and each of its gaps ascending (option ``i``
    saves ``i`` cold starts), and the idle seconds each costs over the gaps: the ``i``
    shortest kept whole, ``timeout[i]`` held in each longer one."""
    g = np.sort(np.asarray(gaps, dtype=float))
    m = len(g)
    timeout = np.concatenate([[0.0], g])
    return timeout, np.concatenate([[0.0], np.cumsum(g)]) + (m - np.arange(m + 1)) * timeout


def _lower_hull(idle: np.ndarray) -> list[int]:
    """The options on the lower convex hull of (cold starts saved i, ``idle[i]``)."""
    hull: list[int] = [0]  # option i saves i cold starts
    for i in range(1, len(idle)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b is not on the lower hull if a -> i saves at least as much per second.
            if (idle[b] - idle[a]) * (i - a) >= (idle[i] - idle[a]) * (b - a):
                hull.pop()
            else:
                break
        hull.append(i)
    return hull


def _judged(sorted_gaps: np.ndarray, timeouts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Idle seconds and cold starts over ``sorted_gaps`` (ascending) of each timeout:
    every gap it bridges kept whole, the timeout held in each longer one."""
    g = sorted_gaps
    kept = np.searchsorted(g, timeouts, side="right")
    cum = np.concatenate([[0.0], np.cumsum(g)])
    return cum[kept] + (len(g) - kept) * timeouts, (len(g) - kept).astype(float)


def cross_fitted_frontier(groups: Sequence[np.ndarray], base_cold_starts: int,
                          prices: Sequence[float] = CROSS_FIT_PRICES_S) -> tuple[np.ndarray, np.ndarray]:
    """(idle seconds, cold starts) at each price: every group's gaps (in time order)
    split into halves, each half judged with the timeout the other half chooses at that
    price. Sorted by idle seconds, cold starts the fewest at that idle time or less."""
    lam = np.asarray(prices, dtype=float)
    idle = np.zeros(len(lam))
    cold = np.full(len(lam), float(base_cold_starts))
    for g in groups:
        g = np.asarray(g, dtype=float)
        half = len(g) // 2
        for fit, judged in ((g[:half], g[half:]), (g[half:], g[:half])):
            if len(judged):
                i, c = _judged(np.sort(judged), _timeout_at_prices(fit, lam))
                idle += i
                cold += c - len(judged)  # base counts every gap cold
    order = np.argsort(idle, kind="stable")
    return np.concatenate([[0.0], idle[order]]), np.minimum.accumulate(
        np.concatenate([[float(base_cold_starts)], cold[order]]))


def previous_gap_classes(gaps: np.ndarray) -> np.ndarray:
    """Each gap's class (one model's gaps in time order): 0 for the first, else 1 + the
    octave of the gap before it (``PREVIOUS_GAP_EDGES_S``)."""
    out = np.zeros(len(gaps), dtype=int)
    if len(gaps) > 1:
        out[1:] = 1 + np.searchsorted(np.asarray(PREVIOUS_GAP_EDGES_S), gaps[:-1], side="right")
    return out


def split_by(groups: Sequence[np.ndarray], labels: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each group's gaps split by their labels."""
    return [g[lab == c] for g, lab in zip(groups, labels, strict=True) for c in np.unique(lab)]


def _at(frontier: tuple[np.ndarray, np.ndarray], idle_s: float) -> int:
    xs, ys = frontier
    return int(ys[int(np.searchsorted(xs, idle_s, side="right")) - 1])


def idle_periods(arrivals: Sequence[float], busy_s: Sequence[float]) -> list[tuple[float, float]]:
    """The idle periods of one model's replica, each as (when it began, how long):
    between the merged busy intervals ``[arrival, arrival + busy)`` of its requests (in
    any order)."""
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i])
    periods: list[tuple[float, float]] = []
    end: float | None = None
    for i in order:
        start = arrivals[i]
        if end is not None and start > end:
            periods.append((end, start - end))
        end = max(end if end is not None else start, start + busy_s[i])
    return periods


def idle_gaps(arrivals: Sequence[float], busy_s: Sequence[float]) -> list[float]:
    """The lengths of :func:`idle_periods`."""
    return [gap for _, gap in idle_periods(arrivals, busy_s)]


@dataclass(frozen=True)
class Gaps:
    """Every model's idle gaps, pooled: the oracle and fixed timeouts read only these."""

    models: int  # models with at least one request: each has one unavoidable cold start
    gaps: np.ndarray  # sorted ascending
    busy_s: float  # replica-seconds in use, the same under every policy
    # Each model's gaps in time order: for the per-model timeouts in hindsight.
    by_model: tuple[np.ndarray, ...] = ()
    # When each of them began (trace seconds), whose they are, and when each model's
    # first request came.
    starts: tuple[np.ndarray, ...] = ()
    names: tuple[str, ...] = ()
    first_arrivals: tuple[float, ...] = ()

    @cached_property
    def cumulative(self) -> np.ndarray:
        return np.cumsum(self.gaps)

    @cached_property
    def _per_model_frontier(self) -> tuple[np.ndarray, np.ndarray]:
        """(idle seconds, cold starts) at the vertices of the per-model timeouts' frontier."""
        return timeouts_frontier(self.by_model, self.models + len(self.gaps))

    @cached_property
    def _previous_gap_frontiers(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """The frontiers of a timeout per model and class of the gap before, and of the
        same classes shuffled within each model."""
        groups = [np.asarray(g, dtype=float) for g in self.by_model]
        labels = [previous_gap_classes(g) for g in groups]
        rng = np.random.default_rng(SHUFFLE_SEED)
        shuffled = [rng.permutation(lab) for lab in labels]
        base = self.models + len(self.gaps)
        return (timeouts_frontier(split_by(groups, labels), base),
                timeouts_frontier(split_by(groups, shuffled), base))

    def by_previous_gap_cold_starts(self, idle_s: float) -> tuple[int, int] | None:
        """The cold starts within ``idle_s`` with a timeout per model and class of the
        gap before, chosen in hindsight, and with those classes shuffled (the control);
        None without the models' gaps."""
        if not self.by_model and len(self.gaps):
            return None
        by_previous, shuffled = self._previous_gap_frontiers
        return _at(by_previous, idle_s), _at(shuffled, idle_s)

    @cached_property
    def _cross_fitted_frontier(self) -> tuple[np.ndarray, np.ndarray]:
        return cross_fitted_frontier(self.by_model, self.models + len(self.gaps))

    def cross_fitted_timeouts_cold_starts(self, idle_s: float) -> int | None:
        """The cold starts within ``idle_s`` when each half of a model's gaps has the
        timeout the other half chooses, at the price that fits (the fewest of those
        within it); None without the models' gaps."""
        if not self.by_model and len(self.gaps):
            return None
        return _at(self._cross_fitted_frontier, idle_s)

    def per_model_timeouts_cold_starts(self, idle_s: float) -> int | None:
        """The cold starts within ``idle_s`` seconds of idle time when each model has one
        fixed timeout, chosen knowing its whole trace (the last vertex of the frontier
        that fits); None without the models' gaps."""
        if not self.by_model and len(self.gaps):
            return None
        return _at(self._per_model_frontier, idle_s)

    def oracle_cold_starts(self, idle_s: float) -> int:
        """The fewest cold starts any keep-alive policy can have with ``idle_s`` seconds
        of idle replica time: the shortest gaps kept while they fit."""
        kept = int(np.searchsorted(self.cumulative, idle_s, side="right"))
        return self.models + len(self.gaps) - kept

    def oracle_idle_s(self, cold_starts: int) -> float:
        """The least idle time that gets cold starts down to ``cold_starts``."""
        need = self.models + len(self.gaps) - cold_starts
        if need <= 0:
            return 0.0
        if need > len(self.gaps):
            return float("inf")
        return float(self.cumulative[need - 1])

    def budget_where_fixed_is(self, ratio: float) -> float | None:
        """The idle seconds where a fixed timeout, lengthened from a second, first has
        ``ratio`` times the oracle's cold starts (between two timeouts of a fine grid,
        interpolated); None where none does up to a day."""
        before: tuple[float, float] | None = None
        for timeout in np.geomspace(1.0, 86_400.0, 2001):
            idle, cold = self.fixed_timeout(float(timeout))
            best = self.oracle_cold_starts(idle)
            if not best:
                continue
            r = cold / best
            if before is not None and (before[1] - ratio) * (r - ratio) <= 0 and r != before[1]:
                return before[0] + (idle - before[0]) * (ratio - before[1]) / (r - before[1])
            before = (idle, r)
        return None

    def fixed_timeout(self, timeout_s: float) -> tuple[float, int]:
        """A fixed keep-alive of ``timeout_s``: its idle replica-seconds and cold starts."""
        idle, cold = _judged(self.gaps, np.asarray([timeout_s], dtype=float))
        return float(idle[0]), self.models + int(cold[0])


def gaps_of(trace: Trace, costs: CostModel) -> Gaps:
    """The trace's gaps under the cost model's serving times (a model it does not
    know serves with the first model's figures: the trace's models are configured from
    one template)."""
    t = np.asarray(trace.t, dtype=float)
    model = np.asarray(trace.model)
    prompt, output = np.asarray(trace.input_tokens), np.asarray(trace.output_tokens)
    fallback = next(iter(costs.models.values()))
    all_gaps: list[float] = []
    by_model: list[np.ndarray] = []
    starts: list[np.ndarray] = []
    names: list[str] = []
    firsts: list[float] = []
    busy = 0.0
    models = 0
    for code, name in enumerate(trace.models):
        idx = np.nonzero(model == code)[0]
        if not len(idx):
            continue
        c = costs.models.get(name, fallback)
        serve = prompt[idx] / c.prefill_tokens_per_s + output[idx] * c.tpot_s
        arrivals = t[idx]
        periods = idle_periods(arrivals.tolist(), serve.tolist())
        gaps = [gap for _, gap in periods]
        models += 1
        all_gaps.extend(gaps)
        by_model.append(np.asarray(gaps, dtype=float))
        starts.append(np.asarray([at for at, _ in periods], dtype=float))
        names.append(name)
        firsts.append(float(arrivals.min()))
        # In use: the trace's span of this model less its gaps.
        busy += float((arrivals + serve).max() - arrivals.min()) - sum(gaps)
    return Gaps(models, np.sort(np.asarray(all_gaps, dtype=float)), busy, tuple(by_model), tuple(starts),
                tuple(names), tuple(firsts))


def distance(g: Gaps, idle_s: float, cold_starts: int) -> dict[str, Any]:
    """A policy's point against the oracle at the same idle time: the extra cold starts,
    and the ratio of its cold starts to the oracle's."""
    best = g.oracle_cold_starts(idle_s)
    per_model = g.per_model_timeouts_cold_starts(idle_s)
    cross_fitted = g.cross_fitted_timeouts_cold_starts(idle_s)
    by_previous = g.by_previous_gap_cold_starts(idle_s)
    return {"idle_replica_hours": round(idle_s / 3600, 3), "cold_starts": cold_starts,
            "oracle_cold_starts": best, "extra_cold_starts": cold_starts - best,
            "vs_oracle": round(cold_starts / best, 3) if best else None,
            "per_model_timeouts_cold_starts": per_model,
            "cross_fitted_timeouts_cold_starts": cross_fitted,
            "by_previous_gap_cold_starts": by_previous[0] if by_previous else None,
            "shuffled_classes_cold_starts": by_previous[1] if by_previous else None}


def oracle_report(g: Gaps, timeouts_s: Sequence[float] = TIMEOUTS_S) -> dict[str, Any]:
    """Each fixed timeout against the oracle, and the oracle's frontier at the same
    budgets."""
    rows = []
    for timeout in timeouts_s:
        idle, cold = g.fixed_timeout(timeout)
        rows.append({"policy": f"fixed {timeout:g} s", "timeout_s": timeout, **distance(g, idle, cold)})
    return {"models": g.models, "gaps": len(g.gaps), "busy_replica_hours": round(g.busy_s / 3600, 3),
            "always_warm_idle_replica_hours": round(float(g.gaps.sum()) / 3600, 3),
            "fewest_cold_starts": g.models, "policies": rows}


def format_report(doc: dict[str, Any]) -> str:
    head = (f"{doc['models']} models, {doc['gaps']} idle gaps; busy {doc['busy_replica_hours']:.1f} replica-h, "
            f"every gap kept {doc['always_warm_idle_replica_hours']:.1f} idle replica-h")
    rows = [("policy", "idle replica-h", "cold starts", "oracle's at that cost", "extra", "x oracle",
             "per-model timeouts (hindsight)", "(cross-fitted)", "by previous gap", "shuffled")]

    def count(v: int | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    for r in doc["policies"]:
        rows.append((r["policy"], f"{r['idle_replica_hours']:.2f}", str(r["cold_starts"]),
                     str(r["oracle_cold_starts"]), str(r["extra_cold_starts"]),
                     "-" if r["vs_oracle"] is None else f"{r['vs_oracle']:.2f}",
                     count(r.get("per_model_timeouts_cold_starts")), count(r.get("cross_fitted_timeouts_cold_starts")),
                     count(r.get("by_previous_gap_cold_starts")),
                     count(r.get("shuffled_classes_cold_starts"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)).rstrip()
             for r in rows]
    return "\n".join([head, *lines])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--oracle", action="store_true",
                   help="the best any keep-alive policy could do with perfect foresight, against fixed "
                        "timeouts at the same idle replica time (writes oracle.json into --out-dir, or to "
                        "--out-dir itself when it ends in .json)")


def run_oracle(args: argparse.Namespace, trace: Trace, costs: CostModel) -> int:
    """`thaw simulate --oracle`: the table on stdout, the figures in JSON."""
    if not costs.models:
        return fail("--oracle: no model to take serving times from", EXIT_INVALID)
    doc = {"command": "thaw simulate --oracle", "config": str(args.config), "trace_file": str(args.trace),
           **oracle_report(gaps_of(trace, costs))}
    out = Path(args.out)
    path = out if out.suffix == ".json" else out / "oracle.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(format_report(doc), flush=True)
    print(f"wrote {path}", file=sys.stderr)
    return EXIT_OK
