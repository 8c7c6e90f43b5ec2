"""Does a model fit its shape? Weights plus a minimal KV cache against the memory the
engine may use, checked before anything launches (`thaw config check`).

Pure: the caller supplies the weights' size (the store's manifest, or an operator's
``--assume-size``) and, when the store has it, the model's ``config.json``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from thaw.config import EngineArgs, InstanceShape, Model, ThawConfig

# The planner owns the KV-size formula; the fit check and `thaw plan` share it.
from thaw.planner.sizing import kv_bytes_per_token_of_config as kv_bytes_per_token
from thaw.units import GiB

# Without the model's config.json: a KV cache for one full-context sequence is assumed
# to need this much (an 8B model at 8k tokens needs about 1 GiB in bf16).
FALLBACK_KV_GIB = 1.0


@dataclass(frozen=True)
class ModelSize:
    weights_bytes: int
    # Where the size came from, for the message: "manifest" or "--assume-size".
    source: str
    # The model's config.json (for the KV cache per token); None when not known.
    hf_config: dict[str, Any] | None = None


def fit_problem(index: int | None, model: Model, cfg: ThawConfig, size: ModelSize) -> str | None:
    """Why ``model`` cannot run on its shape, naming both numbers; None when it fits.
    ``index``: the model's place in the config file (None: a model deployed at run time)."""
    shape = cfg.shape(model.shape)
    if shape is None:
        return None
    e = model.engine
    per_token = kv_bytes_per_token(size.hf_config, e.dtype) if size.hf_config else None
    if per_token is not None:
        kv = per_token * model.max_context_tokens
        kv_note = f"one {model.max_context_tokens}-token sequence"
    else:
        kv = int(FALLBACK_KV_GIB * GiB)
        kv_note = f"assumed {FALLBACK_KV_GIB:g} GiB: no config.json to size it"
    if shape.gpu_count > 0:
        gpus = e.tensor_parallel_size or 1
        usable = gpus * shape.gpu_memory_gib * GiB * e.gpu_memory_utilization
        where = (f"{gpus} x {shape.gpu_memory_gib:g} GiB x gpu_memory_utilization "
                 f"{e.gpu_memory_utilization:g} = {usable / GiB:.1f} GiB")
    else:
        kv = max(kv, int(e.cpu_kvcache_gib * GiB))
        kv_note = f"cpu_kvcache_gib {e.cpu_kvcache_gib:g}" if kv == int(e.cpu_kvcache_gib * GiB) else kv_note
        # The host cache tier holds a copy of the weights in the same memory.
        usable = (shape.host_memory_gib - shape.host_cache_gib) * GiB
        where = f"host memory {shape.host_memory_gib:g} GiB" + (
            f" less host_cache_gib {shape.host_cache_gib:g}" if shape.host_cache_gib else "")
    need = size.weights_bytes + kv
    if need <= usable:
        return None
    what = f"models[{index}] ({model.name})" if index is not None else f"model {model.name!r}"
    return (f"{what}: weights {size.weights_bytes / GiB:.1f} GiB ({size.source}) + "
            f"KV cache {kv / GiB:.2f} GiB ({kv_note}) = {need / GiB:.1f} GiB do not fit shape "
            f"{shape.name!r}: {where}; use a shape with more GPU memory or raise tensor_parallel_size")


# -- several engines on one worker (pools[].pack) ----------------------------------------

# On a CPU worker, what an engine's processes hold beyond its weights and KV cache (the
# API server and the engine core, each with torch and vLLM imported): about 1 GiB each
# for the tiny demo models, measured as RSS.
CPU_ENGINE_PROCESS_GIB = 2.0


def cpu_kvcache_gib(engine: EngineArgs) -> int:
    """The KV cache a CPU engine gets: vLLM reads whole GiB, so ``cpu_kvcache_gib`` is
    rounded up (at least 1) for the launch, and counted so in the fit."""
    return max(1, math.ceil(engine.cpu_kvcache_gib))


def engine_memory(weights_bytes: int, engine: EngineArgs, shape: InstanceShape) -> int:
    """The memory one engine of a model holds on ``shape``: on a GPU, its share of each
    device it uses (``gpu_memory_utilization``: vLLM sizes its KV cache to fill it); on
    the CPU, its weights, its KV cache and its processes.

    The engines of a worker are not pinned to devices: each uses the first
    ``tensor_parallel_size`` of them, so the first device holds a share of every engine,
    and that device is what packing fills (``engine_capacity``)."""
    if shape.gpu_count > 0:
        return int(shape.gpu_memory_gib * GiB * engine.gpu_memory_utilization)
    return weights_bytes + cpu_kvcache_gib(engine) * GiB + int(CPU_ENGINE_PROCESS_GIB * GiB)


# A worker that packs keeps an engine host imported for its next packed engine
# (worker.spare): 0.65 GiB RSS measured, reserved out of a CPU worker's capacity.
SPARE_ENGINE_HOST_GIB = 1.0


def engine_capacity(shape: InstanceShape) -> int:
    """The memory the engines of one worker of ``shape`` may hold together when it packs:
    one GPU's memory (every engine uses the first device: see ``engine_memory``), or on
    the CPU its host memory less the host cache tier and the spare engine host."""
    if shape.gpu_count > 0:
        return int(shape.gpu_memory_gib * GiB)
    return int((shape.host_memory_gib - shape.host_cache_gib - SPARE_ENGINE_HOST_GIB) * GiB)


def pack_problem(need: int, held: Sequence[int], capacity: int) -> str | None:
    """Why an engine needing ``need`` bytes does not fit beside engines holding ``held``
    within ``capacity`` (both numbers named); None when it fits."""
    free = capacity - sum(held)
    if need <= free:
        return None
    return (f"the engine needs {need / GiB:.2f} GiB but {free / GiB:.2f} GiB are free: "
            f"{len(held)} engine(s) hold {sum(held) / GiB:.2f} GiB of {capacity / GiB:.2f} GiB")
