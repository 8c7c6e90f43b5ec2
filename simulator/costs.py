"""What things cost and how long they take, for the simulator.

Per model: how long a replica takes to become ready from each tier (asleep; a standby
holding a built engine of the model's class, into which only the weights move (a swap);
a standby holding the weights in host memory or on its disk; a standby reading them from
the store; no standby adds the shape's boot time), and how fast a ready replica serves
(prefill tokens per second, seconds per output token). Per shape: its price and boot time come
from the Thaw config itself. A LoRA adapter (a model with ``base``) is served by its
base's engine at its base's speed; its own figures are how long loading it into a
running engine and unloading it take (``adapter_load_s``, ``adapter_unload_s``).

By default the figures come from the capacity planner (``thaw.planner``): the one
per-replica cost model, for a catalog model on the shape's GPU. A JSON file of
measured figures (``--costs FILE``) overrides any of them per model:

    {"defaults": {"standby_load_s": 12.0},
     "models": {"chat-8b": {"prefill_tokens_per_s": 20000, "tpot_s": 0.02}}}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from thaw.config import Model, ThawConfig
from thaw.planner import catalog
from thaw.planner.sizing import replica_performance
from thaw.units import GiB

GB = 1e9
# Assumptions of the default cost model (each overridable per model in a costs file).
# Weights stream from S3 into GPU memory at this rate per instance: runai's streamer
# and Thaw's reach several GB/s on instances with 100+ Gbit/s networking; 2 GB/s is a
# conservative middle for one instance pulling from S3.
LOAD_GB_PER_S = 2.0
# From a worker's own copy: host memory (a tmpfs) and instance-store NVMe.
HOST_LOAD_GB_PER_S = 10.0
DISK_LOAD_GB_PER_S = 4.0
# Engine start after the weights are in: restoring a snapshot (compile cache) instead
# of compiling (docs/BENCHMARKS.md, cold-start).
ENGINE_INIT_S = 5.0
# A swap into a built engine of the model's class (pools[].prebuild) reads the weights
# and skips the engine start; this much is added for the engine to take them (empty the
# prefix cache, rebuild the API layer, answer /health): measured ~0.3 s on a CPU engine
# with an 11 MB model, where the weights themselves take next to nothing.
SWAP_S = 0.3
# vLLM sleep mode level 1: weights back from host memory to the GPU, about a second.
WAKE_S = 1.0
# Releasing a replica (drain done, engine stopped) until the worker stands by again.
RELEASE_S = 2.0
# A LoRA adapter into a running engine of its base: fetch its few MiB from the store and
# vLLM's load; 0.03-0.05 s measured on a real worker (the controller's reaction to the
# request is the simulated tick, not part of this). Unloading it after its requests
# drained: about 0.4 s measured.
ADAPTER_LOAD_S = 0.05
ADAPTER_UNLOAD_S = 0.4


@dataclass(frozen=True)
class ModelCosts:
    """One model's figures, with where they came from."""

    weights_gib: float
    # Seconds from an assignment to ready: from a standby worker (stream the weights,
    # restore the engine) and from an asleep replica of the model (wake).
    standby_load_s: float
    asleep_load_s: float
    release_s: float
    # A ready replica: prompt tokens per second, and seconds per output token at the
    # replica's batch (max_concurrency_per_replica sequences).
    prefill_tokens_per_s: float
    tpot_s: float
    source: str
    # From a standby holding the weights in host memory, or on its disk (None: as from
    # the store).
    host_load_s: float | None = None
    disk_load_s: float | None = None
    # The part of each standby load time that starts the engine (the rest reads the
    # weights), which a swap into a built engine skips; and what a swap adds instead.
    engine_start_s: float = ENGINE_INIT_S
    swap_s: float = SWAP_S
    # An adapter (a model with ``base``): seconds to load it into a ready engine of its
    # base, and to unload it once its requests are done.
    adapter_load_s: float = ADAPTER_LOAD_S
    adapter_unload_s: float = ADAPTER_UNLOAD_S

    def load_s(self, tier: str) -> float:
        """Seconds to ready from ``tier``: asleep, host, disk, or the store (s3)."""
        if tier == "asleep":
            return self.asleep_load_s
        if tier == "host" and self.host_load_s is not None:
            return self.host_load_s
        if tier in ("host", "disk") and self.disk_load_s is not None:
            return self.disk_load_s
        return self.standby_load_s

    def swap_load_s(self, tier: str) -> float:
        """Seconds to ready by a swap into a built engine of the model's class, the
        weights read from ``tier`` (host, disk, s3): that tier's load time less the
        engine start, plus ``swap_s``."""
        return max(self.load_s(tier) - self.engine_start_s, 0.0) + self.swap_s


@dataclass(frozen=True)
class CostModel:
    models: dict[str, ModelCosts]

    def to_json(self) -> dict[str, Any]:
        return {name: asdict(c) for name, c in sorted(self.models.items())}


class CostError(ValueError):
    pass


