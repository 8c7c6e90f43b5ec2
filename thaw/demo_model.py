"""Build a small, deterministic Llama-architecture model directory for demos and benchmarks.

The output is a Hugging Face-style directory (``config.json``, safetensors
weights, a fast tokenizer with a Llama-3-style chat template) that vLLM loads
like any other local model. Weights are random, so the text it generates is
gibberish; what matters is that every code path (upload, weight streaming,
engine load, chat, streaming responses) runs for real and fast.

Everything is a pure function of ``(size, seed)`` and the corpus shipped in
``thaw/data/corpus.txt``: two builds give byte-identical files. Weights come
and their files are written by ``thaw.demo_weights``; the tokenizer is
``thaw.demo_tokenizer``'s. This module chooses the shapes for a size and lays out
the directory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from thaw.demo_tokenizer import (
    BOS_TOKEN,
    END_OF_TEXT_TOKEN,
    EOT_TOKEN,
    TOKENIZER_VOCAB_SIZE,
    token_ids,
    tokenizer_config,
    train_tokenizer,
)
from thaw.demo_weights import (
    BYTES_PER_PARAM,
    INIT_STD,
    DemoFile,
    json_text,
    plan_shards,
    read_safetensors_header,
    write_safetensors,
    write_text,
)
from thaw.units import human_bytes, parse_size_bytes

# --- model shape ---------------------------------------------------------

TINY = "tiny"
DTYPE = "bfloat16"  # vLLM's CPU backend runs bf16 natively; GPUs do too.
MAX_POSITION_EMBEDDINGS = 2048
ROPE_THETA = 500000.0
RMS_NORM_EPS = 1e-5
# Widths tried when scaling to a byte size, smallest first. Each is a
# multiple of 128 so head_dim 64/128 divides it.
_WIDTHS = (256, 512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 8192, 12288, 16384)
_INTERMEDIATE_MULTIPLE = 64

PROVENANCE_FILE = "thaw_demo.json"
SINGLE_WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
_OUR_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    SINGLE_WEIGHTS_FILE,
    INDEX_FILE,
    PROVENANCE_FILE,
)

@dataclass(frozen=True)
class DemoDims:
    """The architecture numbers of a demo model (what ``config.json`` says)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int = MAX_POSITION_EMBEDDINGS
    dtype: str = DTYPE

    @property
    def num_parameters(self) -> int:
        """Total parameter count (untied embeddings and LM head)."""
        return sum(math.prod(s) for s in expected_tensor_shapes(self).values())

    @property
    def weight_bytes(self) -> int:
        """Bytes of tensor data in the safetensors file(s), headers excluded."""
        return self.num_parameters * BYTES_PER_PARAM

    def summary(self) -> str:
        """One line, e.g. ``hidden=256 layers=4 heads=4 kv_heads=2 ...``."""
        return (
            f"hidden={self.hidden_size} layers={self.num_layers} heads={self.num_heads} "
            f"kv_heads={self.num_kv_heads} head_dim={self.head_dim} "
            f"intermediate={self.intermediate_size} vocab={self.vocab_size} "
            f"max_pos={self.max_position_embeddings} dtype={self.dtype}"
        )


@dataclass(frozen=True)
class DemoModelInfo:
    """What a demo model directory holds; returned by the builder and by ``read_demo_model``."""

    path: Path
    dims: DemoDims
    size: str  # the size as requested: "tiny", "1GiB", "67108864"
    seed: int | None  # None when the directory carries no provenance file
    num_parameters: int
    weight_bytes: int
    files: tuple[DemoFile, ...]

    @property
    def total_bytes(self) -> int:
        """Bytes on disk of every file listed."""
        return sum(f.size_bytes for f in self.files)

    @property
    def weight_files(self) -> tuple[str, ...]:
        """Names of the safetensors files, in order."""
        return tuple(f.name for f in self.files if f.name.endswith(".safetensors"))

    def summary(self) -> str:
        """A few human-readable lines for CLI output."""
        seed = "?" if self.seed is None else str(self.seed)
        lines = [
            f"demo model {self.path} (size={self.size}, seed={seed})",
            f"  LlamaForCausalLM {self.dims.summary()}",
            f"  parameters {self.num_parameters:,} ({_human_count(self.num_parameters)}), "
            f"weights {self.weight_bytes:,} bytes ({human_bytes(self.weight_bytes)}) "
            f"in {len(self.weight_files)} file(s), {human_bytes(self.total_bytes)} on disk",
        ]
        for f in self.files:
            digest = f"  sha256={f.sha256[:16]}" if f.sha256 else ""
            lines.append(f"    {f.name:<40} {human_bytes(f.size_bytes):>10}{digest}")
        return "\n".join(lines)


