"""The capacity planner: its arithmetic step by step, its agreement with published
throughput, its refusals, and `thaw plan`."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from thaw.cli.main import main
from thaw.planner import catalog, render
from thaw.planner.sizing import (
    Plan,
    kv_bytes_per_token,
    kv_bytes_per_token_of_config,
    plan,
    replica_performance,
    ttft_utilisation_cap,
    weights_read_per_step,
)
from thaw.units import GiB


def values(p: Plan) -> dict[str, float | int | str]:
    return {s.name: s.value for s in p.steps}


# -- (a) the arithmetic, step by step ---------------------------------------------------


def test_dense_llama_70b_on_h100_step_by_step() -> None:
    p = plan(catalog.model("llama-3.1-70b"), catalog.gpu("h100"), rps=100, input_tokens=1000, output_tokens=200,
             prefix_hit_rate=0.5, ttft_p99_s=2, tpot_p99_ms=50, instance=catalog.instance("p5.48xlarge"))
    v = values(p)
    approx = pytest.approx
    # 70.6e9 params x 2 B = 141.2e9 B = 131.50 GiB
    assert v["weights"] == approx(141.2e9 / GiB)
    # 2 (K,V) x 80 layers x 8 KV heads x 128 dims x 2 B = 327,680 B
    assert v["KV cache per token"] == 327_680
    # 100 req/s x 1000 tokens x (1 - 0.5 prefix hits) = 50,000 tokens/s; 100 x 200 = 20,000 tokens/s
    assert v["prefill tokens"] == approx(50_000)
    assert v["decode tokens"] == 20_000
    # uncached positions 500..1000 attend to 750 tokens on average:
    # 2 x 70.6e9 + 2 x 2 x 80 layers x 8192 (64 heads x 128) x 750 = 141.2e9 + 1.966e9 = 143.166e9 FLOP
    assert v["prefill FLOPs per token"] == approx(143.16608e9)
    # 50,000 tokens/s x 143.166e9 = 7.158 PFLOP/s
    assert v["prefill compute"] == approx(7.158304)
    # Two GPUs already hold 131.5 GiB + one 1200-token sequence, but per GPU-hour eight
    # per replica is cheapest: 2 GPUs: 34 replicas on ceil(34 / 4) = 9 p5.48xlarge = $495.36/h;
    # 4 GPUs: 10 replicas on 5 = $275.20/h; 8 GPUs: 4 replicas on 4 = $220.16/h.
    assert v["GPUs per replica (tensor parallel)"] == 8
    assert "2 GPUs: 34 replicas, $495.36/h; 4 GPUs: 10 replicas, $275.20/h" in next(
        s.source for s in p.steps if s.name == "GPUs per replica (tensor parallel)")
    # 8 x 79.65 GiB x 0.9 = 573.48 GiB; (573.48 GiB - 141.2e9 B) / 327,680 B = 1,448,271 tokens
    assert v["usable memory per replica"] == approx(573.48)
    assert v["KV capacity per replica"] == 1_448_271
    # 1,448,271 // (1000 + 200) = 1206 sequences
    assert v["batch that fits the KV cache"] == 1206
    # 50,000 / 20,000 = 2.5 prompt tokens ride along with each decode token
    assert v["prompt tokens per decode token"] == approx(2.5)
    # step(b) = (141.2e9 + b x 1100 x 327,680) / (8 x 3.35e12 x 0.8 = 21.44e12)
    #         + b x (144.084e9 decode + 2.5 x 143.166e9 prefill FLOPs) / (8 x 989.4e12 x 0.5 = 3.9576e15)
    #         = 6.586 ms + b x (16.81 + 126.85) us; <= 50 ms for b <= 43.414 / 0.14366 = 302.2
    assert v["batch within the TPOT target"] == 302
    assert v["decode batch per replica"] == 302
    # 6.586 + 302 x 0.14366 = 49.97 ms
    assert v["step at that batch"] == approx(49.97, rel=1e-4)
    # 302 / 49.97 ms = 6,044 tokens/s
    assert v["decode throughput per replica"] == approx(6043.6, rel=1e-4)
    # 3.9576e15 / 143.166e9 = 27,643 tokens/s; one prompt's 500 uncached tokens: 18.09 ms
    assert v["prefill throughput per replica, prefill alone"] == approx(27_643.4, rel=1e-4)
    assert v["prefill time of one prompt"] == approx(0.018087, rel=1e-3)
    # 18.09 ms x (1 + ln(100 rho) / (1 - rho)) = 2 s at rho = 0.9584 (ln 95.84 / 0.0416 = 109.6)
    assert v["prefill utilisation cap for TTFT"] == approx(0.95836, rel=1e-4)
    # 20,000 / 6,043.6 = 3.309 replicas; TTFT: 50,000 / (27,643 x 0.9584) = 1.887
    assert v["replicas for throughput"] == approx(3.3093, rel=1e-4)
    assert v["replicas for the TTFT target"] == approx(1.8873, rel=1e-4)
    # ceil(3.309 x 1.2 = 3.97) = 4 replicas x 8 = 32 GPUs on 4 p5.48xlarge
    assert (p.replicas, p.gpus, p.instances, p.instance) == (4, 32, 4, "p5.48xlarge")
    # 4 x $55.04 = $220.16/h over 100 x 1200 x 3600 = 432 M tokens/h = $0.5096 per million
    assert p.usd_per_hour == approx(220.16)
    assert p.usd_per_million_tokens == approx(220.16 / 432)
    # 32 GPUs x 700 W x (1 + 0.82) = 40.768 kW
    assert p.power_kw == approx(40.768)
    # the step is 27.3 ms of prefill compute, 11.7 ms of reads, 11.0 ms of decode compute
    assert p.limiting == "prefill compute"
    assert p.fits and p.problem is None


def test_moe_mixtral_on_h100_step_by_step() -> None:
    mixtral = catalog.model("mixtral-8x7b")
    # Per expert (all layers): (46.7e9 - 12.9e9) / (8 - 2) = 5.633e9; shared: 12.9e9 - 2 x 5.633e9 = 1.633e9.
    # Batch 1 routes to 2 of 8 experts: 1.633e9 + 8 x 5.633e9 x (1 - (1 - 2/8)^1) = 12.9e9 params, x 2 B
    assert weights_read_per_step(mixtral, 1) == pytest.approx(2 * 12.9e9)
    # Batch 4: 1 - 0.75^4 = 0.6836 of the experts: (1.633e9 + 45.067e9 x 0.6836) x 2 B = 64.88e9 B
    assert weights_read_per_step(mixtral, 4) == pytest.approx(2 * (1.6333e9 + 45.0667e9 * 0.68359375), rel=1e-4)
    # Batch 64: every expert is hit (1 - 0.75^64 = 1 - 1e-8): all 46.7e9 params
    assert weights_read_per_step(mixtral, 64) == pytest.approx(2 * 46.7e9, rel=1e-6)

    p = plan(mixtral, catalog.gpu("h100"), rps=10, input_tokens=1000, output_tokens=1000)
    v = values(p)
    # 46.7e9 x 2 B = 93.4e9 B = 86.99 GiB; 2 x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B per token
    assert v["weights"] == pytest.approx(93.4e9 / GiB)
    assert v["KV cache per token"] == 131_072
    # prefill FLOPs use the 12.9e9 active params: 2 x 12.9e9 + 4 x 32 x 4096 x 500 = 26.062e9
    assert v["prefill FLOPs per token"] == pytest.approx(26.062144e9)
    # 2 GPUs hold 87 GiB + one 2000-token sequence; 2, 4 and 8 all need one p5.48xlarge, so the fewest GPUs wins
    assert v["GPUs per replica (tensor parallel)"] == 2
    # (2 x 79.65 GiB x 0.9 - 93.4e9 B) / 131,072 B = 461,901 tokens; / 2000 = 230 sequences
    assert v["KV capacity per replica"] == 461_901
    assert v["batch that fits the KV cache"] == 230
    # The KV cache, not TPOT, bounds the batch: 362 sequences would fit in 50 ms
    assert v["batch within the TPOT target"] == 362
    assert v["decode batch per replica"] == 230
    # reads: (93.4e9 + 230 x 1500 x 131,072 = 45.2e9) / (2 x 3.35e12 x 0.8) = 25.86 ms
    # decode: 230 x (2 x 12.9e9 + 4 x 32 x 4096 x 1500) / (2 x 989.4e12 x 0.5) = 6.18 ms
    # prefill: 230 x 1 x 26.06e9 / 989.4e12 = 6.06 ms; step 38.10 ms
    assert v["step at that batch"] == pytest.approx(38.10, rel=1e-3)
    # 230 / 38.10 ms = 6,037 tokens/s; 10 x 1000 / 6,037 = 1.657 replicas; ceil(1.657 x 1.2) = 2
    assert v["decode throughput per replica"] == pytest.approx(6036.6, rel=1e-4)
    assert (p.replicas, p.gpus_per_replica, p.gpus) == (2, 2, 4)
    # Two 2-GPU replicas share one p5.48xlarge: $55.04/h over 10 x 2000 x 3600 = 72 M tokens/h
    assert (p.instances, p.usd_per_hour) == (1, pytest.approx(55.04))
    assert p.usd_per_million_tokens == pytest.approx(55.04 / 72)
    # 8 GPUs x 700 W x 1.82 = 10.192 kW (the whole instance draws power)
    assert p.power_kw == pytest.approx(10.192)
    assert p.limiting == "KV capacity"


@pytest.mark.parametrize(
    ("service_s", "ttft_s", "rho"),
    [
        # one prefill already misses the target: no utilisation is low enough
        (3.0, 2.0, None),
        # 0.1 x (1 + ln(100 rho) / (1 - rho)) = 1 s where ln(100 rho) / (1 - rho) = 9:
        # rho = 0.5539 (ln 55.39 = 4.0145 = 9 x 0.4461)
        (0.1, 1.0, 0.5539),
    ],
)
def test_ttft_utilisation_cap(service_s: float, ttft_s: float, rho: float | None) -> None:
    got = ttft_utilisation_cap(service_s, ttft_s)
    assert got == (None if rho is None else pytest.approx(rho, abs=1e-3))


def test_kv_bytes_per_token_agrees_with_the_hf_config_form() -> None:
    # 2 x 32 layers x 8 KV heads x 128 dims x 2 B = 131,072 B (Llama 3.1 8B)
    assert kv_bytes_per_token(32, 8, 128, 2) == 131_072
    cfg = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
           "torch_dtype": "bfloat16"}
    assert kv_bytes_per_token_of_config(cfg, "auto") == 131_072
    assert kv_bytes_per_token_of_config({"hidden_size": 1}, "auto") is None


def test_replica_performance_defaults_to_the_batch_the_kv_cache_holds() -> None:
    m, g = catalog.model("llama-3.1-8b"), catalog.gpu("h100")
    full = replica_performance(m, g, 1, context_tokens=2000)
    # (79.65 GiB x 0.9 = 76.971e9 B - 16.06e9 B) / 131,072 B = 464,715 tokens; // 2000 = 232
    assert (full.kv_capacity_tokens, full.max_batch, full.batch) == (464_715, 232, 232)
    assert full.decode_tokens_per_s == pytest.approx(full.batch / full.decode_step_s)
    one = replica_performance(m, g, 1, context_tokens=2000, batch=1)
    # (16.06e9 + 2000 x 131,072) / (3.35e12 x 0.8) + (2 x 8.03e9 + 4 x 32 x 4096 x 2000) / (989.4e12 x 0.5)
    # = 6.090 + 0.035 = 6.125 ms
    assert one.decode_step_s == pytest.approx(6.125e-3, rel=1e-3)
    with pytest.raises(ValueError):
        replica_performance(m, g, 0, context_tokens=100)


# -- (b) against published throughput -----------------------------------------------------
#
# NVIDIA TensorRT-LLM, "Overview" of performance, Throughput Measurements:
#   https://nvidia.github.io/TensorRT-LLM/performance/perf-overview.html
#   (source: https://github.com/NVIDIA/TensorRT-LLM/blob/00f37686aa854010d68bcbd0f4ab000221541ca6/docs/source/performance/perf-overview.md)
# "Total Output Throughput (tokens/sec)" from trtllm-bench at maximum load (infinite
# request rate), on NVIDIA's FP8 checkpoints (nvidia/Llama-3.1-8B-Instruct-FP8,
# nvidia/Llama-3.3-70B-Instruct-FP8; Llama 3.3 70B has Llama 3.1 70B's architecture),
# ISL/OSL 128/2048, where prefill is ~6 % of the work, so the figure is decode throughput:
#   Llama 3.1 8B,  H100 TP1: 22,714 tokens/s      Llama 3.1 8B, H200 TP1: 26,221 tokens/s
#   Llama 3.3 70B, H100 TP2:  6,651 tokens/s      Llama 3.3 70B, H200 TP1: 4,336 tokens/s
# Modelled with 1-byte weights and KV cache. Concurrency is whatever fits: TensorRT-LLM's
# default scheduler (GUARANTEED_NO_EVICT) admits a request only if its KV can reach
# ISL + OSL = 2176 tokens, so the batch is KV capacity / 2176, while a step reads on
# average 128 + 2048 / 2 = 1152 tokens of KV per sequence.
# Not asserted: Llama 3.1 405B, H100 TP8, 4,340 tokens/s: the planner says 5,939 (1.37x),
# as it does not model all-reduce across 8 GPUs.


@pytest.mark.parametrize(
    ("model", "gpu", "gpus", "published", "ratio"),
    [
        # (0.9 x 79.65 GiB - 8.03e9 B) / 65,536 B = 1,051,958 tokens / 2176 = 483 sequences;
        # step = (8.03e9 + 483 x 1152 x 65,536) / (3.35e12 x 0.8) + 483 x 16.66e9 / (1978.9e12 x 0.5)
        #      = 16.60 + 8.13 = 24.74 ms -> 483 / 24.74 ms = 19,525 tokens/s = 0.86 x 22,714
        ("llama-3.1-8b", "h100", 1, 22_714, 0.86),
        # (2 x 0.9 x 79.65 GiB - 70.6e9) / 163,840 B = 508,681 tokens / 2176 = 233 sequences;
        # step = 114.6e9 / 5.36e12 + 233 x 144.2e9 / 1978.9e12 = 21.38 + 16.98 = 38.36 ms
        #      -> 6,074 tokens/s = 0.91 x 6,651
        ("llama-3.1-70b", "h100", 2, 6_651, 0.91),
        # 1,947,754 tokens / 2176 = 895 sequences; 19.69 + 15.07 = 34.76 ms -> 25,747 = 0.98 x 26,221
        ("llama-3.1-8b", "h200", 1, 26_221, 0.98),
        # 397,204 tokens / 2176 = 182 sequences; 53.86 ms -> 3,379 tokens/s = 0.78 x 4,336
        ("llama-3.1-70b", "h200", 1, 4_336, 0.78),
    ],
)
def test_decode_throughput_within_35_percent_of_tensorrt_llm(model: str, gpu: str, gpus: int, published: int,
                                                             ratio: float) -> None:
    fp8 = replace(catalog.model(model), dtype_bytes=1)
    g = catalog.gpu(gpu)
    admitted = replica_performance(fp8, g, gpus, context_tokens=128 + 2048).max_batch
    perf = replica_performance(fp8, g, gpus, context_tokens=128 + 2048 // 2, batch=admitted)
    assert perf.decode_tokens_per_s / published == pytest.approx(ratio, abs=0.01)
    assert 0.65 <= perf.decode_tokens_per_s / published <= 1.35


# -- (c) what does not fit says so, with both numbers -------------------------------------


def test_a_model_too_big_for_the_largest_shape_names_both_numbers() -> None:
    p = plan(catalog.model("llama-3.1-405b"), catalog.gpu("a10g"), rps=1, input_tokens=1000, output_tokens=100)
    assert not p.fits and p.replicas == 0 and p.problem is not None
    # 405.9e9 x 2 B = 811.8e9 B = 756.0 GiB of weights against 8 x 22.49 GiB x 0.9 = 161.9 GiB on a g5.48xlarge
    assert "weights 756.0 GiB" in p.problem
    assert "8 x 22.49 GiB x gpu_memory_utilization 0.9 = 161.9 GiB usable" in p.problem
    assert "g5.48xlarge" in p.problem


def test_a_forced_replica_size_that_cannot_hold_the_weights() -> None:
    p = plan(catalog.model("llama-3.1-70b"), catalog.gpu("h100"), rps=1, input_tokens=1000, output_tokens=100,
             gpus_per_replica=1)
    assert p.problem is not None and not p.fits
    # 131.5 GiB of weights against 79.65 GiB x 0.9 = 71.7 GiB
    assert "weights 131.5 GiB" in p.problem and "= 71.7 GiB usable" in p.problem


def test_unreachable_slos_are_a_problem_not_a_plan() -> None:
    p = plan(catalog.model("llama-3.1-70b"), catalog.gpu("h100"), rps=1, input_tokens=1000, output_tokens=100,
             tpot_p99_ms=1)
    assert p.fits and p.problem is not None and "TPOT target 1 ms" in p.problem


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rps": 0}, "rps must be > 0"),
        ({"prefix_hit_rate": 1.0}, "prefix hit rate must be in [0, 1)"),
        ({"input_tokens": 130_000, "output_tokens": 2000}, "exceed Llama 3.1 70B's context of 131072"),
        ({"instance": catalog.instance("g5.xlarge")}, "g5.xlarge has a10g GPUs, not h100"),
    ],
)
def test_bad_inputs_are_value_errors(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"rps": 1.0, "input_tokens": 100, "output_tokens": 100} | kwargs
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[").replace(")", r"\)")):
        plan(catalog.model("llama-3.1-70b"), catalog.gpu("h100"), **args)  # type: ignore[arg-type]


# -- the catalog ----------------------------------------------------------------------------


def test_every_entry_has_a_source_and_every_instance_a_known_gpu() -> None:
    entries: list[catalog.ModelSpec | catalog.GpuSpec | catalog.InstanceSpec] = [
        *catalog.MODELS, *catalog.GPUS, *catalog.INSTANCES]
    for entry in entries:
        assert entry.source and entry.id == entry.id.lower()
    for inst in catalog.INSTANCES:
        assert catalog.gpu(inst.gpu) and inst.price_date and inst.usd_per_hour > 0
    for m in catalog.MODELS:
        assert m.params_active <= m.params_total and m.heads * m.head_dim == m.hidden_size
    assert [i.id for i in catalog.instances_for("l40s")] == ["g6e.xlarge", "g6e.12xlarge", "g6e.48xlarge"]


def test_unknown_ids_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'gpt-5'; valid: llama-3.1-8b, llama-3.1-70b"):
        catalog.model("gpt-5")
    with pytest.raises(ValueError, match=r"unknown gpu 'tpu'; valid: h100, h200, a100, l40s, a10g, b200"):
        catalog.gpu("tpu")
    with pytest.raises(ValueError, match=r"unknown instance 'p3.2xlarge'; valid: p5.48xlarge"):
        catalog.instance("p3.2xlarge")


@pytest.mark.parametrize(
    ("gpu_type", "gpu_id"),
    [("h100-80gb", "h100"), ("H100", "h100"), ("l40s-48gb", "l40s"), ("nvidia-a10g", "a10g"),
     ("a100-80gb", "a100"), ("h200-141gb", "h200"), ("B200", "b200"),
     # not in the catalog: another memory size, a PCIe card, the A10 (not the A10G), a CPU
     ("a100-40gb", None), ("h100-pcie", None), ("a10", None), ("cpu", None), ("l4-24gb", None)],
)
def test_gpu_for_type(gpu_type: str, gpu_id: str | None) -> None:
    found = catalog.gpu_for_type(gpu_type)
    assert (found.id if found else None) == gpu_id


# -- (d) the command line ---------------------------------------------------------------

ARGS = ["plan", "--model", "llama-3.1-70b", "--gpu", "h100", "--rps", "100", "--input-tokens", "1000",
        "--output-tokens", "200", "--prefix-hit-rate", "0.5", "--instance", "p5.48xlarge"]


def test_cli_json_has_the_headline_and_every_step(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("replicas", "gpus", "instances", "usd_per_hour", "usd_per_million_tokens", "power_kw",
                "limiting", "fits", "problem", "steps"):
        assert key in out
    assert (out["replicas"], out["gpus"], out["instances"], out["fits"], out["problem"]) == (4, 32, 4, True, None)
    assert {"name", "value", "unit", "source"} <= set(out["steps"][0])


def test_cli_markdown_is_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "| step | value | unit | source or formula |" in lines
    assert "| --- | ---: | --- | --- |" in lines
    assert all(line.startswith("|") and line.endswith("|") for line in lines if line)


def test_cli_default_is_an_aligned_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert "replicas                 4 x 8 GPUs (tensor parallel)" in out
    rows = [line for line in out.splitlines() if line.startswith(("requests ", "GPUs per replica"))]
    assert len(rows) == 2 and rows[0].index("req/s") == rows[1].index("GPUs  ")


@pytest.mark.parametrize(
    ("flag", "value", "valid"),
    [("--model", "gpt-5", "llama-3.1-8b, llama-3.1-70b, llama-3.1-405b, qwen2.5-72b, mixtral-8x7b"),
     ("--gpu", "tpu-v5", "h100, h200, a100, l40s, a10g, b200"),
     ("--instance", "p3.2xlarge", "p5.48xlarge, p5e.48xlarge")],
)
def test_cli_unknown_ids_exit_2_listing_the_valid_ones(capsys: pytest.CaptureFixture[str], flag: str, value: str,
                                                       valid: str) -> None:
    args = list(ARGS)
    args[args.index(flag) + 1] = value
    assert main(args) == 2
    assert valid in capsys.readouterr().err


def test_cli_a_model_that_does_not_fit_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "llama-3.1-405b", "--gpu", "l40s", "--rps", "1", "--input-tokens", "100",
                 "--output-tokens", "100"]) == 1
    captured = capsys.readouterr()
    # 756.0 GiB of weights vs 8 x 44.99 GiB x 0.9 = 323.9 GiB on a g6e.48xlarge
    assert "weights 756.0 GiB" in captured.err and "323.9 GiB usable" in captured.err
    assert "fits     no" in captured.out


def test_render_formats_values_for_reading() -> None:
    assert [render.fmt(v) for v in (10_000_000.0, 143.16608e9, 0.95836, 49.97, 7, "x")] == [
        "10,000,000", "1.432e+11", "0.9584", "49.97", "7", "x"]
