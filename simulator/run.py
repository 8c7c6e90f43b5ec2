"""One simulation from files: a config, a trace, a cost model; the answer as JSON."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.costs import CostModel, cost_model, read_overrides
from simulator.sim import SimResult, Simulator, engine_classes, engine_sizes
from simulator.stream import TraceStream
from simulator.traces import Trace
from thaw.config import NAME_PATTERN, ThawConfig
from warm_pool.policy.keepalive import IdleHistogram, histograms_from_json, histograms_to_json

DEFAULT_TTFT_SLO_S = 5.0
_NAME = re.compile(NAME_PATTERN)


class SimError(ValueError):
    pass


def with_trace_models(cfg: ThawConfig, trace: Trace | TraceStream, template: str | None) -> ThawConfig:
    """``cfg`` with a model for every trace model it lacks, each a copy of ``template``
    (a configured model's name) under the trace's name: of an adapter, an adapter of
    the same base."""
    missing = [name for name in trace.models if cfg.model(name) is None]
    if not missing:
        return cfg
    if template is None:
        raise SimError(f"{len(missing)} trace models are not in the config ({', '.join(missing[:5])}"
                       f"{', ...' if len(missing) > 5 else ''}): name a configured model with --model-template")
    base = cfg.model(template)
    if base is None:
        raise SimError(f"--model-template {template!r} is not a configured model "
                       f"({', '.join(m.name for m in cfg.models) or 'none configured'})")
    bad = [name for name in missing if not _NAME.match(name)]
    if bad:
        raise SimError(f"trace model names unusable as config names: {bad[:5]}")
    # A template that is an adapter makes adapters of its base (their files: their uri).
    uri_keys = ("uri", "adapter_uri") if base.is_adapter else ("uri",)
    added = [base.model_copy(update={"name": name, "served_name": None,
                                     **dict.fromkeys(uri_keys, f"{base.uri.rstrip('/')}-{name}")})
             for name in missing]
    return cfg.model_copy(update={"models": [*cfg.models, *added]})


@dataclass(frozen=True)
class Inputs:
    cfg: ThawConfig
    trace: Trace | TraceStream  # a stream runs as one simulation (no sweep, oracle or packing comparison)
    costs: CostModel
    ttft_slo_s: float = DEFAULT_TTFT_SLO_S
    tick_s: float = 1.0
    # Keep-alive histograms every run starts from (--keepalive-from).
    histograms: Mapping[str, IdleHistogram] = field(default_factory=dict)

    @property
    def whole(self) -> Trace:
        """The trace, read whole: what a sweep's report, the oracle and a packing
        comparison need (a stream is refused before them: ``thaw.cli.simulate``)."""
        if not isinstance(self.trace, Trace):
            raise SimError(f"{self.trace.source}: a trace drawn as it is read runs as one simulation")
        return self.trace


def prepare(cfg: ThawConfig, trace: Trace | TraceStream, *, template: str | None = None, catalog_model: str = "llama-3.1-8b",
            costs_file: Path | None = None, ttft_slo_s: float = DEFAULT_TTFT_SLO_S,
            tick_s: float = 1.0) -> Inputs:
    full = with_trace_models(cfg, trace, template)
    overrides = read_overrides(costs_file) if costs_file else None
    return Inputs(full, trace, cost_model(full, catalog_model=catalog_model, overrides=overrides),
                  ttft_slo_s, tick_s)


def simulate(inputs: Inputs, *, cfg: ThawConfig | None = None, exact: bool = False,
             record_decisions: bool = False) -> tuple[SimResult, float]:
    """Run once (``cfg`` replaces the inputs' config: a sweep's variant); the result and
    the wall time it took."""
    t0 = time.perf_counter()
    sim = Simulator(cfg or inputs.cfg, inputs.costs, inputs.trace, tick_s=inputs.tick_s, exact=exact,
                    ttft_slo_s=inputs.ttft_slo_s, record_decisions=record_decisions, histograms=inputs.histograms)
    result = sim.run()
    return result, time.perf_counter() - t0


def write(out_dir: Path, result: SimResult, inputs: Inputs, wall_s: float, meta: dict[str, Any]) -> None:
    """``summary.json`` (the answer), ``run.json`` (what produced it), ``cold_starts.jsonl``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n")
    run = {
        **meta,
        "trace": {"source": inputs.trace.source, "requests": result.summary["requests"],
                  "models": len(inputs.trace.models), "duration_s": result.last_arrival_s},
        "simulated_s": result.end_s,
        "wall_s": round(wall_s, 3),
        "requests_per_s": round(result.summary["requests"] / wall_s, 1) if wall_s > 0 else None,
        "ticks": result.ticks,
        "ttft_slo_s": inputs.ttft_slo_s,
        "tick_s": inputs.tick_s,
        "costs": inputs.costs.to_json(),
        # The classes the run assumed (simulator.sim.engine_classes; empty: no pool pre-builds).
        "engine_classes": engine_classes(inputs.cfg, inputs.costs),
        # The memory each engine of a packing pool's models holds (simulator.sim.engine_sizes).
        "engine_bytes": engine_sizes(inputs.cfg, inputs.costs),
    }
    (out_dir / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    with (out_dir / "cold_starts.jsonl").open("w") as f:
        for c in result.cold_starts:
            f.write(json.dumps({"model": c.model, "at_s": round(c.at, 3),
                                "ready_after_s": round(c.ready_after_s, 3), "tier": c.tier}) + "\n")


def read_histograms(path: Path, cfg: ThawConfig) -> tuple[dict[str, IdleHistogram], dict[str, str]]:
    """``--keepalive-from``: the histograms a run wrote with ``--keepalive-to`` (or a
    controller keeps, the same form), for ``cfg``'s models, and why any were dropped.
    Raises SimError when the file cannot be read as that."""
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SimError(f"--keepalive-from {path}: {exc}") from None
    if not isinstance(body, dict):
        raise SimError(f"--keepalive-from {path}: not an object of models' histograms")
    return histograms_from_json(cfg, body)


def write_histograms(path: Path, cfg: ThawConfig, histograms: Mapping[str, IdleHistogram]) -> None:
    """``--keepalive-to``: each model's histogram at the end of the run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(histograms_to_json(cfg, histograms), indent=1) + "\n")
