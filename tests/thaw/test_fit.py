"""Whether a model fits its shape: weights + a minimal KV cache against usable memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from thaw.config import ThawConfig, parse_config
from thaw.fit import ModelSize, fit_problem, kv_bytes_per_token
from thaw.units import GiB

# Llama 3 70B's shape: 80 layers, 64 heads, 8 KV heads, head_dim 8192 / 64 = 128.
LLAMA_70B = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192,
             "torch_dtype": "bfloat16"}


def config(gpu_count: int, gpu_gib: float, **engine: Any) -> ThawConfig:
    return parse_config({
        "shapes": [{"name": "s", "gpu_type": "h100-80gb", "gpu_count": gpu_count, "gpu_memory_gib": gpu_gib,
                    "host_memory_gib": 512, "price_per_hour_usd": 1}],
        "models": [{"name": "m", "uri": "s3://thaw/m", "shape": "s", "max_context_tokens": 8192,
                    "engine": engine}],
    })


def test_kv_bytes_per_token_of_llama_70b() -> None:
    # 2 (K and V) x 80 layers x 8 KV heads x 128 dims x 2 bytes = 327,680 bytes
    assert kv_bytes_per_token(LLAMA_70B, "auto") == 327_680
    assert kv_bytes_per_token(LLAMA_70B, "float32") == 655_360
    assert kv_bytes_per_token({"hidden_size": 1}, "auto") is None


@pytest.mark.parametrize(
    ("gpus", "gpu_gib", "weights_gib", "fits"),
    [
        # 140 GiB + 327,680 x 8192 B (2.5 GiB) = 142.5 GiB > 1 x 80 x 0.9 = 72 GiB
        (1, 80, 140, False),
        # 142.5 GiB <= 2 x 80 x 0.9 = 144 GiB
        (2, 80, 140, True),
        # 142.5 GiB <= 4 x 40 x 0.9 = 144 GiB (four smaller GPUs)
        (4, 40, 140, True),
        # 760 + 2.5 > 8 x 80 x 0.9 = 576
        (8, 80, 760, False),
    ],
)
def test_fit_against_tensor_parallel_gpus(gpus: int, gpu_gib: float, weights_gib: float, fits: bool) -> None:
    cfg = config(gpus, gpu_gib)
    assert cfg.models[0].engine.tensor_parallel_size == gpus  # from the shape
    problem = fit_problem(0, cfg.models[0], cfg, ModelSize(int(weights_gib * GiB), "manifest", LLAMA_70B))
    assert (problem is None) is fits, problem


def test_the_message_names_both_numbers() -> None:
    cfg = config(1, 80)
    problem = fit_problem(0, cfg.models[0], cfg, ModelSize(140 * GiB, "--assume-size", None))
    assert problem is not None
    assert "models[0] (m)" in problem and "140.0 GiB (--assume-size)" in problem
    assert "1 x 80 GiB x gpu_memory_utilization 0.9 = 72.0 GiB" in problem


def test_an_explicit_tensor_parallel_size_is_kept_and_bounded_by_the_shape() -> None:
    assert config(8, 80, tensor_parallel_size=4).models[0].engine.tensor_parallel_size == 4
    with pytest.raises(Exception, match="tensor_parallel_size 16 needs 16 GPUs; shape 's' has 8"):
        config(8, 80, tensor_parallel_size=16)


def test_config_check_refuses_a_model_that_cannot_fit(tmp_path: Path) -> None:
    cfg = tmp_path / "big.yaml"
    cfg.write_text(
        "data_dir: " + str(tmp_path) + "\n"
        "shapes: [{name: l40s, gpu_type: l40s-48gb, gpu_count: 1, gpu_memory_gib: 48, host_memory_gib: 64,"
        " price_per_hour_usd: 1.8}]\n"
        "models: [{name: llama-70b, uri: 's3://thaw/llama-70b', shape: l40s, max_context_tokens: 8192},"
        # An adapter runs in its base's engine: the base's fit is its check.
        " {name: lora, base: llama-70b, adapter_uri: 's3://thaw/lora'}]\n")
    run = [sys.executable, "-m", "thaw.cli.main", "config", "check", str(cfg)]
    out = subprocess.run([*run, "--assume-size", "llama-70b=140GiB"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "140.0 GiB" in out.stderr and "43.2 GiB" in out.stderr and "llama-70b" in out.stderr
    ok = subprocess.run([*run, "--assume-size", "16GiB"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([*run, "--assume-size", "nope=1GiB"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no model 'nope'" in bad.stderr
    # Without a size and without a store, it says what it did not check.
    unsized = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert unsized.returncode == 0 and "not checked whether these models fit their shapes: llama-70b" in unsized.stderr


def test_an_ec2_pool_needs_a_launch_template_and_a_reachable_controller() -> None:
    base: dict[str, Any] = {
        "shapes": [{"name": "s", "gpu_type": "h100-80gb", "gpu_count": 1, "gpu_memory_gib": 80,
                    "host_memory_gib": 64, "price_per_hour_usd": 1}],
        "pools": [{"shape": "s", "provider": "ec2",
                   "ec2": {"region": "us-east-1", "subnets": ["s-1"], "instance_types": ["p5.48xlarge"]}}],
        "controller": {"url": "http://controller.internal:8100"},
    }
    with pytest.raises(Exception, match=r"pools\.0\.ec2\.launch_template|launch_template"):
        parse_config(base)
    base["pools"][0]["ec2"]["launch_template"] = "thaw-worker"
    assert parse_config(base).pools[0].ec2 is not None
    del base["controller"]
    with pytest.raises(Exception, match="set controller.url"):
        parse_config(base)


@pytest.mark.integration
def test_config_check_sizes_a_pushed_model_from_its_manifest(store: Any, s3: Any, demo_model_dir: Path,
                                                             s3_prefix: str, tmp_path: Path) -> None:
    from weight_streaming.push import push_model

    manifest = push_model(s3.client(), demo_model_dir, s3_prefix)
    cfg = {
        "data_dir": str(tmp_path),
        "object_store": {"kind": "s3", "endpoint_url": s3.endpoint_url, "bucket": s3_prefix.split("/")[2],
                         "credentials": {"source": "file", "file": str(store.root / "credentials.json")}},
        # A GPU far too small for even the tiny demo model (11 MB): 0.005 GiB x 0.9.
        "shapes": [{"name": "tiny-gpu", "gpu_type": "l4-24gb", "gpu_count": 1, "gpu_memory_gib": 0.005,
                    "host_memory_gib": 8, "price_per_hour_usd": 1}],
        "models": [{"name": "demo", "uri": s3_prefix, "shape": "tiny-gpu", "max_context_tokens": 512}],
    }
    path = tmp_path / "thaw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run([sys.executable, "-m", "thaw.cli.main", "config", "check", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    # The size is the manifest's, and the KV cache is sized from the model's config.json.
    assert f"weights {manifest.total_bytes / GiB:.1f} GiB (manifest)" in out.stderr
    assert "one 512-token sequence" in out.stderr


# -- several engines on one worker --------------------------------------------------------


def test_engine_memory_is_a_share_of_the_gpu_or_weights_kv_and_processes_on_the_cpu() -> None:
    from thaw.config import EngineArgs, InstanceShape
    from thaw.fit import CPU_ENGINE_PROCESS_GIB, engine_capacity, engine_memory

    gpu = InstanceShape(name="g", gpu_type="l40s-48gb", gpu_count=1, gpu_memory_gib=48, host_memory_gib=64,
                        price_per_hour_usd=1.0)
    cpu = InstanceShape(name="c", gpu_type="cpu", gpu_count=0, host_memory_gib=16, host_cache_gib=4,
                        price_per_hour_usd=0.1)
    assert engine_memory(10 * GiB, EngineArgs(gpu_memory_utilization=0.25), gpu) == 12 * GiB
    assert engine_capacity(gpu) == 48 * GiB
    assert engine_memory(GiB // 2, EngineArgs(cpu_kvcache_gib=1), cpu) == int((1.5 + CPU_ENGINE_PROCESS_GIB) * GiB)
    assert engine_capacity(cpu) == 11 * GiB  # less the host cache and the spare engine host
    # vLLM takes whole GiB of CPU KV cache (at least 1): a fraction is counted as launched.
    assert engine_memory(GiB // 2, EngineArgs(cpu_kvcache_gib=0.5), cpu) == engine_memory(
        GiB // 2, EngineArgs(cpu_kvcache_gib=1), cpu)
    assert engine_memory(0, EngineArgs(cpu_kvcache_gib=1.25), cpu) == int((2 + CPU_ENGINE_PROCESS_GIB) * GiB)
    # Engines are not pinned to devices: each uses the first ones, so on a 4-GPU shape
    # packing fills one device, whatever an engine's tensor-parallel size.
    quad = gpu.model_copy(update={"gpu_count": 4})
    assert engine_capacity(quad) == 48 * GiB
    assert engine_memory(0, EngineArgs(gpu_memory_utilization=0.5, tensor_parallel_size=2), quad) == 24 * GiB


def test_a_pack_refusal_names_what_is_needed_and_what_is_free() -> None:
    from thaw.fit import pack_problem

    assert pack_problem(3 * GiB, [2 * GiB, 3 * GiB], 8 * GiB) is None
    problem = pack_problem(4 * GiB, [2 * GiB, 3 * GiB], 8 * GiB)
    assert problem == ("the engine needs 4.00 GiB but 3.00 GiB are free: 2 engine(s) hold 5.00 GiB "
                       "of 8.00 GiB")
