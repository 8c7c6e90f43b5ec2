"""The planner's arithmetic: traffic in, replicas, GPUs, dollars and watts out.

Pure functions, no I/O. ``plan`` records every step with its value, unit and formula or
source, so a reader can redo the sum by hand; docs/PLANNER.md walks through the model.
``replica_performance`` is the one per-replica cost model (the simulator uses it too), and
``kv_bytes_per_token_of_config`` is the one KV-size formula (``thaw.fit`` uses it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from thaw.planner import catalog
from thaw.planner.catalog import GpuSpec, InstanceSpec, ModelSpec
from thaw.units import GiB

# -- constants ------------------------------------------------------------------------
# vLLM's default --gpu-memory-utilization: the share of each GPU's memory the engine
# takes for weights, activations and KV cache.
GPU_MEMORY_UTILIZATION = 0.9
# Model FLOPs utilisation: the share of the dense tensor peak that matmuls achieve, in
# prefill and in the compute part of a decode step. Well-tuned prefill reaches 40-60 % of
# peak on Hopper; half is the middle of that range.
MFU = 0.5
# Share of the HBM bandwidth a decode step achieves while streaming weights and KV
# (memory-copy kernels reach ~90 % of the datasheet figure; attention and GEMV less).
# With MFU 0.5 this puts the planner within 25 % of TensorRT-LLM's published throughput for
# Llama 3.1 8B and Llama 3.x 70B on H100 and H200 (tests/thaw/test_planner.py).
BANDWIDTH_EFFICIENCY = 0.8
# Spare capacity on top of the tightest constraint, for bursts and a replica lost.
DEFAULT_HEADROOM = 0.2
DEFAULT_TTFT_P99_S = 2.0
DEFAULT_TPOT_P99_MS = 50.0
# Power the rest of a server draws, as a share of its GPUs' TDP: a DGX H100 is specified
# at 10.2 kW max for 8 x 700 W = 5.6 kW of GPUs (CPUs, memory, NICs, NVSwitches, fans),
# so (10.2 - 5.6) / 5.6 = 0.82 (NVIDIA DGX H100 datasheet, 2023).
HOST_POWER_OVERHEAD = 0.82
# The time-to-first-token percentile the prefill queue is sized for.
TTFT_PERCENTILE = 0.99

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "fp8": 1}


# -- per-token sizes ------------------------------------------------------------------


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Key and value bytes one token takes across every layer:
    2 (K and V) x layers x KV heads x head dim x dtype bytes."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_bytes_per_token_of_config(hf_config: dict[str, Any], dtype: str) -> int | None:
    """``kv_bytes_per_token`` from a model's HF ``config.json`` and an engine dtype
    ("auto": the config's torch_dtype). None when the config is too unusual to size."""
    try:
        layers = int(hf_config["num_hidden_layers"])
        heads = int(hf_config["num_attention_heads"])
        kv_heads = int(hf_config.get("num_key_value_heads") or heads)
        head_dim = int(hf_config.get("head_dim") or int(hf_config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    name = dtype if dtype != "auto" else str(hf_config.get("torch_dtype") or "bfloat16")
    return kv_bytes_per_token(layers, kv_heads, head_dim, DTYPE_BYTES.get(name, 2))


def model_kv_bytes_per_token(model: ModelSpec) -> int:
    return kv_bytes_per_token(model.layers, model.kv_heads, model.head_dim, model.dtype_bytes)


def weights_bytes(model: ModelSpec) -> int:
    """Every parameter, experts included, at the model's dtype."""
    return model.params_total * model.dtype_bytes


def weights_read_per_step(model: ModelSpec, batch: int) -> float:
    """Weight bytes one decode step streams from HBM. Dense: all of them. MoE: the shared
    weights plus the experts that at least one of ``batch`` tokens is routed to, assuming
    uniform routing: each layer touches E x (1 - (1 - k/E)^batch) of its E experts (batch 1
    reads params_active; Mixtral at batch 16 already reads 99 % of its experts)."""
    if not model.is_moe:
        return float(weights_bytes(model))
    e, k = model.experts, model.experts_per_token
    per_expert = (model.params_total - model.params_active) / (e - k)
    shared = model.params_active - k * per_expert
    touched = 1 - (1 - k / e) ** max(batch, 1)
    return (shared + e * per_expert * touched) * model.dtype_bytes


def flops_per_token(model: ModelSpec, attended_tokens: float) -> float:
    """Forward-pass FLOPs for one token that attends to ``attended_tokens`` earlier ones:
    2 x active params (the matmuls) + 2 x 2 x layers x q width x attended (QK^T and AV)."""
    return 2 * model.params_active + 4 * model.layers * model.heads * model.head_dim * attended_tokens


def peak_tflops(model: ModelSpec, gpu: GpuSpec) -> float:
    """The dense tensor peak the model's dtype runs at: FP8 for 1-byte weights on a GPU
    with FP8 tensor cores, else BF16 (weight-only FP8 on A100/A10G computes in BF16)."""
    if model.dtype_bytes == 1 and gpu.fp8_tflops is not None:
        return gpu.fp8_tflops
    return gpu.bf16_tflops


def decode_step_s(model: ModelSpec, gpu: GpuSpec, gpus: int, *, batch: int, context_tokens: float) -> float:
    """One decode step of ``batch`` sequences of ``context_tokens`` each, on ``gpus``
    tensor-parallel GPUs: streaming the weights plus every sequence's KV through HBM at
    BANDWIDTH_EFFICIENCY, plus the step's FLOPs at MFU.

    The two are added, not overlapped (max() would be the ideal roofline): at the batch
    sizes serving runs at a step is neither purely memory- nor compute-bound, and the sum
    is what matches TensorRT-LLM's published throughput (tests/thaw/test_planner.py)."""
    read = weights_read_per_step(model, batch) + batch * context_tokens * model_kv_bytes_per_token(model)
    memory_s = read / (gpus * gpu.hbm_tb_s * 1e12 * BANDWIDTH_EFFICIENCY)
    compute_s = batch * flops_per_token(model, context_tokens) / (gpus * peak_tflops(model, gpu) * 1e12 * MFU)
    return memory_s + compute_s


def kv_capacity_bytes(model: ModelSpec, gpu: GpuSpec, gpus: int) -> float:
    """KV cache room on ``gpus`` GPUs: memory x GPU_MEMORY_UTILIZATION - weights
    (activations are taken to fit in the rest, as vLLM's profiling leaves them)."""
    return gpus * gpu.memory_gib * GiB * GPU_MEMORY_UTILIZATION - weights_bytes(model)


@dataclass(frozen=True)
class ReplicaPerformance:
    """What one replica (one engine on ``gpus`` tensor-parallel GPUs) can do."""

    weights_bytes: int
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    # Sequences of context_tokens whose KV fits at once (0: not even one).
    max_batch: int
    # Prompt tokens per second with the replica doing nothing else.
    prefill_tokens_per_s: float
    batch: int
    # One decode step at ``batch``.
    decode_step_s: float
    # batch / decode_step_s.
    decode_tokens_per_s: float
    gpus: int


def replica_performance(model: ModelSpec, gpu: GpuSpec, gpus: int, *, context_tokens: int,
                        batch: int | None = None) -> ReplicaPerformance:
    """One replica of ``model`` on ``gpus`` x ``gpu``, its sequences ``context_tokens`` long.

    ``batch`` None: as many sequences as the KV cache holds (``max_batch``). Prefill is
    costed at an average attended context of context_tokens / 2 (a causal prompt's mean).
    """
    if gpus < 1 or context_tokens < 1 or (batch is not None and batch < 0):
        raise ValueError(f"need gpus >= 1, context_tokens >= 1, batch >= 0 (got {gpus}, {context_tokens}, {batch})")
    per_token = model_kv_bytes_per_token(model)
    capacity = max(0, int(kv_capacity_bytes(model, gpu, gpus) // per_token))
    max_batch = capacity // context_tokens
    b = max_batch if batch is None else batch
    step = decode_step_s(model, gpu, gpus, batch=b, context_tokens=context_tokens)
    prefill = gpus * peak_tflops(model, gpu) * 1e12 * MFU / flops_per_token(model, context_tokens / 2)
    return ReplicaPerformance(
        weights_bytes=weights_bytes(model), kv_bytes_per_token=per_token, kv_capacity_tokens=capacity,
        max_batch=max_batch, prefill_tokens_per_s=prefill, batch=b, decode_step_s=step,
        decode_tokens_per_s=b / step if b > 0 else 0.0, gpus=gpus,
    )


def largest_batch(fits: Callable[[int], bool], upper: int) -> int:
    """The largest b in [0, upper] with fits(b), for a fits that holds up to some b and
    fails after it (0 when it fails at 1)."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def ttft_utilisation_cap(service_s: float, ttft_s: float) -> float | None:
    """The highest prefill utilisation rho at which the TTFT_PERCENTILE of time to first
    token stays within ``ttft_s``, for prompts that each take ``service_s`` of prefill.

    The queue is taken as M/M/1 (a conservative stand-in for M/D/1: deterministic service
    has a lighter tail): P(wait > t) = rho x exp(-(1 - rho) t / service_s), so the p99
    wait is service_s x ln(rho / 0.01) / (1 - rho) (zero while rho <= 0.01), and TTFT is
    that wait plus the prompt's own prefill. None: one prefill alone exceeds ``ttft_s``.
    """
    if service_s > ttft_s:
        return None
    tail = 1 - TTFT_PERCENTILE

    def p_ttft(rho: float) -> float:
        return service_s * (1 + max(0.0, math.log(rho / tail)) / (1 - rho))

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p_ttft(mid) <= ttft_s else (lo, mid)
    return lo


# -- the plan -------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    name: str
    value: float | int | str
    unit: str
    source: str


@dataclass(frozen=True)
class Plan:
    model: str
    gpu: str
    instance: str | None
    steps: list[Step]
    replicas: int
    gpus_per_replica: int
    gpus: int
    instances: int
    usd_per_hour: float
    usd_per_million_tokens: float
    power_kw: float
    # The constraint that sets the replica count.
    limiting: str
    # Weights plus one full sequence's KV fit the shape.
    fits: bool
    # Why no plan meets the request (memory or SLOs), with the numbers; None when one does.
    problem: str | None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["steps"] = [asdict(s) for s in self.steps]
        return out


@dataclass(frozen=True)
class _Option:
    """The sizing at one GPUs-per-replica; what ``plan`` chooses among."""

    gpus_per_replica: int
    instance: InstanceSpec
    perf: ReplicaPerformance
    kv_batch: int
    tpot_batch: int
    batch: int
    # One step at ``batch``, split into its parts.
    memory_s: float
    decode_compute_s: float
    prefill_compute_s: float
    decode_tokens_per_s: float
    prefill_tokens_per_s: float
    prefill_service_s: float
    rho_cap: float
    replicas_throughput: float
    prefill_share: float
    replicas_ttft: float
    replicas: int
    instances: int

    @property
    def step_s(self) -> float:
        return self.memory_s + self.decode_compute_s + self.prefill_compute_s

    @property
    def usd_per_hour(self) -> float:
        return self.instances * self.instance.usd_per_hour


def plan(model: ModelSpec, gpu: GpuSpec, *, rps: float, input_tokens: int, output_tokens: int,
         prefix_hit_rate: float = 0.0, ttft_p99_s: float = DEFAULT_TTFT_P99_S,
         tpot_p99_ms: float = DEFAULT_TPOT_P99_MS, instance: InstanceSpec | None = None,
         headroom: float = DEFAULT_HEADROOM, gpus_per_replica: int | None = None) -> Plan:
    """Size a deployment of ``model`` on ``gpu`` for ``rps`` requests per second of
    ``input_tokens`` in and ``output_tokens`` out, within the p99 TTFT and TPOT targets.

    The instance type is ``instance``, else the catalog's for that GPU; the GPUs per
    replica are ``gpus_per_replica``, else the power of two (up to the instance's GPU count)
    that costs least. ValueError for inputs out of range.
    """
    _check_inputs(model, gpu, rps, input_tokens, output_tokens, prefix_hit_rate, ttft_p99_s, tpot_p99_ms,
                  instance, headroom, gpus_per_replica)
    shapes = (instance,) if instance is not None else catalog.instances_for(gpu.id)
    if not shapes:
        raise ValueError(f"no instance type with {gpu.id} GPUs in the catalog")
    steps: list[Step] = []
    add = _adder(steps)
    h = prefix_hit_rate
    total_tokens = input_tokens + output_tokens
    decode_context = input_tokens + output_tokens / 2
    attended = input_tokens * (1 + h) / 2
    prefill_tps = rps * input_tokens * (1 - h)
    decode_tps = rps * output_tokens

    add("requests", rps, "req/s", "--rps")
    add("input tokens per request", input_tokens, "tokens", "--input-tokens")
    add("output tokens per request", output_tokens, "tokens", "--output-tokens")
    add("prefix cache hit rate", h, "fraction", "--prefix-hit-rate")
    add("TTFT p99 target", ttft_p99_s, "s", "--ttft-p99-s")
    add("TPOT p99 target", tpot_p99_ms, "ms", "--tpot-p99-ms")
    add("headroom", headroom, "fraction", "--headroom")
    add("model", model.name, "", model.source)
    add("parameters (total / active)", f"{model.params_total / 1e9:g}B / {model.params_active / 1e9:g}B",
        "params", "model row's source")
    add("weights", weights_bytes(model) / GiB, "GiB",
        f"{model.params_total / 1e9:g}e9 params x {model.dtype_bytes} B ({_dtype(model)})")
    kv_tok = model_kv_bytes_per_token(model)
    add("KV cache per token", kv_tok, "B",
        f"2 (K,V) x {model.layers} layers x {model.kv_heads} KV heads x {model.head_dim} dims x "
        f"{model.dtype_bytes} B")
    add("GPU", gpu.name, "", gpu.source)
    peak = peak_tflops(model, gpu)
    add("GPU memory", gpu.memory_gib, "GiB", "as the driver reports it; GPU row's source")
    add(f"GPU dense {'FP8' if peak != gpu.bf16_tflops else 'BF16'} peak", peak, "TFLOPS",
        "GPU row's source" + (" (FP8: the model's weights are 1 byte)" if peak != gpu.bf16_tflops else ""))
    add("GPU HBM bandwidth", gpu.hbm_tb_s, "TB/s", "GPU row's source")
    add("prefill tokens", prefill_tps, "tokens/s", f"{rps:g} req/s x {input_tokens} x (1 - {h:g} prefix hits)")
    add("decode tokens", decode_tps, "tokens/s", f"{rps:g} req/s x {output_tokens}")
    f_prefill = flops_per_token(model, attended)
    add("prefill FLOPs per token", f_prefill, "FLOP",
        f"2 x {model.params_active / 1e9:g}e9 active params + 2 x 2 x {model.layers} layers x "
        f"{model.heads * model.head_dim} q width x {attended:g} attended tokens (uncached prompt positions "
        f"{input_tokens * h:g}..{input_tokens}, mean {input_tokens}(1 + {h:g})/2)")
    add("prefill compute", prefill_tps * f_prefill / 1e15, "PFLOP/s", "prefill tokens/s x FLOPs per token")

    one_sequence = weights_bytes(model) + total_tokens * kv_tok
    max_gpus = max(s.gpu_count for s in shapes)
    sizes = [gpus_per_replica] if gpus_per_replica else [p for p in (1, 2, 4, 8, 16, 32) if p <= max_gpus]
    fitting = [p for p in sizes if kv_capacity_bytes(model, gpu, p) >= total_tokens * kv_tok]
    if not fitting:
        p = sizes[-1]
        usable = p * gpu.memory_gib * GPU_MEMORY_UTILIZATION
        problem = (f"{model.name} does not fit {p} x {gpu.name}: weights {weights_bytes(model) / GiB:.1f} GiB + "
                   f"KV for one {total_tokens}-token sequence {total_tokens * kv_tok / GiB:.2f} GiB = "
                   f"{one_sequence / GiB:.1f} GiB > {p} x {gpu.memory_gib:g} GiB x gpu_memory_utilization "
                   f"{GPU_MEMORY_UTILIZATION:g} = {usable:.1f} GiB usable"
                   + ("" if gpus_per_replica else
                      f" ({p} GPUs: the most on one {max(shapes, key=lambda s: s.gpu_count).id})"))
        add("fits", "no", "", problem)
        return _no_plan(model, gpu, instance, steps, p, problem, fits=False)

    options = [o for p in fitting
               if (o := _size(model, gpu, p, shapes, total_tokens, prefill_tps, decode_tps, decode_context, attended,
                              input_tokens * (1 - h), ttft_p99_s, tpot_p99_ms / 1e3, headroom)) is not None]
    if not options:
        p = fitting[-1]
        compute_rate = p * peak * 1e12 * MFU
        step1 = decode_step_s(model, gpu, p, batch=1, context_tokens=decode_context)
        carried = prefill_tps / decode_tps * f_prefill / compute_rate
        service = input_tokens * (1 - h) / (compute_rate / f_prefill)
        problem = (f"no replica of up to {p} x {gpu.id} meets the SLOs: a step at batch 1 takes "
                   f"{(step1 + carried) * 1e3:.1f} ms ({carried * 1e3:.1f} ms of it for the prompt tokens each "
                   f"decode token carries) against the TPOT target {tpot_p99_ms:g} ms; one prompt's prefill takes "
                   f"{service:.2f} s against the TTFT target {ttft_p99_s:g} s")
        add("meets SLOs", "no", "", problem)
        return _no_plan(model, gpu, instance, steps, p, problem, fits=True)
    best = min(options, key=lambda o: (o.usd_per_hour, o.instances * o.instance.gpu_count, o.gpus_per_replica))
    return _record(model, gpu, steps, add, best, options, fitting, rps, total_tokens, decode_context, f_prefill,
                   prefill_tps / decode_tps, headroom, ttft_p99_s, tpot_p99_ms, gpus_per_replica)


def _size(model: ModelSpec, gpu: GpuSpec, p: int, shapes: tuple[InstanceSpec, ...], full_context: int,
          prefill_tps: float, decode_tps: float, decode_context: float, attended: float,
          prompt_tokens: float, ttft_s: float, tpot_s: float, headroom: float) -> _Option | None:
    """Size with ``p`` GPUs per replica; None when the SLOs cannot be met with ``p``.

    A sequence is admitted only if its KV can grow to input + output tokens (no
    preemption; TensorRT-LLM's default scheduler makes the same guarantee, vLLM preempts
    instead), so the KV bound on the batch uses the full length; what a step reads is the
    mean length while decoding, input + output / 2. With chunked prefill (vLLM's default)
    each decode step also carries prompt tokens, ``prefill_tps / decode_tps`` of them per
    decode token, so their compute counts against the TPOT target too."""
    ctx = max(1, round(decode_context))
    perf = replica_performance(model, gpu, p, context_tokens=full_context)
    compute_rate = p * peak_tflops(model, gpu) * 1e12 * MFU
    prefill_per_decode = prefill_tps / decode_tps
    f_prefill = flops_per_token(model, attended)

    def step_parts(b: int) -> tuple[float, float, float]:
        read = weights_read_per_step(model, b) + b * ctx * perf.kv_bytes_per_token
        return (read / (p * gpu.hbm_tb_s * 1e12 * BANDWIDTH_EFFICIENCY),
                b * flops_per_token(model, ctx) / compute_rate,
                b * prefill_per_decode * f_prefill / compute_rate)

    tpot_batch = largest_batch(lambda b: sum(step_parts(b)) <= tpot_s, max(perf.max_batch, 1) * 4 + 1024)
    batch = min(perf.max_batch, tpot_batch)
    fits_shape = [s for s in shapes if s.gpu_count >= p]
    prefill_cap = compute_rate / f_prefill
    service = prompt_tokens / prefill_cap
    rho = ttft_utilisation_cap(service, ttft_s)
    if batch < 1 or rho is None or not fits_shape:
        return None
    memory_s, decode_s, prefill_s = step_parts(batch)
    decode_rate = batch / (memory_s + decode_s + prefill_s)
    r_throughput = decode_tps / decode_rate
    r_ttft = prefill_tps / (prefill_cap * rho) if rho > 0 else math.inf
    replicas = max(1, math.ceil(max(r_throughput, r_ttft) * (1 + headroom) - 1e-9))
    shape = min(fits_shape, key=lambda s: (math.ceil(replicas / (s.gpu_count // p)) * s.usd_per_hour, s.gpu_count))
    return _Option(
        gpus_per_replica=p, instance=shape, perf=perf, kv_batch=perf.max_batch, tpot_batch=tpot_batch, batch=batch,
        memory_s=memory_s, decode_compute_s=decode_s, prefill_compute_s=prefill_s, decode_tokens_per_s=decode_rate,
        prefill_tokens_per_s=prefill_cap, prefill_service_s=service, rho_cap=rho, replicas_throughput=r_throughput,
        prefill_share=decode_rate * prefill_per_decode / prefill_cap, replicas_ttft=r_ttft, replicas=replicas,
        instances=math.ceil(replicas / (shape.gpu_count // p)),
    )


def _record(model: ModelSpec, gpu: GpuSpec, steps: list[Step],
            add: Callable[[str, float | int | str, str, str], None], o: _Option, options: list[_Option],
            fitting: list[int], rps: float, total_tokens: int, decode_context: float, f_prefill: float,
            prefill_per_decode: float, headroom: float, ttft_s: float, tpot_ms: float, forced: int | None) -> Plan:
    p, perf = o.gpus_per_replica, o.perf
    kv_tok = perf.kv_bytes_per_token
    peak = peak_tflops(model, gpu)
    if forced:
        why = "--gpus-per-replica"
    else:
        costs = "; ".join(f"{x.gpus_per_replica} GPUs: {x.replicas} replicas, ${x.usd_per_hour:,.2f}/h"
                          for x in options)
        why = (f"smallest power of two holding weights + one {total_tokens}-token sequence: {fitting[0]}; "
               f"cheapest of those up to {max(fitting)} ({costs})")
    add("GPUs per replica (tensor parallel)", p, "GPUs", why)
    add("usable memory per replica", p * gpu.memory_gib * GPU_MEMORY_UTILIZATION, "GiB",
        f"{p} x {gpu.memory_gib:g} GiB x gpu_memory_utilization {GPU_MEMORY_UTILIZATION:g}")
    add("KV capacity per replica", perf.kv_capacity_tokens, "tokens",
        f"(usable - weights {perf.weights_bytes / GiB:.1f} GiB) / {kv_tok} B per token")
    add("batch that fits the KV cache", o.kv_batch, "sequences",
        f"KV capacity / {total_tokens} tokens (input + output: admitted only if it can grow to full length)")
    add("KV read per sequence per step", decode_context, "tokens",
        "input + output / 2 (the mean length over a sequence's decode)")
    add("prompt tokens per decode token", prefill_per_decode, "tokens",
        "prefill tokens/s / decode tokens/s: chunked prefill puts this many in each step per sequence")
    moe = (f"; MoE weights = shared + experts the batch hits, E x (1 - (1 - {model.experts_per_token}/"
           f"{model.experts})^batch) per layer" if model.is_moe else "")
    add("batch within the TPOT target", o.tpot_batch, "sequences",
        f"largest batch whose step <= {tpot_ms:g} ms; step = (weights + batch x {decode_context:g} x {kv_tok} B) / "
        f"({p} x {gpu.hbm_tb_s:g} TB/s x {BANDWIDTH_EFFICIENCY:g} bandwidth efficiency) + batch x (decode FLOPs + "
        f"{prefill_per_decode:.3g} x prefill FLOPs per token) / ({p} x {peak:g} TFLOPS x {MFU:g} MFU){moe}")
    add("decode batch per replica", o.batch, "sequences",
        f"min(KV {o.kv_batch}, TPOT {o.tpot_batch}): set by {'KV capacity' if o.kv_batch <= o.tpot_batch else 'TPOT'}")
    add("step at that batch", o.step_s * 1e3, "ms",
        f"weights + KV read {o.memory_s * 1e3:.1f} ms + decode compute {o.decode_compute_s * 1e3:.1f} ms + "
        f"prefill compute {o.prefill_compute_s * 1e3:.1f} ms")
    add("decode throughput per replica", o.decode_tokens_per_s, "tokens/s",
        f"batch / step (and {prefill_per_decode:.3g}x that in prompt tokens)")
    add("prefill throughput per replica, prefill alone", o.prefill_tokens_per_s, "tokens/s",
        f"{p} x {peak:g} TFLOPS x {MFU:g} MFU / {f_prefill / 1e9:.1f} GFLOP per token")
    add("prefill time of one prompt", o.prefill_service_s, "s",
        "uncached prompt tokens / prefill throughput (a waiting prompt gets the whole step budget)")
    add("prefill utilisation cap for TTFT", o.rho_cap, "fraction",
        f"highest rho with prefill + p{TTFT_PERCENTILE * 100:g} wait <= {ttft_s:g} s; M/M/1 wait tail "
        "(conservative for M/D/1): prefill time x ln(rho / 0.01) / (1 - rho)")
    add("prefill share of a busy replica's time", o.prefill_share, "fraction",
        "prompt tokens/s per replica / prefill throughput")
    add("replicas for throughput", o.replicas_throughput, "replicas", "decode tokens/s / decode throughput")
    add("replicas for the TTFT target", o.replicas_ttft, "replicas",
        "prefill tokens/s / (prefill throughput x utilisation cap)")
    need = max(o.replicas_throughput, o.replicas_ttft)
    add("replicas needed", need, "replicas", "max(throughput, TTFT)")
    add("replicas with headroom", o.replicas, "replicas", f"ceil(needed x (1 + {headroom:g}))")
    gpus = o.replicas * p
    add("GPUs", gpus, "GPUs", f"{o.replicas} replicas x {p}")
    per = o.instance.gpu_count // p
    add("instances", o.instances, o.instance.id,
        f"ceil({o.replicas} replicas / {per} per {o.instance.id} ({o.instance.gpu_count} GPUs))")
    add("instance price", o.instance.usd_per_hour, "USD/h", f"{o.instance.source} ({o.instance.price_date})")
    add("cost", o.usd_per_hour, "USD/h", f"{o.instances} x ${o.instance.usd_per_hour:g}/h")
    tokens_per_hour = rps * total_tokens * 3600
    add("tokens served", tokens_per_hour / 1e6, "M tokens/h", f"{rps:g} req/s x {total_tokens} tokens x 3600")
    per_million = o.usd_per_hour / (tokens_per_hour / 1e6)
    add("cost per million tokens (input + output)", per_million, "USD", "cost / tokens served")
    billed_gpus = o.instances * o.instance.gpu_count
    power_kw = billed_gpus * gpu.tdp_w * (1 + HOST_POWER_OVERHEAD) / 1e3
    add("power", power_kw, "kW",
        f"{billed_gpus} GPUs x {gpu.tdp_w} W TDP x (1 + {HOST_POWER_OVERHEAD:g} host overhead: DGX H100 "
        "10.2 kW max vs 5.6 kW of GPUs)")
    limiting = _limiting(o)
    add("limiting constraint", limiting, "", "what sets the replica count (the largest part of the step when TPOT)")
    return Plan(
        model=model.id, gpu=gpu.id, instance=o.instance.id, steps=steps, replicas=o.replicas,
        gpus_per_replica=p, gpus=gpus, instances=o.instances, usd_per_hour=o.usd_per_hour,
        usd_per_million_tokens=per_million, power_kw=power_kw, limiting=limiting, fits=True, problem=None,
    )


def _limiting(o: _Option) -> str:
    """The constraint that sets the replica count: TTFT; else KV capacity when it bounds the
    batch; else the largest part of a TPOT-bound step."""
    if o.replicas_ttft > o.replicas_throughput:
        return "TTFT (prefill queueing)"
    if o.kv_batch <= o.tpot_batch:
        return "KV capacity"
    parts = {"decode bandwidth": o.memory_s, "decode compute": o.decode_compute_s,
             "prefill compute": o.prefill_compute_s}
    return max(parts, key=lambda k: parts[k])


def _no_plan(model: ModelSpec, gpu: GpuSpec, instance: InstanceSpec | None, steps: list[Step], p: int,
             problem: str, *, fits: bool) -> Plan:
    return Plan(model=model.id, gpu=gpu.id, instance=instance.id if instance else None, steps=steps, replicas=0,
                gpus_per_replica=p, gpus=0, instances=0, usd_per_hour=0.0, usd_per_million_tokens=0.0,
                power_kw=0.0, limiting="fits" if not fits else "SLOs", fits=fits, problem=problem)


def _adder(steps: list[Step]) -> Callable[[str, float | int | str, str, str], None]:
    def add(name: str, value: float | int | str, unit: str, source: str) -> None:
        steps.append(Step(name, value, unit, source))
    return add


def _dtype(model: ModelSpec) -> str:
    return {1: "fp8", 2: "bf16", 4: "fp32"}.get(model.dtype_bytes, f"{model.dtype_bytes}-byte")


def _check_inputs(model: ModelSpec, gpu: GpuSpec, rps: float, input_tokens: int, output_tokens: int,
                  prefix_hit_rate: float, ttft_p99_s: float, tpot_p99_ms: float, instance: InstanceSpec | None,
                  headroom: float, gpus_per_replica: int | None) -> None:
    problems = []
    if not rps > 0:
        problems.append(f"rps must be > 0 (got {rps:g})")
    if input_tokens < 1 or output_tokens < 1:
        problems.append(f"input and output tokens must be >= 1 (got {input_tokens}, {output_tokens})")
    elif input_tokens + output_tokens > model.max_context:
        problems.append(f"input + output tokens {input_tokens + output_tokens} exceed {model.name}'s context "
                        f"of {model.max_context}")
    if not 0 <= prefix_hit_rate < 1:
        problems.append(f"prefix hit rate must be in [0, 1) (got {prefix_hit_rate:g})")
    if not ttft_p99_s > 0 or not tpot_p99_ms > 0:
        problems.append(f"SLO targets must be > 0 (got TTFT {ttft_p99_s:g} s, TPOT {tpot_p99_ms:g} ms)")
    if headroom < 0:
        problems.append(f"headroom must be >= 0 (got {headroom:g})")
    if instance is not None and instance.gpu != gpu.id:
        problems.append(f"instance {instance.id} has {instance.gpu} GPUs, not {gpu.id}")
    if gpus_per_replica is not None:
        limit = instance.gpu_count if instance else max((s.gpu_count for s in catalog.instances_for(gpu.id)), default=0)
        if not 1 <= gpus_per_replica <= limit:
            problems.append(f"gpus per replica must be in [1, {limit}] (got {gpus_per_replica})")
    if problems:
        raise ValueError("; ".join(problems))