_OVERRIDABLE = {f.name for f in fields(ModelCosts)} - {"source"}
# A costs file that gives all of these needs no planner (the tiers default to the store's,
# the engine start, the swap and the adapters' figures to the constants above).
_REQUIRED = _OVERRIDABLE - {"host_load_s", "disk_load_s", "engine_start_s", "swap_s", "adapter_load_s",
                            "adapter_unload_s"}


def planner_costs(model: Model, cfg: ThawConfig, catalog_model: str) -> ModelCosts:
    """The planner's figures for ``catalog_model`` on ``model``'s shape."""
    shape = cfg.shape(model.shape)
    if shape is None:
        raise CostError(f"model {model.name!r}: no shape {model.shape!r} in the config")
    gpu = catalog.gpu_for_type(shape.gpu_type)
    if gpu is None or shape.gpu_count == 0:
        raise CostError(
            f"shape {shape.name!r} (gpu_type {shape.gpu_type!r}) is not a GPU the planner knows "
            f"({', '.join(g.id for g in catalog.GPUS)}): give this model's figures in a costs file")
    try:
        spec = catalog.model(catalog_model)
    except ValueError as exc:
        raise CostError(str(exc)) from None
    gpus = model.engine.tensor_parallel_size or shape.gpu_count
    batch = model.autoscaling.max_concurrency_per_replica
    perf = replica_performance(spec, gpu, gpus, context_tokens=model.max_context_tokens, batch=None)
    if perf.max_batch < 1:
        raise CostError(
            f"model {model.name!r} as {spec.id} does not fit {gpus} x {gpu.id}: weights "
            f"{perf.weights_bytes / GiB:.1f} GiB leave room for {perf.kv_capacity_tokens} tokens of KV, "
            f"less than one {model.max_context_tokens}-token sequence")
    # The replica's batch: its concurrency cap, unless its KV cache holds fewer.
    perf = replica_performance(spec, gpu, gpus, context_tokens=model.max_context_tokens,
                               batch=max(1, min(batch, perf.max_batch)))
    weights_gb = perf.weights_bytes / GB
    return ModelCosts(
        weights_gib=perf.weights_bytes / GiB,
        standby_load_s=weights_gb / LOAD_GB_PER_S + ENGINE_INIT_S,
        host_load_s=weights_gb / HOST_LOAD_GB_PER_S + ENGINE_INIT_S,
        disk_load_s=weights_gb / DISK_LOAD_GB_PER_S + ENGINE_INIT_S,
        asleep_load_s=WAKE_S,
        release_s=RELEASE_S,
        prefill_tokens_per_s=perf.prefill_tokens_per_s,
        tpot_s=perf.decode_step_s,
        source=(f"planner: {spec.id} on {gpus} x {gpu.id}, batch {perf.batch}; load "
                f"{weights_gb:.1f} GB / {LOAD_GB_PER_S:g} GB/s + {ENGINE_INIT_S:g} s engine; swap: the weights "
                f"+ {SWAP_S:g} s; wake {WAKE_S:g} s"),
    )


def read_overrides(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CostError(f"{path}: cannot read costs: {exc}") from None
    if not isinstance(data, dict) or set(data) - {"defaults", "models"}:
        raise CostError(f"{path}: a costs file is an object with 'defaults' and/or 'models'")
    for where, block in [("defaults", data.get("defaults", {}))] + [
            (f"models.{k}", v) for k, v in (data.get("models") or {}).items()]:
        if not isinstance(block, dict):
            raise CostError(f"{path}: {where} must be an object")
        bad = set(block) - _OVERRIDABLE
        if bad:
            raise CostError(f"{path}: {where}: unknown {sorted(bad)}; known: {sorted(_OVERRIDABLE)}")
        for k, v in block.items():
            if not isinstance(v, int | float) or isinstance(v, bool) or v < 0 or (v == 0 and k in (
                    "prefill_tokens_per_s",)):
                raise CostError(f"{path}: {where}.{k} must be a number >= 0 (prefill > 0), got {v!r}")
    return data


def cost_model(cfg: ThawConfig, *, catalog_model: str = "llama-3.1-8b",
               overrides: dict[str, Any] | None = None) -> CostModel:
    """Every configured model's figures: the planner's for ``catalog_model``, then the
    overrides' ``defaults``, then their per-model values. A model whose every figure is
    given needs no planner (a CPU shape, say)."""
    overrides = overrides or {}
    defaults = overrides.get("defaults", {})
    per_model = overrides.get("models", {})
    unknown = set(per_model) - {m.name for m in cfg.models}
    if unknown:
        raise CostError(f"costs for models not in the config: {sorted(unknown)}")
    out = {}
    for m in cfg.models:
        given = {**defaults, **per_model.get(m.name, {})}
        if _REQUIRED <= set(given):
            costs = ModelCosts(**{k: float(given[k]) for k in _OVERRIDABLE & set(given)}, source="costs file")
        else:
            costs = planner_costs(m, cfg, catalog_model)
            if given:
                costs = replace(costs, **{k: float(v) for k, v in given.items()},
                                source=costs.source + f"; from the costs file: {', '.join(sorted(given))}")
        out[m.name] = costs
    return CostModel(out)
