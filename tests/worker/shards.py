"""A demo model's one safetensors file rewritten as shards with an index, as checkpoints
above a shard size are (the demo builder shards only above 2 GiB)."""

from __future__ import annotations

import json
from pathlib import Path


def split_in_two_shards(d: Path) -> str:
    """Rewrite ``d``'s one safetensors file as two shards with an index; returns the
    second shard's name."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(d / "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(d / shard), metadata={"format": "pt"})
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: shard for shard, part in shards.items() for n in part}}))
    return "model-00002-of-00002.safetensors"
