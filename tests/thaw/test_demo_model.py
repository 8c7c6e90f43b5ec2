"""Tests for thaw.demo_model: determinism, shapes, sizes, tokenizer, sharding.

No engine load here (the S3 end-to-end test does that); these check the
files themselves, with shapes derived independently from config.json.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from thaw import demo_model as dm
from thaw import demo_weights
from thaw.demo_weights import float32_to_bf16_bits

SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_config(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())


def shapes_from_config(cfg: dict) -> dict[str, tuple[int, ...]]:
    """What LlamaForCausalLM expects, written out from the HF config alone."""
    h = cfg["hidden_size"]
    hd = cfg["head_dim"]
    q = cfg["num_attention_heads"] * hd
    kv = cfg["num_key_value_heads"] * hd
    i = cfg["intermediate_size"]
    v = cfg["vocab_size"]
    out = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
    return out


def tensor_shapes_on_disk(d: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over every safetensors file, read with the safetensors library."""
    shapes: dict[str, tuple[int, ...]] = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as st:
            assert st.metadata() == {"format": "pt"}
            for name in st.keys():
                sl = st.get_slice(name)
                assert sl.get_dtype() == "BF16"
                assert name not in shapes, f"{name} stored twice"
                shapes[name] = tuple(sl.get_shape())
    return shapes


