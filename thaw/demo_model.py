"""Build a small, deterministic Llama-architecture model directory for demos and benchmarks.

The output is a Hugging Face-style directory (``config.json``, safetensors
weights, a fast tokenizer with a Llama-3-style chat template) that vLLM loads
like any other local model. Weights are random, so the text it generates is
gibberish; what matters is that every code path (upload, weight streaming,
engine load, chat, streaming responses) runs for real and fast.

Everything is a pure function of ``(size, seed)`` and the corpus shipped in
``thaw/data/corpus.txt``: two builds give byte-identical files. Weights come
from NumPy's PCG64 raw bit stream (stable across NumPy releases by NEP 19),
not from torch, and are written by a small streaming safetensors writer so a
multi-GiB variant never has to fit in memory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import struct
import sys
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from thaw.units import human_bytes, parse_size_bytes

# --- model shape ---------------------------------------------------------

TINY = "tiny"
DTYPE = "bfloat16"  # vLLM's CPU backend runs bf16 natively; GPUs do too.
BYTES_PER_PARAM = 2
INIT_STD = 0.02
MAX_POSITION_EMBEDDINGS = 2048
ROPE_THETA = 500000.0
RMS_NORM_EPS = 1e-5
# A single file up to this many bytes of tensor data; above it, shards of at
# most this size (a tensor larger than the limit gets a shard of its own).
MAX_SHARD_BYTES = 2 * 1024**3

# Widths tried when scaling to a byte size, smallest first. Each is a
# multiple of 128 so head_dim 64/128 divides it.
_WIDTHS = (256, 512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 8192, 12288, 16384)
_INTERMEDIATE_MULTIPLE = 64

# --- tokenizer -----------------------------------------------------------

BOS_TOKEN = "<|begin_of_text|>"
END_OF_TEXT_TOKEN = "<|end_of_text|>"
START_HEADER_TOKEN = "<|start_header_id|>"
END_HEADER_TOKEN = "<|end_header_id|>"
EOT_TOKEN = "<|eot_id|>"
# Trained first, so they take ids 0..4 in this order.
SPECIAL_TOKENS = (BOS_TOKEN, END_OF_TEXT_TOKEN, START_HEADER_TOKEN, END_HEADER_TOKEN, EOT_TOKEN)
TOKENIZER_VOCAB_SIZE = 3072  # including the special tokens

# Llama 3's template, verbatim in behaviour: BOS once, a header per turn,
# content trimmed, <|eot_id|> after each turn, then the assistant header.
CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}"
    "{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

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

# Elements generated per step when writing a tensor: bounds memory (~50 MB of
# temporaries) independently of the model size.
_CHUNK_ELEMENTS = 1 << 22


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
class DemoFile:
    """One file of a demo model directory; ``sha256`` is None when not computed."""

    name: str
    size_bytes: int
    sha256: str | None = None


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


# --- weights -----------------------------------------------------------------


def _float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (round to nearest, ties to even) and return the uint16 bits.

    Inputs are finite by construction (no NaN handling needed).
    """
    bits = x.astype("<f4", copy=False).view("<u4")
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype("<u2")