def tiny_dims() -> DemoDims:
    """The default model: ~5.5M parameters, ~11 MB of bf16 weights.

    head_dim 64 with 4 query and 2 KV heads exercises grouped-query attention
    and is a head size every vLLM attention backend (CPU included) supports.
    """
    return DemoDims(
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        intermediate_size=1024,
        vocab_size=TOKENIZER_VOCAB_SIZE,
    )


def _heads_for_width(hidden: int) -> tuple[int, int, int]:
    """(num_heads, num_kv_heads, head_dim) for a width, Llama-style GQA."""
    head_dim = 64 if hidden < 1024 else 128
    heads = hidden // head_dim
    # About a quarter of the query heads, a power of two that divides them,
    # so tensor-parallel splits that work for the query heads work here too.
    kv_heads = 2
    while kv_heads * 2 <= heads // 4 and heads % (kv_heads * 2) == 0:
        kv_heads *= 2
    return heads, kv_heads, head_dim


def _dims_with(hidden: int, layers: int, intermediate: int) -> DemoDims:
    heads, kv_heads, head_dim = _heads_for_width(hidden)
    return DemoDims(
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=TOKENIZER_VOCAB_SIZE,
    )


def dims_for_size(size: str | int) -> DemoDims:
    """Choose dimensions for ``"tiny"`` or a weight size (e.g. ``"1GiB"``, ``268435456``).

    For a byte size: take the widest hidden size that still leaves at least
    ``max(4, hidden / 128)`` layers at an MLP ratio of 3 (roughly the depth to
    width of real Llama models, so there are many mid-sized tensors like a real
    checkpoint), then solve the intermediate size so the weights land on the
    target. The result is within a fraction of a percent for anything but
    sizes near the minimum, which raise ValueError when they cannot come within 10%.
    """
    if isinstance(size, str) and size.strip().lower() == TINY:
        return tiny_dims()
    try:
        target_params = parse_size_bytes(size) // BYTES_PER_PARAM
    except ValueError as exc:
        raise ValueError(f"{exc} (or {TINY!r})") from None

    def params(hidden: int, layers: int, intermediate: int) -> int:
        return _dims_with(hidden, layers, intermediate).num_parameters

    chosen: tuple[int, int] | None = None
    for hidden in _WIDTHS:
        per_layer = params(hidden, 2, 3 * hidden) - params(hidden, 1, 3 * hidden)
        fixed = params(hidden, 0, 3 * hidden)  # embeddings, final norm, LM head
        layers = (target_params - fixed) // per_layer
        if layers >= max(4, hidden // 128) or (chosen is None and layers >= 1):
            chosen = (hidden, layers)
    if chosen is None:
        chosen = (_WIDTHS[0], 1)
    hidden, layers = chosen

    # Everything but the MLP is fixed now; the MLP has 3 * hidden * I params per layer.
    non_mlp = params(hidden, layers, 0)
    per_unit = 3 * hidden * layers
    raw = (target_params - non_mlp) / per_unit
    intermediate = max(
        _INTERMEDIATE_MULTIPLE, round(raw / _INTERMEDIATE_MULTIPLE) * _INTERMEDIATE_MULTIPLE
    )
    dims = _dims_with(hidden, layers, intermediate)
    target_bytes = target_params * BYTES_PER_PARAM
    if abs(dims.weight_bytes - target_bytes) > 0.1 * target_bytes:
        smallest = _dims_with(_WIDTHS[0], 1, _INTERMEDIATE_MULTIPLE).weight_bytes
        raise ValueError(
            f"size {size!r} is too small for a demo model: the smallest is about "
            f"{human_bytes(smallest)} of weights (or use {TINY!r})"
        )
    return dims


def expected_tensor_shapes(dims: DemoDims) -> dict[str, tuple[int, ...]]:
    """Every tensor ``LlamaForCausalLM`` loads, by name, in module order."""
    h, q, kv, i = (
        dims.hidden_size,
        dims.num_heads * dims.head_dim,
        dims.num_kv_heads * dims.head_dim,
        dims.intermediate_size,
    )
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (dims.vocab_size, h)}
    for n in range(dims.num_layers):
        p = f"model.layers.{n}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (q, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (i, h)
        shapes[p + "mlp.up_proj.weight"] = (i, h)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (dims.vocab_size, h)
    return shapes


