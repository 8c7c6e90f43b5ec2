"""`thaw load calibrate`: the simulator against the live stack, side by side.

    thaw load calibrate --out-dir DIR [--models 3] [--size tiny] [--idle-grace-s 10] [--reps 2]
                        [--trace-source FILE] [--trace-start-s 0] [--duration-s 240] [--speedup 4]
                        [--rate-per-s 0.3] [--zipf-s 1] [--seed 0] [--tick-s 0.25]

One run, on this machine:

1. **The stack.** `thaw up` as a subprocess in ``DIR/work`` (free ports, an embedded
   store), serving N models (the demo model pushed under N URIs), a local pool of one
   standby and at most two instances, a short ``idle_grace_s`` so models go to zero
   within the run. Stopped with SIGTERM at the end and waited for; anything of it still
   alive after that is killed (every process it started is remembered as it appears).
2. **The cost model, measured against that stack** before the replay
   (:func:`costs_from_measurements` says how each figure is taken): per tier (s3, host,
   disk) a cold start of a model at zero with the worker's caches prepared as
   ``thaw bench cold-start`` prepares them, less the hot TTFT of the same request;
   releases (release decision → standby) and launches (launch decision → standby)
   from the controller's events and the workers' states; prefill tokens/s and seconds
   per output token from hot requests alone on a replica, their sizes drawn from the
   trace. Written to ``DIR/costs.json`` (the simulator's costs file) with the samples in
   ``DIR/cost_samples.json``.
3. **The trace** (:func:`build_trace`): a window of a public trace (default Azure's
   2023 conversation trace), thinned to a rate this CPU can serve, sped up, its
   requests dealt over the N models with Zipf popularity by seed, token counts capped;
   written to ``DIR/trace.csv`` (generic), which both the live run and the simulator read.
4. **The live run**: `thaw load run`'s replay of ``DIR/trace.csv`` (open loop), the
   controller polled for replicas, into ``DIR/live`` (`thaw load report DIR/live` works
   on it). Then **the simulation** of the same config (the measured boot time as the
   shape's ``boot_s``), trace and ``costs.json``, ticking as the controller does, into
   ``DIR/sim``.
5. **Side by side** (:func:`compare`, :func:`verdict`): cold starts (total and per
   tier), replica-seconds (per model and total), TTFT p50/p90/p99 (all, cold, hot),
   requests and errors, each with (sim - live) / live; the goal: cold starts within
   ±10 % and p90 TTFT within ±25 % of the live run. Printed, and written to
   ``DIR/calibration.json`` with ``DIR/calibration_ttft_cdf.png`` and
   ``DIR/calibration_timeline.png``.

The arithmetic (trace, config, cost model, comparison, verdict) is pure functions at
the top; the stack, the probes and the replay below them. Exit 0 when the run completed
(whatever the verdict), 1 when it failed, 2 for bad options.

One piece: one benchmark (stack, measurement, replay, comparison, report), read top to
bottom as its report reads; its parts share the run's settings and nothing else uses them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadtests.load_schema import (
    CALIBRATION_FILE,
    CALIBRATION_TRACE_FILE,
    COST_SAMPLES_FILE,
    COSTS_FILE,
    REPLICAS_FILE,
    REQUESTS_FILE,
    RUN_FILE,
    Calibration,
    CostFigure,
    CostMeasurements,
    CostModelReport,
    Goal,
    HotSample,
    Interval,
    ReplicaSample,
    RequestRecord,
    RunConfig,
    RunInfo,
    SideBySide,
    TierProbe,
    TraceInfo,
    TraceParams,
    Verdict,
)
from loadtests.load_stats import completed, percentile, tpot_ms
from thaw.cli.aliases import add_renamed_flag
from thaw.units import GiB

if TYPE_CHECKING:
    from simulator.sim import SimResult
    from simulator.traces import Trace
    from warm_pool.policy.decisions import Decision

API_KEY = "thaw-calibrate-key"
SHAPE = "cpu-local"
MODEL_PREFIX = "calib-m"
BUCKET = "thaw"
MAX_CONTEXT_TOKENS = 2048
# Where a cold start's replica got the model (thaw.wire.Tier without "hot"), in the order
# the tables show them.
COLD_TIERS = ("asleep", "host", "disk", "s3", "launch")
# The tiers the cost phase measures, in the order one rep runs them: an s3 load fills
# both caches, so the host probe after it needs no filling, and the disk probe only
# drops the host copy.
PROBE_TIERS = ("s3", "host", "disk")
# The goal: |sim - live| / live at most this, per metric.
GOALS = {"cold_starts": 0.10, "ttft_s.p90": 0.25}
DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023_conv.csv"
CITATIONS = {
    "azure_llm_2023_conv": "Azure LLM inference trace 2023, conversation service: Azure/AzurePublicDataset "
                           "data/AzureLLMInferenceTrace_conv.csv (Patel et al., Splitwise, ISCA'24), CC-BY-4.0",
    "azure_llm_2023_code": "Azure LLM inference trace 2023, code service: Azure/AzurePublicDataset "
                           "data/AzureLLMInferenceTrace_code.csv (Patel et al., Splitwise, ISCA'24), CC-BY-4.0",
}
# The probe request of the tier measurements: a short prompt, a few tokens.
PROBE_INPUT_TOKENS = 64
PROBE_MAX_TOKENS = 8
HOT_PROBES_PER_COLD = 3
# The controller's tick (warm_pool.manager's poll interval): the simulator ticks the same.
CONTROLLER_TICK_S = 0.25


class CalibrationError(RuntimeError):
    """The calibration could not measure or run something it needs."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `thaw load calibrate`."""
    add_renamed_flag(p, "--out", "--out-dir", dest="out", type=Path)
    p.add_argument("--out-dir", dest="out", required=True, type=Path, metavar="DIR",
                   help="where costs.json, trace.csv, live/, sim/, calibration.json and the plots go")
    p.add_argument("--models", type=int, default=3, metavar="N", help="models served (default 3)")
    p.add_argument("--size", default="tiny", help="demo model size: 'tiny' (11 MB, default) or e.g. 256MiB")
    p.add_argument("--idle-grace-s", type=float, default=10.0, metavar="S",
                   help="the models' idle_grace_s: they go to zero this long after their last request (default 10)")
    p.add_argument("--reps", type=int, default=2, help="cold-start probes per tier for the cost model (default 2)")
    p.add_argument("--hot-requests", type=int, default=12, metavar="K",
                   help="hot requests for prefill tokens/s and seconds per output token (default 12)")
    p.add_argument("--trace-source", type=Path, default=DEFAULT_TRACE, metavar="FILE",
                   help="the Azure LLM 2023 trace the calibration trace is cut from "
                        "(default: the project's copy of the conversation trace)")
    p.add_argument("--trace-start-s", type=float, default=0.0, metavar="S",
                   help="the window's start in the source trace (default 0)")
    p.add_argument("--duration-s", type=float, default=240.0, metavar="S",
                   help="the calibration trace's length after compression (default 240)")
    p.add_argument("--speedup", type=float, default=4.0,
                   help="the source window is duration x speedup long, replayed this much faster (default 4)")
    p.add_argument("--rate-per-s", type=float, default=0.3, metavar="R",
                   help="mean arrivals per second after compression, all models together (default 0.3)")
    p.add_argument("--zipf-s", type=float, default=1.0,
                   help="model k (from 0) draws a request with weight 1/(k+1)^s (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seeds the thinning, the models and the prompts")
    p.add_argument("--max-input-tokens", type=int, default=1536, metavar="N",
                   help="cap on a request's input tokens (the demo model's context is 2048; default 1536)")
    p.add_argument("--max-output-tokens", type=int, default=32, metavar="N",
                   help="cap on a request's output tokens (default 32, so CPU engines keep up)")
    p.add_argument("--tick-s", type=float, default=CONTROLLER_TICK_S, metavar="S",
                   help=f"the simulator's tick (default {CONTROLLER_TICK_S:g}: the controller's)")
    p.add_argument("--timeout-s", type=float, default=300.0, metavar="S",
                   help="longest wait for any one step: a request, the stack settling (default 300)")
    p.add_argument("--keep-work", action="store_true",
                   help="keep DIR/work (the store's data, the stack's data dir); its logs are kept either way")


# -- the trace (pure) ---------------------------------------------------------------------


