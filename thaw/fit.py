"""Does a model fit its shape? Weights plus a minimal KV cache against the memory the
engine may use, checked before anything launches (`thaw config check`).

Pure: the caller supplies the weights' size (the store's manifest, or an operator's
``--assume-size``) and, when the store has it, the model's ``config.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from thaw.config import Model, ThawConfig

# The planner owns the KV-size formula; the fit check and `thaw plan` share it.
from thaw.planner.sizing import kv_bytes_per_token_of_config as kv_bytes_per_token

GIB = 1024**3
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


def fit_problem(index: int, model: Model, cfg: ThawConfig, size: ModelSize) -> str | None:
    """Why ``model`` cannot run on its shape, naming both numbers; None when it fits."""
    shape = cfg.shape(model.shape)
    if shape is None:
        return None
    e = model.engine
    per_token = kv_bytes_per_token(size.hf_config, e.dtype) if size.hf_config else None
    if per_token is not None:
        kv = per_token * model.max_context_tokens
        kv_note = f"one {model.max_context_tokens}-token sequence"
    else:
        kv = int(FALLBACK_KV_GIB * GIB)
        kv_note = f"assumed {FALLBACK_KV_GIB:g} GiB: no config.json to size it"
    if shape.gpu_count > 0:
        gpus = e.tensor_parallel_size or 1
        usable = gpus * shape.gpu_memory_gib * GIB * e.gpu_memory_utilization
        where = (f"{gpus} x {shape.gpu_memory_gib:g} GiB x gpu_memory_utilization "
                 f"{e.gpu_memory_utilization:g} = {usable / GIB:.1f} GiB")
    else:
        kv = max(kv, int(e.cpu_kvcache_gib * GIB))
        kv_note = f"cpu_kvcache_gib {e.cpu_kvcache_gib:g}" if kv == int(e.cpu_kvcache_gib * GIB) else kv_note
        # The host cache tier holds a copy of the weights in the same memory.
        usable = (shape.host_memory_gib - shape.host_cache_gib) * GIB
        where = f"host memory {shape.host_memory_gib:g} GiB" + (
            f" less host_cache_gib {shape.host_cache_gib:g}" if shape.host_cache_gib else "")
    need = size.weights_bytes + kv
    if need <= usable:
        return None
    return (f"models[{index}] ({model.name}): weights {size.weights_bytes / GIB:.1f} GiB ({size.source}) + "
            f"KV cache {kv / GIB:.2f} GiB ({kv_note}) = {need / GIB:.1f} GiB do not fit shape "
            f"{shape.name!r}: {where}; use a shape with more GPU memory or raise tensor_parallel_size")