# --- the directory -----------------------------------------------------------


def _config(dims: DemoDims, ids: dict[str, int]) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": ids[BOS_TOKEN],
        "eos_token_id": [ids[END_OF_TEXT_TOKEN], ids[EOT_TOKEN]],
        "head_dim": dims.head_dim,
        "hidden_act": "silu",
        "hidden_size": dims.hidden_size,
        "initializer_range": INIT_STD,
        "intermediate_size": dims.intermediate_size,
        "max_position_embeddings": dims.max_position_embeddings,
        "mlp_bias": False,
        "num_attention_heads": dims.num_heads,
        "num_hidden_layers": dims.num_layers,
        "num_key_value_heads": dims.num_kv_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_scaling": None,
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": False,
        # transformers < 4.56 and other readers know only torch_dtype; 5.x maps it to dtype.
        "torch_dtype": dims.dtype,
        "use_cache": True,
        "vocab_size": dims.vocab_size,
    }


def _size_label(size: str | int) -> str:
    return size.strip() if isinstance(size, str) else str(size)


def build_demo_model(
    out_dir: Path,
    *,
    size: str | int = TINY,
    seed: int = 0,
    overwrite: bool = False,
) -> DemoModelInfo:
    """Write a demo Llama model into ``out_dir`` and describe it.

    ``size`` is ``"tiny"`` (~11 MB, the default) or a target weight size such
    as ``"256MiB"``, ``"1GiB"`` or a byte count; the weights land within 10%
    (usually within 1%) of it. Up to 2 GiB the weights are one
    ``model.safetensors``; above, ``model-0000k-of-0000n.safetensors`` plus
    ``model.safetensors.index.json``. The same ``(size, seed)`` always gives
    byte-identical files. ``out_dir`` is created if needed; if it is not empty,
    ``overwrite=True`` is required, and then the files this builder writes are
    replaced (stale shards removed) and anything else is left alone.
    Files appear atomically one by one; ``config.json`` is written last, so a
    directory with a ``config.json`` is complete.
    """
    out_dir = Path(out_dir)
    dims = dims_for_size(size)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(
                f"{out_dir} is not empty; rebuild the demo model there with overwrite=True (CLI: --overwrite)"
            )
        for p in out_dir.iterdir():
            if p.name in _OUR_FILES or _SHARD_RE.match(p.name) or p.name.endswith(".partial"):
                p.unlink()

    shapes = expected_tensor_shapes(dims)
    files: list[DemoFile] = []
    shards = plan_shards(shapes)
    if len(shards) == 1:
        files.append(write_safetensors(out_dir / SINGLE_WEIGHTS_FILE, shards[0], shapes, seed))
    else:
        weight_map: dict[str, str] = {}
        for k, names in enumerate(shards, start=1):
            fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            files.append(write_safetensors(out_dir / fname, names, shapes, seed))
            weight_map.update({n: fname for n in names})
        index = {
            "metadata": {"total_size": dims.weight_bytes},
            "weight_map": dict(sorted(weight_map.items())),
        }
        files.append(write_text(out_dir / INDEX_FILE, json_text(index)))

    tokenizer_json = train_tokenizer()
    ids = token_ids(tokenizer_json)
    files.append(write_text(out_dir / "tokenizer.json", tokenizer_json))
    files.append(
        write_text(out_dir / "tokenizer_config.json", json_text(tokenizer_config(ids, dims.max_position_embeddings)))
    )
    files.append(
        write_text(
            out_dir / "special_tokens_map.json",
            json_text({"bos_token": BOS_TOKEN, "eos_token": EOT_TOKEN}),
        )
    )
    files.append(
        write_text(
            out_dir / "generation_config.json",
            json_text(
                {
                    "bos_token_id": ids[BOS_TOKEN],
                    "eos_token_id": [ids[END_OF_TEXT_TOKEN], ids[EOT_TOKEN]],
                }
            ),
        )
    )
    files.append(
        write_text(
            out_dir / PROVENANCE_FILE,
            json_text(
                {
                    "builder": "thaw.demo_model",
                    "format_version": 1,
                    "seed": seed,
                    "size": _size_label(size),
                }
            ),
        )
    )
    files.append(write_text(out_dir / "config.json", json_text(_config(dims, ids))))
    return DemoModelInfo(
        path=out_dir,
        dims=dims,
        size=_size_label(size),
        seed=seed,
        num_parameters=dims.num_parameters,
        weight_bytes=dims.weight_bytes,
        files=tuple(sorted(files, key=lambda f: f.name)),
    )