def model_names(n: int, prefix: str = MODEL_PREFIX) -> list[str]:
    """The N models' names: ``simulator.traces.spread_models``'s ``<prefix>NNN``."""
    width = max(3, len(str(n - 1)))
    return [f"{prefix}{k:0{width}d}" for k in range(n)]


def build_trace(source: Trace, p: TraceParams, prefix: str = MODEL_PREFIX) -> Trace:
    """The calibration trace from a one-service source trace: the window of
    ``duration_s x speedup`` seconds from ``start_s``, each request kept with the
    probability that leaves ``rate_per_s x duration_s`` of them on average, sped up
    ``speedup`` times, dealt over ``models`` models with Zipf popularity, input and
    output tokens capped (output at least 1). Deterministic given ``p.seed``."""
    import numpy as np

    from simulator.traces import from_columns, speedup, spread_models, thin, window

    src = window(source, p.start_s, p.duration_s * p.speedup)
    if not len(src):
        raise ValueError(f"the source has no request in [{p.start_s:g}, {p.start_s + p.duration_s * p.speedup:g}) s")
    keep = min(1.0, p.rate_per_s * p.duration_s / len(src))
    tr = spread_models(speedup(thin(src, keep, p.seed), p.speedup), p.models, p.seed, zipf_s=p.zipf_s,
                       prefix=prefix)
    inp = np.minimum(np.asarray(tr.input_tokens, dtype=np.int64), p.max_input_tokens)
    out = np.clip(np.asarray(tr.output_tokens, dtype=np.int64), 1, p.max_output_tokens)
    return from_columns(tr.t, tr.model, tr.tenant, inp, out, tr.models, tr.tenants,
                        f"{tr.source} | tokens capped {p.max_input_tokens}/{p.max_output_tokens}")


def hot_sizes(trace: Trace, k: int) -> list[tuple[int, int]]:
    """``k`` (input, output) token counts spread evenly over the trace's requests ordered
    by input size (its smallest, its largest and evenly between): hot requests of these
    sizes weigh the prefill rate as the trace's mix does."""
    if k < 1 or not len(trace):
        return []
    order = sorted(range(len(trace)), key=lambda i: (trace.input_tokens[i], i))
    picks = [order[round(j * (len(order) - 1) / max(1, k - 1))] for j in range(k)]
    return [(trace.input_tokens[i], trace.output_tokens[i]) for i in picks]


# -- the stack's config (pure) --------------------------------------------------------------


@dataclass(frozen=True)
class StackSettings:
    """What the calibration's stack runs: its models and pool (the rest is the defaults)."""

    models: list[str]
    idle_grace_s: float
    activation_timeout_s: float
    host_cache_gib: float
    disk_cache_gib: float
    standby_min: int = 1
    standby_max: int = 1
    max_instances: int = 2
    # The config's boot_s (only the standby sizer reads it on a live stack, and with
    # standby_min == standby_max its target is that whatever boot_s says).
    boot_s: float = 10.0


def model_uri(name: str) -> str:
    return f"s3://{BUCKET}/calibrate/{name}"


def stack_config(s: StackSettings, *, data_dir: Path, server_port: int, controller_port: int,
                 s3_port: int) -> dict[str, Any]:
    """A ``thaw up`` config: an embedded store, one CPU shape with both weight caches, a
    local pool, the models (eager, Thaw's loader, scale to zero after ``idle_grace_s``)."""
    from thaw.config import hash_api_key

    def model(name: str) -> dict[str, Any]:
        return {
            "name": name, "uri": model_uri(name), "served_name": name, "demo_if_missing": False,
            "max_context_tokens": MAX_CONTEXT_TOKENS, "shape": SHAPE,
            "engine": {"enforce_eager": True, "cpu_kvcache_gib": 1, "load_format": "thaw"},
            "autoscaling": {"min_replicas": 0, "max_replicas": 1, "idle_grace_s": s.idle_grace_s,
                            "activation_timeout_s": s.activation_timeout_s, "max_queue_length": 64,
                            "max_concurrency_per_replica": 32, "keep_alive": "fixed"},
        }

    return {
        "data_dir": str(data_dir), "log_level": "info",
        "server": {"host": "127.0.0.1", "port": server_port},
        "controller": {"host": "127.0.0.1", "port": controller_port},
        "object_store": {"kind": "embedded", "bucket": BUCKET, "credentials": {"source": "generated"},
                         "embedded": {"s3_port": s3_port, "startup_timeout_s": 120}},
        "shapes": [{"name": SHAPE, "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8 + s.host_cache_gib,
                    "price_per_hour_usd": 0.0, "boot_timeout_s": 180, "boot_s": s.boot_s,
                    "cache": {"dir": str(data_dir / "cache" / "weights"), "max_gib": s.disk_cache_gib,
                              "verify_sha256": True},
                    "host_cache_gib": s.host_cache_gib}],
        "pools": [{"shape": SHAPE, "provider": "local", "standby_min": s.standby_min,
                   "standby_max": s.standby_max, "max_instances": s.max_instances}],
        "models": [model(n) for n in s.models],
        "tenants": [{"name": "calibrate", "api_key_hashes": [hash_api_key(API_KEY)], "allowed_models": ["*"]}],
    }


def simulated_config(cfg: Mapping[str, Any], boot_s: float) -> dict[str, Any]:
    """The stack's config as the simulator runs it: the same, the shape's ``boot_s`` the
    measured launch time (the simulator takes it as how long a launch takes)."""
    out = copy.deepcopy(dict(cfg))
    for shape in out["shapes"]:
        shape["boot_s"] = round(boot_s, 3)
    return out


# -- the stack's state (pure) -------------------------------------------------------------------


def workers_of(state: Mapping[str, Any], shape: str = SHAPE) -> list[dict[str, Any]]:
    """The workers of ``shape`` in a ``/v1/state``, each row merged with its details."""
    details = {d["id"]: d for d in state.get("worker_details", [])}
    return [{**details.get(w["id"], {}), **w} for w in state.get("workers", [])
            if details.get(w["id"], {}).get("shape", shape) == shape]


def settled(state: Mapping[str, Any], standby: int, shape: str = SHAPE) -> bool:
    """Every model at zero and exactly ``standby`` workers, each standing by with no
    model: where the simulator starts (a pool at its standby floor, already up)."""
    if any(n for m in state.get("models", []) for n in (m.get("replicas") or {}).values()):
        return False
    ws = workers_of(state, shape)
    return len(ws) == standby and all(w["state"] == "standby" and not w.get("model") for w in ws)


def booting(state: Mapping[str, Any]) -> bool:
    """A worker is launching or starting (its engine host importing vLLM: a core busy)."""
    return any(w["state"] in ("launching", "starting") for w in state.get("workers", []))


@dataclass(frozen=True)
class Transition:
    """A worker seen in a new state (or gone) at ``t`` (epoch seconds)."""

    t: float
    worker_id: str
    state: str  # a WorkerState value, or "gone"
    model: str | None = None


def transitions(prev: Mapping[str, tuple[str, str | None]], state: Mapping[str, Any],
                t: float) -> tuple[list[Transition], dict[str, tuple[str, str | None]]]:
    """What changed between the last poll's workers (``prev``: id -> (state, model)) and
    this ``/v1/state``; returns the transitions and the new map."""
    now = {w["id"]: (w["state"], w.get("model")) for w in state.get("workers", [])}
    out = [Transition(t, wid, s, m) for wid, (s, m) in now.items() if prev.get(wid) != (s, m)]
    out += [Transition(t, wid, "gone") for wid in prev if wid not in now]
    return out, now


# A released worker drains, then starts a fresh engine host (``starting`` while it
# imports vLLM) before it stands by again: all of it is the release.
_RELEASING = frozenset(("draining", "starting"))
_BOOTING = frozenset(("launching", "starting"))


def releases(events: Sequence[Mapping[str, Any]], seen: Sequence[Transition],
             since: float = 0.0, until: float = math.inf) -> list[Interval]:
    """Each release decision (controller event ``release``) in [since, until) to its
    worker's next state past draining and starting again: standby, or (when the poll
    missed a short standby) its next assignment. A worker gone first is skipped."""
    out = []
    for e in events:
        if e.get("kind") != "release" or not e.get("worker_id") or not since <= e["at"] < until:
            continue
        end = next((tr for tr in seen if tr.worker_id == e["worker_id"] and tr.t >= e["at"]
                    and tr.state not in _RELEASING), None)
        if end is not None and end.state != "gone":
            out.append(Interval(worker_id=e["worker_id"], start_at=e["at"], seconds=max(0.0, end.t - e["at"])))
    return out


