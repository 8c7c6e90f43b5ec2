"""Engine classes: which models one built vLLM engine can serve after a weight swap.

An engine built for model A can serve model B, once B's weights replace A's in
place, when nothing the engine was built from differs between them: the
architecture and every tensor shape (``config.json``: hidden size, layers, heads,
vocabulary, rope, norms, quantization, ...), the dtype it runs in, the context
length, the tensor-parallel size and the engine arguments (KV-cache size, compile
mode, every ``engine.extra`` flag). What the engine is *not* built from is left
out: names and provenance in ``config.json``, how the weights are read
(``load_format``, the loader's options) and whether snapshots are used. The
tokenizer, chat template and generation defaults are the API layer's, which a
swap replaces with the new model's; they are not part of the class either.

Deliberately conservative: two models that differ in any other ``config.json``
key are of different classes, even where the difference would not matter, so a
swap is never wrong. The id is a short hash of the inputs, like a snapshot's
fingerprint (``snapshotter.fingerprint``); :func:`engine_class_inputs` and
:func:`engine_class_of` are pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from thaw.config import EngineArgs
from thaw.digest import diff_inputs, format_diff, json_normal, short_id

__all__ = ["CLASS_VERSION", "EngineClass", "engine_class_inputs", "engine_class_of", "explain_mismatch"]

# Bump when the meaning of the inputs changes: every class gets a new id.
CLASS_VERSION = 1

# config.json keys that change nothing in the engine vLLM builds: provenance, and the
# dtype key (folded into the resolved dtype below).
_IGNORED_CONFIG_KEYS = frozenset({"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache"})
# engine.extra keys that only say how the weights are read.
_IGNORED_EXTRA_KEYS = frozenset({"model_loader_extra_config"})


@dataclass(frozen=True)
class EngineClass:
    """``id`` names the class (in heartbeats, placement, ``thaw models ls``);
    ``inputs`` say what it is made of."""

    id: str
    inputs: dict[str, Any]


def _resolved_dtype(config: Mapping[str, Any], engine: EngineArgs) -> str:
    if engine.dtype != "auto":
        return engine.dtype
    # vLLM's "auto": the checkpoint's dtype (transformers writes torch_dtype, newer
    # releases dtype), float16 for a float32 checkpoint on GPUs; kept as written.
    return str(config.get("torch_dtype") or config.get("dtype") or "auto")


def engine_class_inputs(config: Mapping[str, Any], engine: EngineArgs, *, max_model_len: int,
                        tensor_parallel_size: int | None = None) -> dict[str, Any]:
    """Everything a built engine depends on (see the module docstring), JSON-ready.

    ``config`` is the model's ``config.json``; ``tensor_parallel_size`` defaults to
    the engine's own (None there: 1).
    """
    if not isinstance(config.get("architectures"), list) or not config["architectures"]:
        raise ValueError("config.json names no architectures: not a model vLLM can build")
    return json_normal({
        "class_version": CLASS_VERSION,
        "config": {k: v for k, v in config.items() if k not in _IGNORED_CONFIG_KEYS},
        "dtype": _resolved_dtype(config, engine),
        "max_model_len": max_model_len,
        "tensor_parallel_size": tensor_parallel_size or engine.tensor_parallel_size or 1,
        "enforce_eager": engine.enforce_eager,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "cpu_kvcache_gib": engine.cpu_kvcache_gib,
        "extra": {k: v for k, v in engine.extra.items() if k not in _IGNORED_EXTRA_KEYS},
    })


def engine_class_of(config: Mapping[str, Any], engine: EngineArgs, *, max_model_len: int,
                    tensor_parallel_size: int | None = None) -> EngineClass:
    inputs = engine_class_inputs(config, engine, max_model_len=max_model_len,
                                 tensor_parallel_size=tensor_parallel_size)
    return EngineClass(short_id(inputs), inputs)


def explain_mismatch(built: EngineClass, wanted: EngineClass) -> str:
    """Why an engine of class ``built`` cannot serve a model of class ``wanted``:
    every input that differs (config keys as ``config.KEY``)."""
    def flat(inputs: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in inputs.items() if k != "config"}
        out.update({f"config.{k}": v for k, v in inputs.get("config", {}).items()})
        return out

    return format_diff(diff_inputs(flat(built.inputs), flat(wanted.inputs))) or "same class"
