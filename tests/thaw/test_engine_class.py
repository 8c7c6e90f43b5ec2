"""Engine classes: same class exactly when a built engine can serve the other model
after a weight swap; every input that changes the built engine changes the class."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from thaw.config import EngineArgs
from thaw.demo_model import build_demo_model
from thaw.digest import ID_HEX_CHARS
from thaw.engine_class import engine_class_inputs, engine_class_of, explain_mismatch

LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 704,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "vocab_size": 4096, "max_position_embeddings": 2048, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1,
}


def cls(config: dict[str, Any] | None = None, engine: EngineArgs | None = None, max_model_len: int = 2048,
        tp: int | None = None) -> str:
    return engine_class_of(config or LLAMA, engine or EngineArgs(), max_model_len=max_model_len,
                           tensor_parallel_size=tp).id


def test_two_demo_models_of_different_seeds_are_one_class(tmp_path: Path) -> None:
    # Same shapes, different weights: the fine-tune case a swap is for.
    a, b = tmp_path / "a", tmp_path / "b"
    build_demo_model(a, seed=1)
    build_demo_model(b, seed=2)
    assert (a / "model.safetensors").read_bytes() != (b / "model.safetensors").read_bytes()
    ca, cb = (json.loads((d / "config.json").read_text()) for d in (a, b))
    assert cls(ca) == cls(cb)
    assert len(cls(ca)) == ID_HEX_CHARS


def test_the_id_is_stable_and_ignores_key_order() -> None:
    shuffled = dict(reversed(list(LLAMA.items())))
    assert cls(shuffled) == cls(LLAMA) == cls(dict(LLAMA))


@pytest.mark.parametrize(("case", "config"), [
    ("hidden size", {**LLAMA, "hidden_size": 512}),
    ("layers", {**LLAMA, "num_hidden_layers": 8}),
    ("kv heads", {**LLAMA, "num_key_value_heads": 4}),
    ("vocabulary", {**LLAMA, "vocab_size": 4100}),
    ("rope", {**LLAMA, "rope_theta": 10000.0}),
    ("architecture", {**LLAMA, "architectures": ["MistralForCausalLM"]}),
    ("quantization", {**LLAMA, "quantization_config": {"quant_method": "fp8"}}),
    ("checkpoint dtype under auto", {**LLAMA, "torch_dtype": "float16"}),
    ("a key we do not know", {**LLAMA, "sliding_window": 4096}),
])
def test_a_config_change_that_changes_the_engine_changes_the_class(case: str, config: dict[str, Any]) -> None:
    assert cls(config) != cls(LLAMA), case


@pytest.mark.parametrize(("case", "config"), [
    ("provenance", {**LLAMA, "_name_or_path": "/somewhere/else", "transformers_version": "4.99"}),
    ("dtype spelled the new way", {**{k: v for k, v in LLAMA.items() if k != "torch_dtype"}, "dtype": "bfloat16"}),
])
def test_names_and_provenance_do_not_split_a_class(case: str, config: dict[str, Any]) -> None:
    assert cls(config) == cls(LLAMA), case


@pytest.mark.parametrize(("case", "engine", "max_model_len", "tp"), [
    ("context length", EngineArgs(), 4096, None),
    ("tensor parallel", EngineArgs(), 2048, 2),
    ("compiled vs eager", EngineArgs(enforce_eager=True), 2048, None),
    ("explicit dtype", EngineArgs(dtype="float32"), 2048, None),
    ("kv cache size", EngineArgs(cpu_kvcache_gib=2.0), 2048, None),
    ("gpu memory share", EngineArgs(gpu_memory_utilization=0.5), 2048, None),
    ("an engine flag", EngineArgs(extra={"max_num_seqs": 8}), 2048, None),
])
def test_engine_settings_that_shape_the_engine_change_the_class(case: str, engine: EngineArgs, max_model_len: int,
                                                                  tp: int | None) -> None:
    assert cls(engine=engine, max_model_len=max_model_len, tp=tp) != cls(), case


@pytest.mark.parametrize(("case", "engine"), [
    ("load format", EngineArgs(load_format="safetensors")),
    ("loader options", EngineArgs(extra={"model_loader_extra_config": {"concurrency": 4}})),
    ("snapshots", EngineArgs(snapshots=False)),
    # "auto" with a bf16 checkpoint builds the same engine as asking for bf16.
    ("auto dtype resolved", EngineArgs(dtype="bfloat16")),
])
def test_how_weights_are_read_is_not_part_of_the_class(case: str, engine: EngineArgs) -> None:
    assert cls(engine=engine) == cls(), case


def test_tensor_parallel_defaults_to_the_engine_setting() -> None:
    assert cls(tp=None) == cls(tp=1)
    assert cls(engine=EngineArgs(tensor_parallel_size=2)) == cls(tp=2)


def test_a_config_without_architectures_is_refused() -> None:
    with pytest.raises(ValueError, match="architectures"):
        engine_class_inputs({"hidden_size": 1}, EngineArgs(), max_model_len=1)


def test_a_mismatch_names_each_input_that_differs() -> None:
    a = engine_class_of(LLAMA, EngineArgs(), max_model_len=2048)
    b = engine_class_of({**LLAMA, "hidden_size": 512}, EngineArgs(), max_model_len=4096)
    why = explain_mismatch(a, b)
    assert "config.hidden_size: 256 != 512" in why and "max_model_len: 2048 != 4096" in why
    assert explain_mismatch(a, a) == "same class"