def boots(events: Sequence[Mapping[str, Any]], seen: Sequence[Transition],
          since: float = 0.0, until: float = math.inf) -> list[Interval]:
    """Each launch decision in [since, until) to its worker's first state past booting
    (standby, or an assignment it got at once). A ``launch`` decision names no worker:
    the ``launched`` events that follow name them, in the order launched."""
    decided = sorted(e["at"] for e in events if e.get("kind") == "launch" and e.get("outcome") == "started")
    out = []
    for e in sorted((e for e in events if e.get("kind") == "launched" and e.get("worker_id")),
                    key=lambda e: e["at"]):
        starts = [t for t in decided if t <= e["at"]]
        if not starts:
            continue
        start = starts[0]
        decided.remove(start)
        if not since <= start < until:
            continue
        end = next((tr for tr in seen if tr.worker_id == e["worker_id"] and tr.t >= start
                    and tr.state not in _BOOTING), None)
        if end is not None and end.state != "gone":
            out.append(Interval(worker_id=e["worker_id"], start_at=start, seconds=max(0.0, end.t - start)))
    return out


# -- the cost model from measurements (pure) --------------------------------------------------


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def probe_ok(p: TierProbe) -> bool:
    """A probe counts when it was served, from the tier it was prepared for."""
    return p.ttft_s is not None and p.served_tier == p.tier and p.error is None


def costs_from_measurements(m: CostMeasurements) -> CostModelReport:
    """The simulator's cost model from the samples, each figure with how it was taken.

    - ``standby_load_s``, ``host_load_s``, ``disk_load_s``: the median over that tier's
      probes of (cold TTFT - the hot TTFT of the same request), the hot one being the
      median of every probe's hot requests: the simulator's cold TTFT is the wait for the
      replica plus the request's own prefill, which it adds itself. The cold TTFT counts
      from the request to its first token: the demand signal, the placement, the load,
      the engine's start and the route's publication are all in it. A tier without a
      probe takes the s3 figure (n 0).
    - ``release_s``: the median of release decision -> the worker standing by again
      (draining, then starting: a fresh engine host imports vLLM).
    - ``prefill_tokens_per_s``: the hot requests' prompt tokens over their TTFTs, summed
      (the simulator's TTFT is tokens / rate, no fixed part: this rate gives the hot
      requests' mean TTFT at the trace's mix of sizes).
    - ``tpot_s``: the median of the hot requests' (last token - first) / (tokens - 1),
      each request alone on its replica.
    - ``weights_gib``: the model's bytes (its manifest).
    - ``asleep_load_s``: not measurable (a CPU shape has no sleep mode, the models'
      ``asleep_ttl_s`` is 0, nothing wakes): the s3 figure, n 0.
    - ``boot_s`` (the simulated shape's): the median of launch decision -> the new
      worker standing by.
    """
    ok = [p for p in m.tier_probes if probe_ok(p)]
    hot_probe = _median([h for p in ok for h in p.hot_ttft_s])
    if hot_probe is None:
        raise CalibrationError("no probe's hot requests were served: the cold starts cannot be split")
    by_tier = {t: [max(0.0, p.ttft_s - hot_probe) for p in ok if p.tier == t and p.ttft_s is not None]
               for t in PROBE_TIERS}
    if not by_tier["s3"]:
        raise CalibrationError("no cold start from the store (tier s3) was measured")
    figures: dict[str, CostFigure] = {}
    s3 = _median(by_tier["s3"])
    assert s3 is not None
    for key, tier in (("standby_load_s", "s3"), ("host_load_s", "host"), ("disk_load_s", "disk")):
        xs = by_tier[tier]
        v = _median(xs)
        figures[key] = CostFigure(
            value=round(v if v is not None else s3, 4), n=len(xs),
            method=(f"median over {len(xs)} cold start(s) of a model at zero with the standby's caches prepared "
                    f"for tier {tier}: request -> first token, less the hot TTFT of the same request "
                    f"({hot_probe:.3f} s, median of {sum(len(p.hot_ttft_s) for p in ok)})") if xs
            else f"not measured (no probe served from tier {tier}): the s3 figure")
    figures["asleep_load_s"] = CostFigure(
        value=figures["standby_load_s"].value, n=0,
        method="not measurable on a CPU shape (no sleep mode; asleep_ttl_s 0, nothing wakes): the s3 figure")
    rel = [r.seconds for r in m.releases]
    r = _median(rel)
    figures["release_s"] = CostFigure(
        value=round(r if r is not None else 0.0, 4), n=len(rel),
        method=(f"median over {len(rel)} release(s): the controller's release decision -> the worker "
                "standing by again (drain, engine stopped, a fresh engine host started and vLLM imported: "
                "draining, then starting), polled every "
                f"{CONTROLLER_TICK_S:g} s") if rel else "not measured (no release seen): 0")
    hot = [h for h in m.hot if h.ttft_s > 0]
    if not hot:
        raise CalibrationError("no hot request was served: prefill and TPOT cannot be measured")
    tokens, secs = sum(h.prompt_tokens for h in hot), sum(h.ttft_s for h in hot)
    figures["prefill_tokens_per_s"] = CostFigure(
        value=round(tokens / secs, 2), n=len(hot),
        method=(f"{tokens} prompt tokens (the server's usage) over {secs:.3f} s of TTFT, summed over {len(hot)} "
                "hot requests alone on a replica, sizes spread over the trace's: TTFT = tokens / rate, "
                "the fixed part of a hot TTFT included"))
    tpots = [h.tpot_s for h in hot if h.tpot_s is not None]
    tp = _median(tpots)
    if tp is None:
        raise CalibrationError("no hot request streamed two tokens: TPOT cannot be measured")
    figures["tpot_s"] = CostFigure(
        value=round(tp, 6), n=len(tpots),
        method=f"median over {len(tpots)} hot requests alone on a replica of (last token - first) / (tokens - 1)")
    figures["weights_gib"] = CostFigure(value=round(m.weights_bytes / GiB, 6), n=1,
                                        method="the model's manifest: total bytes / GiB")
    bt = [b.seconds for b in m.boots]
    b = _median(bt)
    boot = CostFigure(
        value=round(b if b is not None else 0.0, 4), n=len(bt),
        method=(f"median over {len(bt)} launch(es): the controller's launch decision -> the new worker standing "
                f"by (process start, vLLM imported), polled every {CONTROLLER_TICK_S:g} s; the simulated shape's "
                "boot_s") if bt else "not measured (no launch seen): 0")
    return CostModelReport(figures=figures,
                           costs_file={"defaults": {k: f.value for k, f in sorted(figures.items())}},
                           boot_s=boot)


# -- the comparison (pure) ------------------------------------------------------------------------


def rel_diff(live: float | None, sim: float | None) -> float | None:
    """(sim - live) / live; 0 when both are 0; None when live is 0 alone or a side is missing."""
    if live is None or sim is None:
        return None
    if live == 0:
        return 0.0 if sim == 0 else None
    return (sim - live) / live


def row(metric: str, live: float | None, sim: float | None) -> SideBySide:
    return SideBySide(metric=metric, live=live, sim=sim, rel_diff=rel_diff(live, sim))


@dataclass(frozen=True)
class LiveColdStart:
    """One cold start of the live run: the replica (assignment) that ended it, its tier,
    and the TTFT of the first request it served."""

    model: str
    replica: str
    tier: str
    opening_ttft_s: float | None


def live_cold_starts(records: Iterable[RequestRecord]) -> list[LiveColdStart]:
    """The live run's cold starts: one per replica (``x-thaw-replica`` is the assignment)
    that served a request which had waited at zero, with that request's tier; the
    activator counts them the same way (once per assignment, at its first cold byte)."""
    first: dict[tuple[str, str], RequestRecord] = {}
    for r in sorted(records, key=lambda r: r.sent_s):
        if r.tier in (None, "hot") or r.replica is None:
            continue
        first.setdefault((r.model, r.replica), r)
    return [LiveColdStart(model, replica, r.tier or "cold", r.ttft_s if completed(r) else None)
            for (model, replica), r in first.items()]


Steps = list[tuple[float, int]]


def steps_from_samples(samples: Iterable[ReplicaSample], states: Sequence[str] = ("loading", "ready")) -> dict[str, Steps]:
    """Per model, the replicas in ``states`` at each poll: a step function."""
    out: dict[str, Steps] = {}
    for s in sorted(samples, key=lambda s: s.t_s):
        out.setdefault(s.model, []).append((s.t_s, sum(s.replicas.get(k, 0) for k in states)))
    return out


