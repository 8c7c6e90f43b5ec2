"""The demo LoRA adapter: PEFT's layout for the demo model's attention projections,
byte-identical for the same base, rank and seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thaw.demo_adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS, build_demo_adapter
from thaw.demo_model import build_demo_model, read_demo_model
from thaw.demo_weights import read_safetensors_header


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base")
    build_demo_model(out)
    return out


def test_the_adapter_has_peft_layout_for_every_layer(base: Path, tmp_path: Path) -> None:
    info = build_demo_adapter(tmp_path / "a", base, rank=4, seed=3)
    config = json.loads((tmp_path / "a" / ADAPTER_CONFIG).read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 16)
    header = read_safetensors_header(tmp_path / "a" / ADAPTER_WEIGHTS)
    d = read_demo_model(base).dims
    assert len(header) == d.num_layers * 4 * 2
    q = header["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    assert q["shape"] == [4, d.hidden_size] and q["dtype"] == "BF16"
    kv = header["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"]
    assert kv["shape"] == [d.num_kv_heads * d.head_dim, 4]
    assert [f.name for f in info.files] == [ADAPTER_CONFIG, ADAPTER_WEIGHTS]


def test_same_seed_same_bytes_other_seed_other_bytes(base: Path, tmp_path: Path) -> None:
    a = build_demo_adapter(tmp_path / "a", base, seed=1)
    b = build_demo_adapter(tmp_path / "b", base, seed=1)
    c = build_demo_adapter(tmp_path / "c", base, seed=2)
    assert a.files == b.files
    assert a.files[1].sha256 != c.files[1].sha256


def test_refuses_a_bad_rank_or_a_directory_with_other_files(base: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rank must be between 1 and 256"):
        build_demo_adapter(tmp_path / "a", base, rank=0)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        build_demo_adapter(tmp_path / "b", base, overwrite=True)
    build_demo_adapter(tmp_path / "c", base)
    with pytest.raises(FileExistsError):
        build_demo_adapter(tmp_path / "c", base)
    build_demo_adapter(tmp_path / "c", base, overwrite=True)