def _tensor_rng(name: str, seed: int) -> np.random.Generator:
    # One stream per tensor, keyed by name, so a tensor's values do not depend
    # on which other tensors exist or in which order they are written.
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _uniform_chunks(name: str, n: int, seed: int) -> Iterator[np.ndarray]:
    """float32 chunks of a uniform(-a, a) stream with std INIT_STD, from PCG64 raw bits.

    ``random_raw`` is the bit generator's raw output, which NumPy keeps stable
    across releases; the distribution methods carry no such promise.
    """
    bitgen = _tensor_rng(name, seed).bit_generator
    half_width = INIT_STD * math.sqrt(3.0)
    scale = np.float32(half_width / 2**23)
    done = 0
    while done < n:
        count = min(_CHUNK_ELEMENTS, n - done)
        raw = np.asarray(bitgen.random_raw((count + 1) // 2), dtype="<u8")
        words = raw.view("<u4")[:count]  # two 32-bit words per draw, low word first
        top24 = (words >> np.uint32(8)).astype(np.float32)  # exact: < 2**24
        yield (top24 - np.float32(2**23 - 0.5)) * scale
        done += count


def _tensor_bytes(name: str, shape: tuple[int, ...], seed: int) -> Iterator[bytes]:
    """The little-endian bf16 bytes of one tensor, in chunks."""
    n = math.prod(shape)
    if len(shape) == 1:  # RMSNorm weights start at 1.0
        yield _float32_to_bf16_bits(np.ones(n, dtype=np.float32)).tobytes()
        return
    for chunk in _uniform_chunks(name, n, seed):
        yield _float32_to_bf16_bits(chunk).tobytes()


def _safetensors_header(names: Sequence[str], shapes: dict[str, tuple[int, ...]]) -> bytes:
    """The 8-byte length plus JSON header for ``names`` laid out in that order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        nbytes = math.prod(shapes[name]) * BYTES_PER_PARAM
        header[name] = {
            "dtype": "BF16",
            "shape": list(shapes[name]),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)  # data starts 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(body)) + body


def _write_safetensors(
    path: Path, names: list[str], shapes: dict[str, tuple[int, ...]], seed: int
) -> DemoFile:
    """Stream one safetensors file (tensors sorted by name) and return its size and sha256."""
    names = sorted(names)
    digest = hashlib.sha256()
    size = 0
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        for block in _iter_file_blocks(names, shapes, seed):
            f.write(block)
            digest.update(block)
            size += len(block)
    os.replace(tmp, path)
    return DemoFile(path.name, size, digest.hexdigest())


def _iter_file_blocks(
    names: list[str], shapes: dict[str, tuple[int, ...]], seed: int
) -> Iterator[bytes]:
    yield _safetensors_header(names, shapes)
    for name in names:
        yield from _tensor_bytes(name, shapes[name], seed)


def _plan_shards(shapes: dict[str, tuple[int, ...]]) -> list[list[str]]:
    """Group tensors (in module order) into files of at most MAX_SHARD_BYTES each."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * BYTES_PER_PARAM
        if shards[-1] and used + nbytes > MAX_SHARD_BYTES:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    return shards


# --- tokenizer -------------------------------------------------------------


def corpus_text() -> str:
    """The English text the tokenizer is trained on (``thaw/data/corpus.txt``)."""
    return resources.files("thaw").joinpath("data/corpus.txt").read_text(encoding="utf-8")


def train_tokenizer() -> str:
    """Train the byte-level BPE tokenizer and return its ``tokenizer.json`` text.

    Deterministic: the corpus is fixed and the BPE trainer breaks count ties
    by token id. Byte-level pre-tokenization and decoding mean any UTF-8 text
    round-trips, even characters the corpus never shows.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_text().split("\n\n"), trainer=trainer)
    if tok.get_vocab_size(with_added_tokens=True) != TOKENIZER_VOCAB_SIZE:
        # The corpus ran out of merges: vocab_size in config.json would lie.
        raise RuntimeError(
            f"tokenizer trained to {tok.get_vocab_size(with_added_tokens=True)} tokens, "
            f"expected {TOKENIZER_VOCAB_SIZE}; the corpus is too small"
        )
    bos_id = tok.token_to_id(BOS_TOKEN)
    # Like Llama 3: BOS in front of plain encodings. Chat prompts already carry
    # it from the template and vLLM encodes them without special tokens.
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS_TOKEN} $A",
                pair=f"{BOS_TOKEN} $A {BOS_TOKEN}:1 $B:1",
                special_tokens=[(BOS_TOKEN, bos_id)],
            ),
        ]
    )
    return tok.to_str()


def _token_ids(tokenizer_json: str) -> dict[str, int]:
    added = json.loads(tokenizer_json)["added_tokens"]
    ids = {t["content"]: t["id"] for t in added}
    missing = [t for t in SPECIAL_TOKENS if t not in ids]
    if missing:
        raise RuntimeError(f"tokenizer lacks special tokens {missing}")
    return ids


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


def _tokenizer_config(ids: dict[str, int], dims: DemoDims) -> dict[str, object]:
    return {
        "added_tokens_decoder": {
            str(ids[t]): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in SPECIAL_TOKENS
        },
        "bos_token": BOS_TOKEN,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        # A chat model: generation stops at the end of the assistant's turn.
        "eos_token": EOT_TOKEN,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": dims.max_position_embeddings,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def _write_text(path: Path, text: str) -> DemoFile:
    data = text.encode("utf-8")
    tmp = path.with_name(path.name + ".partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return DemoFile(path.name, len(data), hashlib.sha256(data).hexdigest())


def _json_text(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


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
    shards = _plan_shards(shapes)
    if len(shards) == 1:
        files.append(_write_safetensors(out_dir / SINGLE_WEIGHTS_FILE, shards[0], shapes, seed))
    else:
        weight_map: dict[str, str] = {}
        for k, names in enumerate(shards, start=1):
            fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            files.append(_write_safetensors(out_dir / fname, names, shapes, seed))
            weight_map.update({n: fname for n in names})
        index = {
            "metadata": {"total_size": dims.weight_bytes},
            "weight_map": dict(sorted(weight_map.items())),
        }
        files.append(_write_text(out_dir / INDEX_FILE, _json_text(index)))

    tokenizer_json = train_tokenizer()
    ids = _token_ids(tokenizer_json)
    files.append(_write_text(out_dir / "tokenizer.json", tokenizer_json))
    files.append(
        _write_text(out_dir / "tokenizer_config.json", _json_text(_tokenizer_config(ids, dims)))
    )
    files.append(
        _write_text(
            out_dir / "special_tokens_map.json",
            _json_text({"bos_token": BOS_TOKEN, "eos_token": EOT_TOKEN}),
        )
    )
    files.append(
        _write_text(
            out_dir / "generation_config.json",
            _json_text(
                {
                    "bos_token_id": ids[BOS_TOKEN],
                    "eos_token_id": [ids[END_OF_TEXT_TOKEN], ids[EOT_TOKEN]],
                }
            ),
        )
    )
    files.append(
        _write_text(
            out_dir / PROVENANCE_FILE,
            _json_text(
                {
                    "builder": "thaw.demo_model",
                    "format_version": 1,
                    "seed": seed,
                    "size": _size_label(size),
                }
            ),
        )
    )
    files.append(_write_text(out_dir / "config.json", _json_text(_config(dims, ids))))
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


def read_safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """The JSON header of a safetensors file (tensor name -> dtype/shape/offsets), without ``__metadata__``."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


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