def integrate(steps: Steps, end_s: float) -> float:
    """The area under a step function from its first step to ``end_s`` (0 before it)."""
    total = 0.0
    for (t, n), (t_next, _) in zip(steps, [*steps[1:], (end_s, 0)], strict=False):
        total += n * max(0.0, min(t_next, end_s) - t)
    return total


def sim_steps(decisions: Iterable[tuple[float, Decision]]) -> dict[str, Steps]:
    """Per model, the simulated replicas loading or ready (what the simulator counts as
    replica-seconds), from its decisions: an assignment adds one; a release, a sleep or
    a termination of a worker serving the model takes one away."""
    from warm_pool.policy.decisions import Assign, Release, Sleep, Terminate

    serving: dict[str, str] = {}  # worker -> model
    count: dict[str, int] = {}
    out: dict[str, Steps] = {}

    def step(t: float, model: str, d: int) -> None:
        count[model] = count.get(model, 0) + d
        steps = out.setdefault(model, [(0.0, 0)])
        if steps[-1][0] == t:
            steps[-1] = (t, count[model])
        else:
            steps.append((t, count[model]))

    for t, d in decisions:
        if isinstance(d, Assign):
            if d.worker_id in serving:
                step(t, serving.pop(d.worker_id), -1)
            serving[d.worker_id] = d.model
            step(t, d.model, +1)
        elif isinstance(d, Release | Sleep | Terminate) and d.worker_id in serving:
            step(t, serving.pop(d.worker_id), -1)
    return out


def cold_start_counts(metrics_text: str) -> dict[str, int]:
    """The activator's ``thaw_cold_starts_total`` summed per tier (Prometheus text)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, int] = {}
    for fam in text_string_to_metric_families(metrics_text):
        for sample in fam.samples:
            if sample.name == "thaw_cold_starts_total":
                tier = sample.labels.get("tier", "")
                out[tier] = out.get(tier, 0) + int(sample.value)
    return out


def counts_since(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Per key, what ``after`` added to ``before`` (keys that did not move left out)."""
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] != before.get(k, 0)}


@dataclass(frozen=True)
class SimOutcome:
    """What the comparison needs of a simulation: per request (by trace index) its TTFT
    and whether it waited at zero, and the summary's figures."""

    ttft_s: dict[int, float]  # requests admitted (timeouts and refusals have none)
    cold: frozenset[int]
    requests: int
    activation_timeouts: int
    queue_full: int
    cold_starts_by_tier: dict[str, int]
    replica_seconds: dict[str, float]
    # Requests refused at once because their pool was full (nothing to evict).
    capacity_refusals: int = 0
    # Per cold start: its tier and the TTFT of the request that opened it (None: timed out).
    openings: list[tuple[str, float | None]] = field(default_factory=list)
    steps: dict[str, Steps] = field(default_factory=dict)


def _ttft_rows(prefix: str, live: Sequence[float], sim: Sequence[float]) -> list[SideBySide]:
    return [row(f"{prefix}.p{q}", percentile(live, q), percentile(sim, q)) for q in (50, 90, 99)]


def compare(records: Sequence[RequestRecord], samples: Sequence[ReplicaSample], live_end_s: float,
            sim: SimOutcome, models: Sequence[str]) -> list[SideBySide]:
    """The figures of the goal, live and simulated: requests and errors, cold starts
    (total and per tier), replica-seconds (total and per model), TTFT p50/p90/p99 over
    all requests answered, those that waited at zero (cold) and the rest (hot)."""
    done = [r for r in records if completed(r) and r.ttft_s is not None]
    errors = sum(1 for r in records if not completed(r))
    colds = live_cold_starts(records)
    live_tiers = {t: sum(1 for c in colds if c.tier == t) for t in COLD_TIERS}
    steps = steps_from_samples(samples)
    live_rs = {m: integrate(steps.get(m, []), live_end_s) for m in models}
    out = [
        row("requests", len(records), sim.requests),
        row("completed", len(done), len(sim.ttft_s)),
        row("errors", errors, sim.activation_timeouts + sim.queue_full + sim.capacity_refusals),
        row("cold_starts", len(colds), sum(sim.cold_starts_by_tier.values())),
        *(row(f"cold_starts.{t}", live_tiers[t], sim.cold_starts_by_tier.get(t, 0)) for t in COLD_TIERS),
        row("replica_seconds", round(sum(live_rs.values()), 3), round(sum(sim.replica_seconds.values()), 3)),
        *(row(f"replica_seconds.{m}", round(live_rs[m], 3), round(sim.replica_seconds.get(m, 0.0), 3))
          for m in models),
    ]
    sim_all = list(sim.ttft_s.values())
    sim_cold = [v for i, v in sim.ttft_s.items() if i in sim.cold]
    sim_hot = [v for i, v in sim.ttft_s.items() if i not in sim.cold]
    out += _ttft_rows("ttft_s", [r.ttft_s for r in done if r.ttft_s is not None], sim_all)
    out += _ttft_rows("ttft_s.cold", [r.ttft_s for r in done if r.ttft_s is not None and r.tier != "hot"], sim_cold)
    out += _ttft_rows("ttft_s.hot", [r.ttft_s for r in done if r.ttft_s is not None and r.tier == "hot"], sim_hot)
    return out


def diagnostics(records: Sequence[RequestRecord], sim: SimOutcome, live_releases: Sequence[Interval],
                live_boots: Sequence[Interval], costs: CostModelReport) -> list[SideBySide]:
    """What explains the differences: the TTFT of the request that opened each cold
    start (all, and per tier); the live requests' TPOT and hot TTFT per 1,000 prompt
    tokens against the cost model's (measured alone on a replica); the releases and
    launches of the live run against the figures the simulator took for them."""
    colds = live_cold_starts(records)
    out = [row("cold_start_ttft_s.p50", _median([c.opening_ttft_s for c in colds if c.opening_ttft_s is not None]),
               _median([v for _, v in sim.openings if v is not None]))]
    for t in COLD_TIERS:
        lv = [c.opening_ttft_s for c in colds if c.tier == t and c.opening_ttft_s is not None]
        sv = [v for tier, v in sim.openings if tier == t and v is not None]
        if lv or sv:
            out.append(row(f"cold_start_ttft_s.p50.{t}", _median(lv), _median(sv)))
    # Serving on a replica: the live requests' speed against the cost model's (isolated).
    done = [r for r in records if completed(r)]
    out.append(row("tpot_s.p50", percentile([t / 1000 for t in map(tpot_ms, done) if t is not None], 50),
                   costs.figures["tpot_s"].value))
    out.append(row("hot_ttft_s_per_1k_prompt_tokens.p50",
                   percentile([r.ttft_s / r.prompt_tokens * 1000 for r in done
                               if r.tier == "hot" and r.ttft_s is not None and r.prompt_tokens], 50),
                   1000 / costs.figures["prefill_tokens_per_s"].value))
    out.append(row("release_s.median", _median([r.seconds for r in live_releases]),
                   costs.figures["release_s"].value))
    out.append(row("boot_s.median", _median([b.seconds for b in live_boots]), costs.boot_s.value))
    out.append(row("releases", len(live_releases), None))
    out.append(row("launches", len(live_boots), None))
    return out


def serving_share(trace: Trace, costs: CostModelReport) -> float:
    """The share of the trace's length one engine spends serving it at the measured
    speeds (each request's prefill, input / rate, and decode, output x TPOT; loads and
    boots not counted). The local pool's instances share this machine's cores, which
    the simulator does not model: the nearer this is to 1, the more the live run's
    serving slows under its own load."""
    if not len(trace) or trace.duration_s <= 0:
        return 0.0
    rate, tpot = costs.figures["prefill_tokens_per_s"].value, costs.figures["tpot_s"].value
    busy = sum(i / rate + o * tpot for i, o in zip(trace.input_tokens, trace.output_tokens, strict=True))
    return busy / trace.duration_s


