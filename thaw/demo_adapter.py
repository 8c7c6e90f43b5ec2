"""A deterministic LoRA adapter for a demo model (`thaw demo-model OUT --adapter-of BASE`).

The adapter has PEFT's layout, as vLLM and every other LoRA loader read it:
``adapter_config.json`` and ``adapter_model.safetensors`` holding ``lora_A`` (rank x in)
and ``lora_B`` (out x rank) for the attention projections of every layer of the base.
Its values come from the same seeded per-tensor streams as the demo model's weights,
so the same ``(base, rank, seed)`` gives byte-identical files. ``lora_B`` is not zero (a
freshly initialised PEFT adapter's is), so the adapter changes what the model says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from thaw.demo_model import read_demo_model
from thaw.demo_weights import DemoFile, json_text, write_safetensors, write_text

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
DEFAULT_RANK = 8


@dataclass(frozen=True)
class DemoAdapterInfo:
    path: Path
    base: Path
    rank: int
    seed: int
    files: tuple[DemoFile, ...]


def adapter_shapes(base_dir: Path, rank: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of the adapter, by its PEFT name."""
    d = read_demo_model(base_dir).dims
    q, kv, h = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim, d.hidden_size
    dims = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}  # (in, out)
    shapes: dict[str, tuple[int, ...]] = {}
    for n in range(d.num_layers):
        for mod in TARGET_MODULES:
            fan_in, fan_out = dims[mod]
            p = f"base_model.model.model.layers.{n}.self_attn.{mod}"
            shapes[f"{p}.lora_A.weight"] = (rank, fan_in)
            shapes[f"{p}.lora_B.weight"] = (fan_out, rank)
    return shapes


def build_demo_adapter(out_dir: Path, base_dir: Path, *, rank: int = DEFAULT_RANK, seed: int = 1,
                       overwrite: bool = False) -> DemoAdapterInfo:
    """Write a LoRA adapter of the demo model at ``base_dir`` into ``out_dir``;
    ``adapter_config.json`` is written last (a directory with it is complete)."""
    out_dir, base_dir = Path(out_dir), Path(base_dir)
    if not 1 <= rank <= 256:
        raise ValueError(f"rank must be between 1 and 256, got {rank}")
    if seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed}")
    shapes = adapter_shapes(base_dir, rank)  # reads the base first: nothing is written for a bad one
    out_dir.mkdir(parents=True, exist_ok=True)
    ours = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
    if any(p.name not in ours for p in out_dir.iterdir()) or (any(out_dir.iterdir()) and not overwrite):
        raise FileExistsError(f"{out_dir} is not empty; build the adapter into an empty directory "
                              "(or pass overwrite=True / --overwrite over an earlier adapter)")
    weights = write_safetensors(out_dir / ADAPTER_WEIGHTS, list(shapes), shapes, seed)
    base_config = json.loads((base_dir / "config.json").read_text(encoding="utf-8"))
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank,
        # Scaling alpha / r = 4: the adapter moves the demo model's outputs visibly.
        "lora_alpha": 4 * rank, "lora_dropout": 0.0, "bias": "none",
        "target_modules": list(TARGET_MODULES), "fan_in_fan_out": False, "inference_mode": True,
        "base_model_name_or_path": base_config.get("_name_or_path") or base_dir.name,
    }
    files = (weights, write_text(out_dir / ADAPTER_CONFIG, json_text(config)))
    return DemoAdapterInfo(path=out_dir, base=base_dir, rank=rank, seed=seed,
                           files=tuple(sorted(files, key=lambda f: f.name)))
