"""The engine core's side of a weight swap: ``--worker-extension-cls`` for vLLM.

vLLM mixes :class:`ThawSwapExtension` into its worker class, so the engine host can
call :meth:`ThawSwapExtension.thaw_swap_weights` by name through ``collective_rpc``
(no pickled code crosses the process boundary). It streams the new model's weights
with Thaw's loader (``weight_streaming.vllm_loader.FileByFileWeights``: one file at a
time, through the cache tiers, each file checked) into vLLM's layerwise in-place
reload: each layer's weights are gathered, processed (on the CPU: repacked for
oneDNN) and copied into the tensors the engine already has, so the engine's
KV cache, compiled graphs and buffers are kept and nothing holds a second copy of
the whole model.

vLLM's own ``reload_weights`` only logs parameters the checkpoint did not provide,
and a layer that got no weights keeps its old ones: served, that is a mix of two
models. Here the same steps run with checks, and any that fails raises; the engine
host then treats the engine as dirty (it is never served again; the agent replaces
it). What a swap proves before the engine serves:

- every tensor handed to the engine is the new model's as pushed: its name, dtype,
  shape and CRC-32 against the manifest, and every tensor the manifest lists was
  handed over (``weight_streaming.tensor_check``, unless ``verify_tensors`` is off);
- every element of every parameter of every layer was written from them: vLLM's
  layerwise reload counts the elements each layer's weight loaders copied (padding
  excluded), and a layer whose count falls short of its parameters' size (a fused
  ``qkv_proj`` missing ``v_proj``, a layer the checkpoint lacks) is refused by name,
  as is a parameter the model's ``load_weights`` did not report (tied weights share
  one parameter and count once);
- no weights outside the model's own stay behind: an engine with a draft model
  (speculative decoding) is refused, since its drafter's weights are not reloaded,
  and LoRA adapters are dropped (``reset_lora_state``).

Imported in the engine core only (vLLM, torch).
"""

from __future__ import annotations

import time
from typing import Any

from weight_streaming.vllm_loader import FileByFileWeights, StreamOptions, ThawLoadError


class ThawSwapExtension:
    """Methods vLLM adds to its worker (``self`` is the worker)."""

    vllm_config: Any
    model_runner: Any

    def thaw_swap_weights(self, uri: str, loader_options: dict[str, Any]) -> dict[str, Any]:
        """Replace every weight of the engine's model by the model at ``uri``'s; returns
        the load summary (bytes, seconds, bytes per source), or on failure ``failed``
        (the error) and ``kind`` (``worker.launch.failure_kind``: an exception's type
        does not survive vLLM's RPC back to the engine host)."""
        try:
            return self._thaw_swap_weights(uri, loader_options)
        except Exception as exc:
            from worker.launch import failure_kind, root_cause

            return {"failed": root_cause(exc), "kind": failure_kind(exc)}

    def _thaw_swap_weights(self, uri: str, loader_options: dict[str, Any]) -> dict[str, Any]:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        if self.vllm_config.speculative_config is not None:
            raise ThawLoadError(f"{uri}: this engine has a draft model (speculative decoding) whose weights a swap "
                                "would leave behind; it cannot take another model by swap")
        runner = self.model_runner
        model = runner.get_model()
        lora = self.vllm_config.lora_config is not None
        wanted = {name.replace(".base_layer.", ".") if lora else name for name, _ in model.named_parameters()}
        weights = FileByFileWeights(uri, StreamOptions.from_extra_config(loader_options))
        t0 = time.perf_counter()
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(model)
            loaded = model.load_weights(iter(weights))
            short = layers_not_filled(model)
            if short:
                shown = ", ".join(short[:10]) + (f" and {len(short) - 10} more" if len(short) > 10 else "")
                raise ThawLoadError(f"{uri}: the checkpoint does not fill every weight of these layers: {shown}")
            finalize_layerwise_reload(model, self.vllm_config.model_config)
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            fn = getattr(runner, reset, None)
            if fn is not None:
                fn()
        if loaded is not None:
            missing = sorted(wanted - set(loaded))
            if missing:
                shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
                raise ThawLoadError(f"{uri}: the checkpoint does not provide these parameters: {shown}")
        # What the engine core now holds (its config files stay the class's: identical).
        self.vllm_config.model_config.model_weights = uri
        return {"load": weights.summary, "reload_s": round(time.perf_counter() - t0, 4)}


def layers_not_filled(model: Any) -> list[str]:
    """The layers whose parameters the load so far did not fill, with what they got
    (``model.layers.1.self_attn.qkv_proj (got weight[k], weight[q]: loaded/expected
    elements)``), read from vLLM's layerwise reload before it finalises: a layer is
    processed (and forgotten) as soon as its loaders copied as many elements as its
    tensors hold, so one still waiting got less than its parameters need. Padding is
    excluded by vLLM's own count; buffers (caches the model computes, such as rotary
    tables) are not expected from a checkpoint."""
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    from vllm.model_executor.model_loader.reload.utils import get_tensor_load_numel

    out = []
    for name, layer in model.named_modules():
        info = LAYERWISE_INFO.get(layer)
        if info is None or not info.can_load():
            continue
        params, _ = info.restore_metadata
        expected = sum(get_tensor_load_numel(t) for t in params.values())
        if expected and info.load_numel < expected:
            got = sorted(p if (shard := _shard(a.arguments)) is None else f"{p}[{shard}]"
                         for p, a in info.loaded_weights)
            out.append(f"{name or type(layer).__name__} (got {', '.join(got) or 'nothing'}: "
                       f"{info.load_numel}/{expected} elements)")
    return out


def _shard(arguments: dict[str, Any]) -> Any:
    """Which part of a fused parameter a weight loader call filled (q, k, v; 0, 1), if any."""
    return next((arguments[k] for k in ("loaded_shard_id", "shard_id") if arguments.get(k) is not None), None)