def verdict(rows: Sequence[SideBySide], goals: Mapping[str, float] = GOALS) -> Verdict:
    """Each goal met when |rel_diff| is within its tolerance; said plainly either way."""
    by_metric = {r.metric: r for r in rows}
    out: list[Goal] = []
    for metric, tol in goals.items():
        r = by_metric.get(metric)
        rd = r.rel_diff if r else None
        out.append(Goal(metric=metric, tolerance=tol, live=r.live if r else None, sim=r.sim if r else None,
                        rel_diff=rd, met=None if rd is None else abs(rd) <= tol + 1e-12))
    not_met = [g.metric for g in out if g.met is not True]
    parts = []
    for g in out:
        what = ("not measurable" if g.met is None else "met" if g.met else "NOT met")
        parts.append(f"{g.metric}: live {_fmt(g.live)}, sim {_fmt(g.sim)} ({_pct(g.rel_diff)}; goal ±{g.tolerance:.0%}) "
                     f"{what}")
    text = "; ".join(parts) + (". Goal met." if not not_met else f". Goal NOT met: {', '.join(not_met)}.")
    return Verdict(goals=out, met=not not_met, not_met=not_met, text=text)


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.3f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def format_table(rows: Sequence[SideBySide], title: str) -> str:
    lines = [title, f"{'metric':38s} {'live':>10s} {'sim':>10s} {'sim vs live':>12s}"]
    for r in rows:
        lines.append(f"{r.metric:38s} {_fmt(r.live):>10s} {_fmt(r.sim):>10s} {_pct(r.rel_diff):>12s}")
    return "\n".join(lines)


# -- the simulation ---------------------------------------------------------------------------------


def sim_outcome(result: SimResult, trace: Trace, ttft_s: Mapping[int, float], cold: Iterable[int]) -> SimOutcome:
    """A simulation's :class:`SimOutcome`: the summary's figures, the requests' TTFTs,
    and for each cold start the TTFT of the request that opened it (the model's request
    arriving at the cold start's time)."""
    s = result.summary
    per_model = s["per_model"]
    tiers: dict[str, int] = {}
    for m in per_model.values():
        for t, n in m["cold_starts_by_tier"].items():
            tiers[t] = tiers.get(t, 0) + n
    arrival = {(trace.models[trace.model[i]], trace.t[i]): i for i in reversed(range(len(trace)))}
    openings = []
    for c in result.cold_starts:
        i = arrival.get((c.model, c.at))
        openings.append((c.tier, ttft_s.get(i) if i is not None else None))
    return SimOutcome(
        ttft_s=dict(ttft_s), cold=frozenset(cold), requests=s["requests"],
        activation_timeouts=s["activation_timeouts"],
        queue_full=sum(m["queue_full"] for m in per_model.values()), capacity_refusals=s["capacity_refusals"],
        cold_starts_by_tier=tiers, replica_seconds={k: m["replica_seconds"] for k, m in per_model.items()},
        openings=openings, steps=sim_steps(result.decisions),
    )


def run_simulation(cfg_dict: Mapping[str, Any], trace_file: Path, costs_file: Path, tick_s: float,
                   out_dir: Path) -> tuple[SimOutcome, Trace]:
    """The simulator on the stack's config, the trace file and the measured costs;
    writes ``out_dir`` as `thaw simulate --out-dir` does. Each request's TTFT is taken as the
    simulator admits it (``on_admit``; the simulation is unchanged)."""
    from simulator.run import prepare, write
    from simulator.sim import Simulator
    from simulator.traces import read_trace
    from thaw.config import parse_config

    trace = read_trace(trace_file, "generic")
    inputs = prepare(parse_config(cfg_dict), trace, costs_file=costs_file, tick_s=tick_s)
    ttft: dict[int, float] = {}
    t0 = time.perf_counter()
    sim = Simulator(inputs.cfg, inputs.costs, inputs.trace, tick_s=tick_s, ttft_slo_s=inputs.ttft_slo_s,
                    record_decisions=True, on_admit=ttft.__setitem__)
    result = sim.run()
    write(out_dir, result, inputs, time.perf_counter() - t0,
          {"command": "thaw load calibrate", "trace_file": str(trace_file), "costs_file": str(costs_file)})
    cold = sim.traffic.cold_requests
    return sim_outcome(result, trace, ttft, cold), trace


# -- the stack ----------------------------------------------------------------------------------------


def _log(msg: str) -> None:
    print(f"[calibrate {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Stack:
    """``thaw up`` as a subprocess, and what the calibration asks of it. Every process it
    starts is remembered as it appears (:meth:`remember`), so that :meth:`stop` can kill
    what the graceful stop left behind."""

    def __init__(self, work: Path, cfg: dict[str, Any]) -> None:
        import yaml

        from thaw.config import parse_config

        self.work, self.cfg = work, cfg
        self.parsed = parse_config(cfg)  # a mistake here fails now, with the field named
        self.data_dir = Path(cfg["data_dir"])
        self.config_path = work / "thaw.yaml"
        self.config_path.write_text(yaml.safe_dump(cfg))
        self.log_path = work / "thaw-up.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.base_url = self.control_url = ""
        self.seen: dict[int, float] = {}  # pid -> create time
        self._seen_lock = threading.Lock()

    def start(self, timeout_s: float) -> None:
        endpoint = self.data_dir / "endpoint.json"
        from thaw.process import spawn_group

        endpoint.unlink(missing_ok=True)
        # Its own session (a Ctrl-C here reaches only this process, which stops it in
        # order); SIGTERM to it if this process dies without stopping it.
        self.proc = spawn_group([sys.executable, "-m", "thaw.cli.main", "up", "--config", str(self.config_path)],
                                self.log_path)
        deadline = time.monotonic() + timeout_s
        while not endpoint.exists():
            self.check_alive()
            self.remember()
            if time.monotonic() > deadline:
                raise CalibrationError(f"thaw up did not start within {timeout_s:.0f} s; see {self.log_path}")
            time.sleep(0.2)
        info = json.loads(endpoint.read_text())
        self.base_url, self.control_url = info["base_url"], info["control_url"]

    def remember(self) -> None:
        """Note every descendant of `thaw up` now alive (the services, the workers, their engines)."""
        import psutil

        if self.proc is None:
            return
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        with self._seen_lock:
            for k in kids:
                with contextlib.suppress(psutil.NoSuchProcess):
                    self.seen.setdefault(k.pid, k.create_time())

    def stop(self, grace_s: float = 120.0) -> list[int]:
        """SIGTERM to `thaw up` and wait for it (it stops the activator, then the
        controller, which stops the workers); then SIGKILL whatever it started that is
        still alive. Returns the pids killed that way."""
        import psutil

        from thaw.process import stop_group

        self.remember()
        if self.proc is not None:
            stop_group(self.proc, grace_s, term_leader_only=True)
        killed = []
        deadline = time.monotonic() + 15
        with self._seen_lock:
            seen = dict(self.seen)
        for pid, created in seen.items():
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - created) > 0.01:
                    continue  # a recycled pid: not ours
                # The services and workers exit shortly after `thaw up`: give them a moment.
                p.wait(max(0.0, deadline - time.monotonic()))
            except psutil.NoSuchProcess:
                continue
            except psutil.TimeoutExpired:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
                    killed.append(pid)
        return killed

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            from loadtests.procs import tail

            raise CalibrationError(f"thaw up exited ({self.proc.returncode}):\n{tail(self.log_path)}")

    def token(self) -> str:
        from thaw.auth import local_token

        return local_token(self.data_dir)

    def _get(self, path: str) -> Any:
        import httpx

        from thaw.auth import bearer

        r = httpx.get(f"{self.control_url}{path}", timeout=10, headers=bearer(self.token()))
        r.raise_for_status()
        return r.json()

    def state(self) -> dict[str, Any]:
        return self._get("/v1/state")  # type: ignore[no-any-return]

    def events(self, since: float = 0.0) -> list[dict[str, Any]]:
        return self._get(f"/v1/events?since={since}")["events"]  # type: ignore[no-any-return]

    def metrics_text(self) -> str:
        import httpx

        from thaw.auth import bearer

        return httpx.get(self.base_url.removesuffix("/v1") + "/metrics", timeout=10, headers=bearer(self.token())).text

    def push_models(self, size: str) -> int:
        """Build the demo model of ``size`` once and push it under every model's URI;
        returns its bytes."""
        import tempfile

        from thaw.demo_model import build_demo_model
        from thaw.objstore import resolve_endpoint
        from weight_streaming.push import push_model, read_manifest

        client = resolve_endpoint(self.parsed).client()
        total = 0
        with tempfile.TemporaryDirectory(prefix="thaw-calibrate-model-", dir=self.work) as tmp:
            built = False
            for m in self.parsed.models:
                manifest = read_manifest(client, m.uri)
                if manifest is None:
                    if not built:
                        build_demo_model(Path(tmp) / "demo", size=size)
                        built = True
                    manifest = push_model(client, Path(tmp) / "demo", m.uri)
                total = manifest.total_bytes
        return total

    def clear_tier(self, worker_id: str, tier: str) -> None:
        """Empty one weight cache (the worker stands by: no load reads or fills it)."""
        from weight_streaming.cache import DiskCache
        from worker.__main__ import HOST_CACHE_ROOT

        shape = self.parsed.shapes[0]
        if tier == "host":
            root, gib = HOST_CACHE_ROOT / worker_id, shape.host_cache_gib
        else:
            assert shape.cache is not None
            root, gib = Path(shape.cache.dir), shape.cache.max_gib
        if root.is_dir():
            DiskCache(root, int(gib * GiB)).clear()