# --- reading a directory back ------------------------------------------------


def read_demo_model(out_dir: Path, *, hash_files: bool = False) -> DemoModelInfo:
    """Describe an existing model directory from its ``config.json`` and safetensors headers.

    Works on any Llama-style directory; ``seed`` and ``size`` come from the
    builder's provenance file when present. With ``hash_files`` every file is
    read to compute its sha256 (slow for large models).
    """
    out_dir = Path(out_dir)
    cfg = json.loads((out_dir / "config.json").read_text(encoding="utf-8"))
    dims = DemoDims(
        hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=cfg["num_attention_heads"],
        num_kv_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
        intermediate_size=cfg["intermediate_size"],
        vocab_size=cfg["vocab_size"],
        max_position_embeddings=cfg.get("max_position_embeddings", MAX_POSITION_EMBEDDINGS),
        dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "unknown"),
    )
    num_parameters = 0
    weight_bytes = 0
    for p in sorted(out_dir.glob("*.safetensors")):
        for meta in read_safetensors_header(p).values():
            start, end = meta["data_offsets"]
            num_parameters += math.prod(meta["shape"])
            weight_bytes += end - start
    files = tuple(
        DemoFile(p.name, p.stat().st_size, _sha256_file(p) if hash_files else None)
        for p in sorted(out_dir.iterdir())
        if p.is_file() and not p.name.endswith(".partial")
    )
    prov_path = out_dir / PROVENANCE_FILE
    prov = json.loads(prov_path.read_text(encoding="utf-8")) if prov_path.exists() else {}
    return DemoModelInfo(
        path=out_dir,
        dims=dims,
        size=str(prov.get("size", "?")),
        seed=prov.get("seed"),
        num_parameters=num_parameters,
        weight_bytes=weight_bytes,
        files=files,
    )


def describe(out_dir: Path) -> str:
    """Human-readable summary of a model directory, for CLI output."""
    return read_demo_model(out_dir).summary()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _human_count(n: int) -> str:
    for div, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return str(n)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m thaw.demo_model OUT_DIR [--size tiny|256MiB|...] [--seed N] [--overwrite]``."""
    parser = argparse.ArgumentParser(
        prog="python -m thaw.demo_model", description=__doc__.splitlines()[0]
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument(
        "--size", default=TINY, help="'tiny' or a weight size such as 256MiB, 1GiB, 5GB"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    try:
        info = build_demo_model(
            args.out_dir, size=args.size, seed=args.seed, overwrite=args.overwrite
        )
    except (ValueError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(info.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