def bf16_tensor(path: Path, name: str) -> np.ndarray:
    """Decode one BF16 tensor as float32 straight from the file's bytes (numpy has no bf16)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    meta = json.loads(raw[8 : 8 + n])[name]
    start, end = meta["data_offsets"]
    bits = np.frombuffer(raw[8 + n + start : 8 + n + end], dtype="<u2")
    return (bits.astype(np.uint32) << 16).view(np.float32).reshape(meta["shape"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dm.DemoModelInfo:
    return dm.build_demo_model(tmp_path_factory.mktemp("tiny") / "model")


# --- determinism -----------------------------------------------------------------


def test_two_tiny_builds_are_byte_identical(tiny: dm.DemoModelInfo, tmp_path: Path) -> None:
    again = dm.build_demo_model(tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json"):
        assert sha256(tiny.path / name) == sha256(again.path / name), name
    assert sorted(p.name for p in tiny.path.iterdir()) == sorted(
        p.name for p in again.path.iterdir()
    )


def test_reported_hashes_and_sizes_match_the_files(tiny: dm.DemoModelInfo) -> None:
    assert {f.name for f in tiny.files} == {p.name for p in tiny.path.iterdir()}
    for f in tiny.files:
        assert f.size_bytes == (tiny.path / f.name).stat().st_size, f.name
        assert f.sha256 == sha256(tiny.path / f.name), f.name


def test_another_seed_changes_weights_not_tokenizer_or_shapes(
    tiny: dm.DemoModelInfo, tmp_path: Path
) -> None:
    other = dm.build_demo_model(tmp_path / "seed1", seed=1)
    assert sha256(other.path / "model.safetensors") != sha256(tiny.path / "model.safetensors")
    assert sha256(other.path / "tokenizer.json") == sha256(tiny.path / "tokenizer.json")
    assert tensor_shapes_on_disk(other.path) == tensor_shapes_on_disk(tiny.path)
    name = "model.layers.0.self_attn.q_proj.weight"
    a = bf16_tensor(tiny.path / "model.safetensors", name)
    b = bf16_tensor(other.path / "model.safetensors", name)
    assert np.mean(a == b) < 0.05  # independent draws, not a shifted copy


# --- shapes and config ---------------------------------------------------------------


def test_tiny_tensors_match_what_llama_expects(tiny: dm.DemoModelInfo) -> None:
    cfg = read_config(tiny.path)
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["model_type"] == "llama"
    assert cfg["tie_word_embeddings"] is False
    assert cfg["torch_dtype"] == "bfloat16"
    # hidden 256 = 4 heads * head_dim 64; 2 KV heads share 2 query heads each.
    assert cfg["num_attention_heads"] * cfg["head_dim"] == cfg["hidden_size"]
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
    on_disk = tensor_shapes_on_disk(tiny.path)
    expected = shapes_from_config(cfg)
    assert on_disk == expected
    # 4 layers * 9 tensors + embed + norm + lm_head
    assert len(on_disk) == cfg["num_hidden_layers"] * 9 + 3 == 39


def test_tiny_is_about_ten_megabytes(tiny: dm.DemoModelInfo) -> None:
    # embed + lm_head: 2 * 3072 * 256 = 1,572,864
    # per layer: q,o 2*256*256 + k,v 2*128*256 + mlp 3*1024*256 + norms 2*256 = 983,552; * 4 = 3,934,208
    # final norm: 256   -> 5,507,328 params, * 2 bytes
    assert tiny.num_parameters == 5_507_328
    assert tiny.weight_bytes == 11_014_656
    assert (tiny.path / "model.safetensors").stat().st_size > tiny.weight_bytes  # plus the header


def test_weights_are_small_and_norms_are_one(tiny: dm.DemoModelInfo) -> None:
    st = tiny.path / "model.safetensors"
    w = bf16_tensor(st, "model.layers.1.mlp.up_proj.weight")
    assert abs(float(w.std()) - 0.02) < 0.001
    assert abs(float(w.mean())) < 0.001
    assert float(np.abs(w).max()) <= 0.02 * math.sqrt(3) * 1.01  # uniform(-a, a), a = std * sqrt(3)
    assert np.all(bf16_tensor(st, "model.norm.weight") == 1.0)
    assert np.all(bf16_tensor(st, "model.layers.3.input_layernorm.weight") == 1.0)


def test_config_ids_match_tokenizer(tiny: dm.DemoModelInfo) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny.path / "tokenizer.json"))
    cfg = read_config(tiny.path)
    gen = json.loads((tiny.path / "generation_config.json").read_text())
    assert cfg["vocab_size"] == tok.get_vocab_size(with_added_tokens=True) == 3072
    assert cfg["bos_token_id"] == gen["bos_token_id"] == tok.token_to_id("<|begin_of_text|>")
    assert (
        cfg["eos_token_id"]
        == gen["eos_token_id"]
        == [tok.token_to_id("<|end_of_text|>"), tok.token_to_id("<|eot_id|>")]
    )
    assert all(tok.token_to_id(t) is not None for t in SPECIALS)


# --- tokenizer -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "The weather today is cold and grey.",
        "Crème brûlée, naïve café — 東京 🧊 Ελληνικά עברית",
        "  leading spaces, tabs\tand\nnew lines\r\n",
        "emoji with joiners: 👩‍💻🏳️‍🌈 and a lone combining mark: e\u0301",
        "<|eot_id|> typed as plain text",
    ],
)
def test_tokenizer_round_trips_unicode(tiny: dm.DemoModelInfo, text: str) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny.path / "tokenizer.json"))
    enc = tok.encode(text, add_special_tokens=False)
    assert tok.decode(enc.ids, skip_special_tokens=False) == text
    with_bos = tok.encode(text)  # add_special_tokens defaults to True: BOS in front, Llama 3 style
    assert with_bos.ids[0] == tok.token_to_id("<|begin_of_text|>")


def test_special_tokens_are_single_ids(tiny: dm.DemoModelInfo) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny.path / "tokenizer.json"))
    for t in SPECIALS:
        assert tok.encode(t, add_special_tokens=False).ids == [tok.token_to_id(t)]


def test_chat_template_renders_llama3_turns(tiny: dm.DemoModelInfo) -> None:
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny.path))
    rendered = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " hi there \n"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert rendered == (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=True, add_generation_prompt=True
    )
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    special_ids = {tok.convert_tokens_to_ids(t) for t in SPECIALS}
    # BOS, start, end (user header), eot, start, end (assistant header); BOS exactly once.
    assert sum(i in special_ids for i in ids) == 6
    assert ids.count(tok.convert_tokens_to_ids("<|begin_of_text|>")) == 1
    assert tok.eos_token == "<|eot_id|>"
    assert transformers.AutoConfig.from_pretrained(str(tiny.path)).num_hidden_layers == 4


# --- sizes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "size", ["32MiB", "64MiB", "100MB", "256MiB", "1GiB", "2GiB", "16GiB", "140GiB"]
)
def test_dims_for_size_land_within_ten_percent(size: str) -> None:
    dims = dm.dims_for_size(size)
    target = dm.parse_size_bytes(size)
    assert abs(dims.weight_bytes - target) <= 0.1 * target
    assert dims.head_dim in (64, 128)  # head sizes every vLLM attention backend takes
    assert dims.num_heads * dims.head_dim == dims.hidden_size
    assert dims.num_heads % dims.num_kv_heads == 0
    assert dims.num_layers >= 4


def test_too_small_a_size_is_refused() -> None:
    with pytest.raises(ValueError, match="too small"):
        dm.dims_for_size("1MiB")


def test_64mib_variant_is_valid_and_on_size(tmp_path: Path) -> None:
    info = dm.build_demo_model(tmp_path / "m", size="64MiB", seed=7)
    target = 64 * 1024**2
    weights = tmp_path / "m" / "model.safetensors"
    assert abs(weights.stat().st_size - target) <= 0.1 * target
    assert not (tmp_path / "m" / "model.safetensors.index.json").exists()
    cfg = read_config(info.path)
    assert tensor_shapes_on_disk(info.path) == shapes_from_config(cfg)
    assert cfg["num_hidden_layers"] > 4  # scaled up, not the tiny preset
    assert info.size == "64MiB" and info.seed == 7
    assert dm.read_demo_model(info.path).num_parameters == info.num_parameters


def test_large_variants_are_sharded_with_a_complete_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 4 MiB shard limit on the ~10.5 MiB tiny model stands in for 2 GiB on a large one.
    monkeypatch.setattr(demo_weights, "MAX_SHARD_BYTES", 4 * 1024**2)
    info = dm.build_demo_model(tmp_path / "m")
    d = info.path
    assert not (d / "model.safetensors").exists()
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in d.glob("*.safetensors"))
    assert len(shards) >= 3
    assert shards == [
        f"model-{k:05d}-of-{len(shards):05d}.safetensors" for k in range(1, len(shards) + 1)
    ]
    assert set(index["weight_map"].values()) == set(shards)
    for shard in shards:
        with safe_open(str(d / shard), framework="numpy") as st:
            assert set(st.keys()) == {n for n, f in index["weight_map"].items() if f == shard}
    assert tensor_shapes_on_disk(d) == shapes_from_config(read_config(d))
    assert index["metadata"]["total_size"] == info.weight_bytes == 11_014_656
    for shard in shards:  # only a tensor bigger than the limit may overflow it
        assert (d / shard).stat().st_size < 4 * 1024**2 + 2 * 3072 * 256 + 64 * 1024


def test_sharded_weights_equal_single_file_weights(
    tiny: dm.DemoModelInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo_weights, "MAX_SHARD_BYTES", 4 * 1024**2)
    sharded = dm.build_demo_model(tmp_path / "m")
    index = json.loads((sharded.path / "model.safetensors.index.json").read_text())
    for name in ("lm_head.weight", "model.layers.2.self_attn.k_proj.weight"):
        a = bf16_tensor(tiny.path / "model.safetensors", name)
        b = bf16_tensor(sharded.path / index["weight_map"][name], name)
        assert np.array_equal(a, b), name


# --- bf16 rounding ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "bits"),
    [
        (1.0, 0x3F80),
        (-2.0, 0xC000),
        (0.0, 0x0000),
        (1.0 + 2**-8, 0x3F80),  # halfway between 0x3F80 and 0x3F81: ties to even (down)
        (1.0 + 3 * 2**-8, 0x3F82),  # halfway between 0x3F81 and 0x3F82: ties to even (up)
        (1.0 + 2**-8 + 2**-20, 0x3F81),  # just above halfway: up
        (0.02, 0x3CA4),  # 0x3CA3D70A -> low half 0xD70A > 0x8000: up
    ],
)
def test_float32_to_bf16_rounds_to_nearest_even(value: float, bits: int) -> None:
    out = float32_to_bf16_bits(np.array([value], dtype=np.float32))
    assert out.dtype == np.dtype("<u2")
    assert int(out[0]) == bits


# --- directory handling and description ---------------------------------------------


def test_refuses_non_empty_dir_unless_overwrite(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "model-00001-of-00009.safetensors").write_bytes(b"stale")
    (d / "README.md").write_text("keep me")
    with pytest.raises(FileExistsError):
        dm.build_demo_model(d)
    dm.build_demo_model(d, overwrite=True)
    assert not (
        d / "model-00001-of-00009.safetensors"
    ).exists()  # a stale shard would confuse loaders
    assert (d / "README.md").read_text() == "keep me"
    assert (d / "model.safetensors").exists()


def test_describe_reports_dims_and_provenance(tiny: dm.DemoModelInfo) -> None:
    text = dm.describe(tiny.path)
    assert "hidden=256 layers=4 heads=4 kv_heads=2 head_dim=64 intermediate=1024 vocab=3072" in text
    assert "5,507,328" in text and "seed=0" in text and "size=tiny" in text
    back = dm.read_demo_model(tiny.path, hash_files=True)
    assert back.dims == tiny.dims
    assert back.weight_bytes == tiny.weight_bytes
    assert back.files == tiny.files


def test_bad_seed_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="seed"):
        dm.build_demo_model(tmp_path / "m", seed=-1)