class Watch:
    """Polls the controller in a thread: each worker's state changes (for releases and
    launches), and the processes `thaw up` started (for the stop). Plain blocking HTTP
    in its own thread; the replay's event loop is untouched."""

    def __init__(self, stack: Stack, interval_s: float = CONTROLLER_TICK_S) -> None:
        self.stack, self.interval_s = stack, interval_s
        self.seen: list[Transition] = []
        self.errors = 0
        self._prev: dict[str, tuple[str, str | None]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="calibrate-watch", daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                st = self.stack.state()
                new, self._prev = transitions(self._prev, st, time.time())
                with self._lock:
                    self.seen.extend(new)
            except Exception:  # noqa: BLE001 - a missed poll is a gap, not a failure
                self.errors += 1
            self.stack.remember()
            self._stop.wait(self.interval_s)

    def transitions(self) -> list[Transition]:
        with self._lock:
            return list(self.seen)


# -- requests through `thaw load run`'s machinery -----------------------------------------------------


def one_request(stack: Stack, model: str, index: int, input_tokens: int, max_tokens: int, *, seed: int,
                timeout_s: float) -> RequestRecord:
    """One streamed request, sent and recorded exactly as `thaw load run` sends and
    records the trace's (the same client, prompt and timing); ``index`` picks its prompt."""
    from loadtests.load_run import Planned, replay

    plan = [Planned(index=index, at_s=0.0, trace_model=model, model=model, tenant=None,
                    input_tokens=input_tokens, max_tokens=max_tokens)]
    config = _run_config(stack.base_url, "(calibration probe)", seed, timeout_s, controller_url=None)
    out: list[RequestRecord] = []
    asyncio.run(replay(plan, config, api_key=API_KEY, cluster_token=None, trace_requests=1, on_record=out.append))
    return out[0]


def _run_config(base_url: str, trace: str, seed: int, timeout_s: float, controller_url: str | None,
                grace_s: float | None = None) -> RunConfig:
    return RunConfig(trace=trace, format="generic", base_url=base_url, speedup=1.0, max_requests=None,
                     duration_s=None, model_map={}, seed=seed, max_tokens_cap=None, max_input_tokens=None,
                     timeout_s=timeout_s, grace_s=timeout_s if grace_s is None else grace_s, send_overhead_ms=0.0,
                     controller_url=controller_url, poll_interval_s=0.5)


def hot_sample(r: RequestRecord) -> HotSample | None:
    """A hot request's figures (None unless it completed hot with usage)."""
    if not completed(r) or r.tier != "hot" or r.ttft_s is None or not r.prompt_tokens:
        return None
    tpot = sum(r.inter_token_s) / (r.completion_tokens - 1) if r.completion_tokens >= 2 and r.inter_token_s else None
    return HotSample(prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens, ttft_s=r.ttft_s,
                     tpot_s=tpot)


# -- the cost phase -------------------------------------------------------------------------------------


class CostPhase:
    """Measures the cost model against the running stack (see :func:`costs_from_measurements`)."""

    def __init__(self, stack: Stack, watch: Watch, model: str, uri: str, *, seed: int, timeout_s: float,
                 standby: int) -> None:
        self.stack, self.watch, self.model, self.uri = stack, watch, model, uri
        self.seed, self.timeout_s, self.standby = seed, timeout_s, standby
        self.index = 1_000_000  # probe prompts' indices: none is a trace request's

    def request(self, input_tokens: int, max_tokens: int) -> RequestRecord:
        self.index += 1
        return one_request(self.stack, self.model, self.index, input_tokens, max_tokens, seed=self.seed,
                           timeout_s=self.timeout_s)

    def wait(self, what: str, ready: Callable[[dict[str, Any]], Any], *,
             meanwhile: Callable[[], None] | None = None) -> Any:
        deadline = time.monotonic() + self.timeout_s
        while True:
            self.stack.check_alive()
            found = ready(self.stack.state())
            if found:
                return found
            if time.monotonic() > deadline:
                raise CalibrationError(f"not {what} after {self.timeout_s:.0f} s")
            if meanwhile is not None:
                meanwhile()
            time.sleep(0.25)

    def wait_settled(self) -> dict[str, Any]:
        """Until every model is at zero and the pool is back at its standby floor; the standby."""
        return self.wait(f"settled (every model at zero, {self.standby} worker(s) standing by)",  # type: ignore[no-any-return]
                         lambda st: settled(st, self.standby) and workers_of(st)[0])

    def cold_record(self, request_id: str | None) -> dict[str, Any] | None:
        """The activator's record of the cold start this request ended (it arrives just after)."""
        deadline = time.monotonic() + 10
        while request_id and time.monotonic() < deadline:
            st = self.stack.state()
            rec = next((m.get("last_cold_start") for m in st["models"] if m["name"] == self.model), None)
            if rec and rec.get("request_id") == request_id:
                return rec  # type: ignore[no-any-return]
            time.sleep(0.1)
        return None

    def prepare_tier(self, tier: str) -> None:
        """Leave the pool settled with the standby's caches holding the model exactly as
        a load from ``tier`` needs (``thaw bench cold-start``'s preparation): a cache that
        must hold it and does not is filled by an untimed cold start; one that must not
        is emptied; then wait until the worker's status shows it."""
        from loadtests.bench_cold_start import TIER_HOLDINGS, holding_ok, holdings

        want = TIER_HOLDINGS[tier]
        worker = self.wait_settled()
        have = holdings(worker.get("cached", []), self.uri)
        if any(w and not have[t] for t, w in want.items()):
            _log(f"{tier}: filling the caches (an untimed cold start)")
            self.request(PROBE_INPUT_TOKENS, PROBE_MAX_TOKENS)
            worker = self.wait_settled()
        for t, w in want.items():
            if not w:
                self.stack.clear_tier(worker["id"], t)
        self.wait(f"the standby's caches holding {dict(want)}",
                  lambda st: settled(st, self.standby)
                  and holding_ok(holdings(workers_of(st)[0].get("cached", []), self.uri), want))

    def probe(self, tier: str) -> TierProbe:
        """One cold start from ``tier`` (prepared), then hot requests of the same size."""
        self.prepare_tier(tier)
        r = self.request(PROBE_INPUT_TOKENS, PROBE_MAX_TOKENS)
        rec = self.cold_record(r.request_id)
        hot = [self.request(PROBE_INPUT_TOKENS, PROBE_MAX_TOKENS) for _ in range(HOT_PROBES_PER_COLD)]
        p = TierProbe(tier=tier, served_tier=r.tier, ttft_s=r.ttft_s if completed(r) else None,
                      hot_ttft_s=[h.ttft_s for h in hot if completed(h) and h.tier == "hot" and h.ttft_s is not None],
                      request_id=r.request_id, load_s=(rec or {}).get("load_s"),
                      phases_s=(rec or {}).get("phases_s") or {}, error=r.error)
        _log(f"{tier}: TTFT {_fmt(p.ttft_s)} s served from {p.served_tier} (loader {_fmt(p.load_s)} s); "
             f"hot {', '.join(f'{h:.3f}' for h in p.hot_ttft_s)} s")
        return p

    def hot_samples(self, sizes: Sequence[tuple[int, int]]) -> list[HotSample]:
        """An untimed cold start, then (once no worker is booting: its imports take a
        core) each size as a request alone on the replica; a short request every 2 s
        keeps the model from going to zero meanwhile."""
        self.request(PROBE_INPUT_TOKENS, PROBE_MAX_TOKENS)
        last = [time.monotonic()]

        def keep_warm() -> None:
            if time.monotonic() - last[0] > 2.0:
                self.request(PROBE_INPUT_TOKENS, 1)
                last[0] = time.monotonic()

        self.wait("no worker booting", lambda st: not booting(st), meanwhile=keep_warm)
        out = []
        for inp, outp in sizes:
            s = hot_sample(self.request(inp, outp))
            if s is not None:
                out.append(s)
        _log(f"hot: {len(out)} of {len(sizes)} served hot; TTFT "
             f"{', '.join(f'{h.ttft_s:.3f}' for h in out)} s")
        return out

    def run(self, sizes: Sequence[tuple[int, int]], reps: int, weights_bytes: int) -> CostMeasurements:
        since = time.time()
        self.wait_settled()
        # Its untimed cold start is the warm-up too: the activator's first request imports
        # its tokenizer stack, which no probe should pay.
        hot = self.hot_samples(sizes)
        probes = []
        for rep in range(reps):
            for tier in PROBE_TIERS:
                _log(f"rep {rep + 1}/{reps}: cold start from {tier}")
                probes.append(self.probe(tier))
        self.wait_settled()
        until = time.time()
        events = self.stack.events(since)
        seen = self.watch.transitions()
        return CostMeasurements(weights_bytes=weights_bytes, tier_probes=probes, hot=hot,
                                releases=releases(events, seen, since, until), boots=boots(events, seen, since, until))


# -- plots ----------------------------------------------------------------------------------------------


def plot_ttft_cdf(records: Sequence[RequestRecord], sim: SimOutcome, path: Path) -> None:
    """TTFT CDF, live (completed requests) against simulated (requests admitted): all,
    and those that waited at zero."""
    from loadtests.load_report import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    done = [r for r in records if completed(r) and r.ttft_s is not None]
    series = [
        ("live, all", [r.ttft_s for r in done if r.ttft_s is not None], "C0", "-"),
        ("sim, all", list(sim.ttft_s.values()), "C1", "-"),
        ("live, cold", [r.ttft_s for r in done if r.ttft_s is not None and r.tier != "hot"], "C0", ":"),
        ("sim, cold", [v for i, v in sim.ttft_s.items() if i in sim.cold], "C1", ":"),
    ]
    every = [x for _, xs, _, _ in series for x in xs]
    for label, xs, color, style in series:
        if not xs:
            continue
        xs = sorted(xs)
        ax.step([xs[0], *xs], [0.0] + [(i + 1) / len(xs) for i in range(len(xs))], where="post", color=color,
                linestyle=style, label=f"{label} (n={len(xs)})")
    if every and min(every) > 0 and max(every) / min(every) > 100:
        ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title("TTFT CDF: live run vs simulator (same trace, measured cost model)")
    ax.grid(True, alpha=0.3)
    if every:
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_timeline(samples: Sequence[ReplicaSample], sim: SimOutcome, models: Sequence[str],
                  records: Sequence[RequestRecord], end_s: float, path: Path) -> None:
    """Per model: replicas loading or ready over time, live (the controller, polled) and
    simulated (its decisions); the requests' arrivals as ticks."""
    from loadtests.load_report import _pyplot

    plt = _pyplot()
    live = steps_from_samples(samples)
    fig, axes = plt.subplots(len(models), 1, figsize=(10, 2.4 * len(models)), sharex=True, squeeze=False)
    for ax, m in zip(axes[:, 0], models, strict=True):
        for label, steps, color, style in (("live", live.get(m, []), "C0", "-"),
                                           ("sim", sim.steps.get(m, []), "C1", "--")):
            pts = [*steps, (end_s, steps[-1][1])] if steps else [(0.0, 0), (end_s, 0)]
            ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", color=color, linestyle=style,
                    label=label)
        arrivals = [r.scheduled_s for r in records if r.model == m]
        ax.plot(arrivals, [-0.15] * len(arrivals), "|", color="gray", markersize=8, label="arrivals")
        ax.set_ylim(-0.3, max([1, *(n for _, n in live.get(m, [])), *(n for _, n in sim.steps.get(m, []))]) + 0.3)
        ax.set_ylabel("replicas")
        ax.set_title(f"{m}: replicas loading or ready", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("seconds from the run's start")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- the command ----------------------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> str | None:
    if args.models < 1:
        return f"--models must be >= 1, not {args.models}"
    if args.reps < 1 or args.hot_requests < 1:
        return "--reps and --hot-requests must be >= 1"
    for name in ("idle_grace_s", "duration_s", "speedup", "rate_per_s", "tick_s", "timeout_s"):
        v = getattr(args, name)
        if not (v > 0 and math.isfinite(v)):
            return f"--{name.replace('_', '-')} must be a positive number, not {v}"
    if args.trace_start_s < 0 or args.zipf_s < 0:
        return "--trace-start-s and --zipf-s must be >= 0"
    if args.max_input_tokens < 1 or args.max_output_tokens < 1:
        return "--max-input-tokens and --max-output-tokens must be >= 1"
    if args.max_input_tokens + args.max_output_tokens > MAX_CONTEXT_TOKENS:
        return f"--max-input-tokens + --max-output-tokens must fit the context ({MAX_CONTEXT_TOKENS})"
    if not args.trace_source.is_file():
        return f"--trace-source {args.trace_source}: no such file"
    return None


def run(args: argparse.Namespace) -> int:
    """`thaw load calibrate`: 0 when it ran (whatever the verdict), 1 when it failed, 2 for bad options."""
    from simulator.traces import TraceError, read_trace, write_generic

    problem = _check(args)
    if problem:
        print(f"thaw load calibrate: {problem}", file=sys.stderr)
        return 2
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    params = TraceParams(source_file=str(args.trace_source), start_s=args.trace_start_s, duration_s=args.duration_s,
                         speedup=args.speedup, rate_per_s=args.rate_per_s, models=args.models, zipf_s=args.zipf_s,
                         seed=args.seed, max_input_tokens=args.max_input_tokens,
                         max_output_tokens=args.max_output_tokens)
    try:
        trace = build_trace(read_trace(args.trace_source, "azure"), params)
    except (TraceError, ValueError) as exc:
        print(f"thaw load calibrate: {exc}", file=sys.stderr)
        return 2
    trace_file = out / CALIBRATION_TRACE_FILE
    write_generic(trace, trace_file)
    trace = read_trace(trace_file, "generic")  # what the live run and the simulator read
    names = model_names(args.models)
    citation = CITATIONS.get(args.trace_source.stem, f"{args.trace_source} (an Azure LLM 2023 format trace)")
    info = TraceInfo(file=str(trace_file), citation=citation, source=trace.source, params=params,
                     requests=len(trace), duration_s=trace.duration_s,
                     per_model={m: trace.model.count(i) for i, m in enumerate(trace.models)})
    _log(f"trace: {len(trace)} requests over {trace.duration_s:.0f} s, per model {info.per_model}; {trace_file}")
    # A SIGTERM here unwinds like Ctrl-C, so the stack is stopped on the way out.
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return _calibrate(args, out, trace, trace_file, info, names)
    except CalibrationError as exc:
        print(f"thaw load calibrate: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _calibrate(args: argparse.Namespace, out: Path, trace: Trace, trace_file: Path, info: TraceInfo,
               names: list[str]) -> int:
    from thaw.embedded_store import free_port
    from thaw.units import parse_size_bytes

    started = time.time()
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    size_bytes = parse_size_bytes(args.size) if args.size != "tiny" else 12 * 1024**2
    cache_gib = float(max(1, math.ceil(2 * len(names) * size_bytes / GiB)))
    settings = StackSettings(models=names, idle_grace_s=args.idle_grace_s, activation_timeout_s=args.timeout_s,
                             host_cache_gib=cache_gib, disk_cache_gib=cache_gib)
    cfg = stack_config(settings, data_dir=work / "stack", server_port=free_port(), controller_port=free_port(),
                       s3_port=free_port())
    stack = Stack(work, cfg)
    notes: list[str] = []
    live_dir = out / "live"
    live_dir.mkdir(exist_ok=True)
    try:
        _log(f"starting thaw up ({len(names)} models, pool standby {settings.standby_min}..{settings.standby_max}, "
             f"at most {settings.max_instances} instances, idle_grace_s {settings.idle_grace_s:g}); log {stack.log_path}")
        stack.start(timeout_s=240)
        weights = stack.push_models(args.size)
        _log(f"pushed the {args.size} demo model ({weights / 1e6:.1f} MB) under {len(names)} URIs")
        with Watch(stack) as watch:
            phase = CostPhase(stack, watch, names[0], model_uri(names[0]), seed=args.seed, timeout_s=args.timeout_s,
                              standby=settings.standby_min)
            measured, costs = _measure_costs(phase, trace, args, weights, out)
            live = _replay_live(stack, watch, phase, settings, trace, trace_file, args, live_dir)
    finally:
        _log("stopping thaw up")
        killed = stack.stop()
        if killed:
            notes.append(f"{len(killed)} process(es) of the stack outlived its stop and were killed: {killed}")
            _log(notes[-1])
        _keep_logs(work, out)
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    sim_cfg = simulated_config(cfg, costs.boot_s.value)
    sim, _ = run_simulation(sim_cfg, trace_file, out / COSTS_FILE, args.tick_s, out / "sim")
    _report(args, out, trace, info, names, settings, measured, costs, live, sim, notes, started)
    return 0


@dataclass
class _LiveRun:
    """What the live replay left: its requests and replica samples as they came, its run
    info, the releases and boots the controller carried out, and how far the activator's
    cold-start counters moved."""

    records: list[RequestRecord]
    samples: list[ReplicaSample]
    run_info: RunInfo
    releases: list[Interval]
    boots: list[Interval]
    activator_colds: dict[str, int]


def _measure_costs(phase: CostPhase, trace: Trace, args: argparse.Namespace, weights: int,
                   out: Path) -> tuple[CostMeasurements, CostModelReport]:
    """The cost phase on the stack: its samples and the cost model from them, both written to ``out``."""
    measured = phase.run(hot_sizes(trace, args.hot_requests), args.reps, weights)
    (out / COST_SAMPLES_FILE).write_text(measured.model_dump_json(indent=2) + "\n")
    costs = costs_from_measurements(measured)
    (out / COSTS_FILE).write_text(json.dumps(costs.costs_file, indent=2) + "\n")
    _log("cost model: " + ", ".join(f"{k} {f.value:g} (n {f.n})" for k, f in costs.figures.items())
         + f", boot_s {costs.boot_s.value:g} (n {costs.boot_s.n})")
    return measured, costs


def _replay_live(stack: Stack, watch: Watch, phase: CostPhase, settings: StackSettings, trace: Trace,
                 trace_file: Path, args: argparse.Namespace, live_dir: Path) -> _LiveRun:
    """The trace replayed against the stack from the simulator's starting point, written
    into ``live_dir`` as `thaw load run` writes it."""
    from loadtests.load_run import plan_requests, replay

    records: list[RequestRecord] = []
    samples: list[ReplicaSample] = []
    # Start the replay as the simulator starts: every model at zero, the pool at its
    # floor, empty caches (a simulated worker holds nothing at first).
    worker = phase.wait_settled()
    for t in ("host", "disk"):
        stack.clear_tier(worker["id"], t)
    phase.wait("the standby's caches empty", lambda st: settled(st, settings.standby_min) and not any(
        c.get("bytes") for c in workers_of(st)[0].get("cached", [])))
    plan = plan_requests(trace, speedup=1.0, max_requests=None, duration_s=None, model_map={},
                         max_tokens_cap=None, max_input_tokens=None)
    config = _run_config(stack.base_url, str(trace_file), args.seed, args.timeout_s, stack.control_url,
                         grace_s=args.timeout_s)
    _log(f"live run: {len(plan)} requests over {trace.duration_s:.0f} s into {live_dir}")
    metrics_before = cold_start_counts(stack.metrics_text())
    replay_since = time.time()
    with open(live_dir / REQUESTS_FILE, "w", encoding="utf-8") as rf, \
            open(live_dir / REPLICAS_FILE, "w", encoding="utf-8") as pf:
        # Written as they come, as `thaw load run` writes them.
        def on_record(r: RequestRecord) -> None:
            records.append(r)
            rf.write(r.model_dump_json() + "\n")
            rf.flush()

        def on_sample(s: ReplicaSample) -> None:
            samples.append(s)
            pf.write(s.model_dump_json() + "\n")

        run_info: RunInfo = asyncio.run(replay(plan, config, api_key=API_KEY, cluster_token=stack.token(),
                                               trace_requests=len(trace), on_record=on_record,
                                               on_sample=on_sample))
    replay_until = time.time()
    (live_dir / RUN_FILE).write_text(run_info.model_dump_json(indent=2) + "\n", encoding="utf-8")
    events = stack.events(replay_since)
    seen = watch.transitions()
    live_releases = releases(events, seen, replay_since, replay_until)
    live_boots = boots(events, seen, replay_since, replay_until)
    metrics_after = stack.metrics_text()
    (live_dir / "events.json").write_text(json.dumps(events, indent=1) + "\n")
    (live_dir / "metrics.txt").write_text(metrics_after)
    activator_colds = counts_since(metrics_before, cold_start_counts(metrics_after))
    return _LiveRun(records, samples, run_info, live_releases, live_boots, activator_colds)


def _report(args: argparse.Namespace, out: Path, trace: Trace, info: TraceInfo, names: list[str],
            settings: StackSettings, measured: CostMeasurements, costs: CostModelReport, live: _LiveRun,
            sim: SimOutcome, notes: list[str], started: float) -> None:
    """The live run and the simulation side by side: written as the calibration, plotted, printed."""
    records, samples, run_info = live.records, live.samples, live.run_info
    rows = compare(records, samples, run_info.duration_s, sim, names)
    diag = diagnostics(records, sim, live.releases, live.boots, costs)
    v = verdict(rows)
    share = serving_share(trace, costs)
    notes.append(f"serving the trace at the measured speeds keeps one engine busy {share:.0%} of its length (prefill "
                 f"and decode, before loads and boots); the pool's instances share this machine's {os.cpu_count()} "
                 "cores, which the simulator does not model (each replica has a machine of its own)")
    from_records = {t: n for t in COLD_TIERS if (n := sum(1 for c in live_cold_starts(records) if c.tier == t))}
    if live.activator_colds != from_records:
        notes.append(f"the activator's thaw_cold_starts_total moved by {live.activator_colds} during the replay, the "
                     f"records say {from_records}")
    if run_info.generator_fell_behind:
        notes.append("the load generator fell behind its schedule (p99 send lag over the threshold): the stack saw "
                     "later arrivals than the simulator")
    cal = Calibration(
        out_dir=str(out), started_at=started, wall_s=round(time.time() - started, 1),
        stack={"config": str(out / "logs" / "thaw.yaml"), "models": names, "size": args.size,
               "weights_bytes": measured.weights_bytes, "idle_grace_s": settings.idle_grace_s,
               "pool": {"shape": SHAPE, "standby_min": settings.standby_min, "standby_max": settings.standby_max,
                        "max_instances": settings.max_instances},
               "host_cache_gib": settings.host_cache_gib, "disk_cache_gib": settings.disk_cache_gib,
               "sim_tick_s": args.tick_s, "sim_boot_s": costs.boot_s.value},
        trace=info, costs=costs, serving_share=round(share, 4), live_counts=run_info.counts, generator_fell_behind=run_info.generator_fell_behind,
        rows=rows, diagnostics=diag, verdict=v, notes=notes)
    (out / CALIBRATION_FILE).write_text(cal.model_dump_json(indent=2) + "\n")
    plot_ttft_cdf(records, sim, out / "calibration_ttft_cdf.png")
    plot_timeline(samples, sim, names, records, max(run_info.duration_s, trace.duration_s),
                  out / "calibration_timeline.png")
    print(format_table(rows, f"calibration {out}: live run vs simulator, same trace ({len(trace)} requests)"))
    print()
    print(format_table(diag, "diagnostics"))
    print()
    print(v.text)
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {out / CALIBRATION_FILE}, {out / COSTS_FILE}, calibration_ttft_cdf.png, calibration_timeline.png")


def _keep_logs(work: Path, out: Path) -> None:
    """The stack's config and logs into DIR/logs (the work dir may be removed)."""
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    for src in [work / "thaw.yaml", work / "thaw-up.log", *sorted((work / "stack" / "logs").glob("*.log"))]:
        with contextlib.suppress(OSError):
            shutil.copy2(src, logs / src.name)
    workers = work / "stack" / "workers"
    for log in sorted(workers.glob("*/*.log")) if workers.is_dir() else []:
        with contextlib.suppress(OSError):
            shutil.copy2(log, logs / f"{log.parent.name}-{log.name}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
