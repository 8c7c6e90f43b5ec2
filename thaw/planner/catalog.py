"""Published figures the planner sizes with: models, GPUs and AWS instances.

Every entry names where its numbers come from and when. Lower-case ids; the lookups
raise a ValueError that lists the valid ones. Pure data: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeVar


@dataclass(frozen=True)
class ModelSpec:
    id: str
    name: str
    params_total: int
    # Parameters one token passes through: params_total for a dense model; for a MoE the
    # shared weights plus experts_per_token experts.
    params_active: int
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab: int
    # Weights and KV cache: bf16 = 2, fp8 = 1.
    dtype_bytes: int
    max_context: int
    source: str
    # MoE only (0 for dense): experts per layer and how many each token is routed to.
    experts: int = 0
    experts_per_token: int = 0

    @property
    def is_moe(self) -> bool:
        return self.experts > 0


@dataclass(frozen=True)
class GpuSpec:
    id: str
    name: str
    # What the driver reports as total memory (nvidia-smi memory.total), in GiB: the pool
    # that vLLM's gpu_memory_utilization is a fraction of. The marketed "80GB" is in the name.
    memory_gib: float
    # Dense (no 2:4 sparsity) tensor-core peaks.
    bf16_tflops: float
    fp8_tflops: float | None
    hbm_tb_s: float
    tdp_w: int
    source: str


@dataclass(frozen=True)
class InstanceSpec:
    id: str
    gpu: str
    gpu_count: int
    # On-demand, Linux, us-east-1.
    usd_per_hour: float
    price_date: str
    source: str
    network_gbps: float


def _hf(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        id="llama-3.1-8b", name="Llama 3.1 8B", params_total=8_030_000_000, params_active=8_030_000_000,
        layers=32, hidden_size=4096, heads=32, kv_heads=8, head_dim=128, intermediate_size=14336,
        vocab=128256, dtype_bytes=2, max_context=131072,
        source=f"{_hf('meta-llama/Llama-3.1-8B-Instruct')} (2024-07-23); 8.03B params per the model page",
    ),
    ModelSpec(
        id="llama-3.1-70b", name="Llama 3.1 70B", params_total=70_600_000_000, params_active=70_600_000_000,
        layers=80, hidden_size=8192, heads=64, kv_heads=8, head_dim=128, intermediate_size=28672,
        vocab=128256, dtype_bytes=2, max_context=131072,
        source=f"{_hf('meta-llama/Llama-3.1-70B-Instruct')} (2024-07-23); 70.6B params per the model page",
    ),
    ModelSpec(
        id="llama-3.1-405b", name="Llama 3.1 405B", params_total=405_900_000_000,
        params_active=405_900_000_000, layers=126, hidden_size=16384, heads=128, kv_heads=8, head_dim=128,
        intermediate_size=53248, vocab=128256, dtype_bytes=2, max_context=131072,
        source=f"{_hf('meta-llama/Llama-3.1-405B-Instruct')} (2024-07-23); 405.9B params per the model page",
    ),
    ModelSpec(
        id="qwen2.5-72b", name="Qwen2.5 72B", params_total=72_700_000_000, params_active=72_700_000_000,
        layers=80, hidden_size=8192, heads=64, kv_heads=8, head_dim=128, intermediate_size=29568,
        vocab=152064, dtype_bytes=2, max_context=32768,
        source=f"{_hf('Qwen/Qwen2.5-72B-Instruct')} (2024-09-19); 72.7B params per the model card "
               "(max_position_embeddings 32768; 131072 only with YaRN)",
    ),
    ModelSpec(
        id="mixtral-8x7b", name="Mixtral 8x7B", params_total=46_700_000_000, params_active=12_900_000_000,
        layers=32, hidden_size=4096, heads=32, kv_heads=8, head_dim=128, intermediate_size=14336,
        vocab=32000, dtype_bytes=2, max_context=32768, experts=8, experts_per_token=2,
        source=f"{_hf('mistralai/Mixtral-8x7B-Instruct-v0.1')} (num_local_experts 8, num_experts_per_tok 2); "
               "46.7B total / 12.9B active params per https://mistral.ai/news/mixtral-of-experts (2023-12-11)",
    ),
)

GPUS: tuple[GpuSpec, ...] = (
    GpuSpec(
        id="h100", name="NVIDIA H100 SXM5 80GB", memory_gib=79.65, bf16_tflops=989.4, fp8_tflops=1978.9,
        hbm_tb_s=3.35, tdp_w=700,
        source="NVIDIA H100 datasheet, SXM column (https://www.nvidia.com/en-us/data-center/h100/, 2023): "
               "BF16 1,979 / FP8 3,958 TFLOPS with sparsity, halved here for dense; memory 81,559 MiB as "
               "nvidia-smi reports it",
    ),
    GpuSpec(
        id="h200", name="NVIDIA H200 SXM 141GB", memory_gib=140.4, bf16_tflops=989.4, fp8_tflops=1978.9,
        hbm_tb_s=4.8, tdp_w=700,
        source="NVIDIA H200 datasheet, SXM column (https://www.nvidia.com/en-us/data-center/h200/, 2024): "
               "same tensor peaks as H100 SXM, 4.8 TB/s; memory 143,771 MiB as nvidia-smi reports it",
    ),
    GpuSpec(
        id="a100", name="NVIDIA A100 SXM4 80GB", memory_gib=80.0, bf16_tflops=312.0, fp8_tflops=None,
        hbm_tb_s=2.039, tdp_w=400,
        source="NVIDIA A100 datasheet, 80GB SXM column (https://www.nvidia.com/en-us/data-center/a100/, "
               "2021): BF16 312 TFLOPS dense, no FP8; memory 81,920 MiB as nvidia-smi reports it",
    ),
    GpuSpec(
        id="l40s", name="NVIDIA L40S 48GB", memory_gib=44.99, bf16_tflops=362.05, fp8_tflops=733.0,
        hbm_tb_s=0.864, tdp_w=350,
        source="NVIDIA L40S datasheet (https://www.nvidia.com/en-us/data-center/l40s/, 2023): BF16 733 / "
               "FP8 1,466 TFLOPS with sparsity, halved here for dense; GDDR6 864 GB/s; memory 46,068 MiB "
               "(ECC on) as nvidia-smi reports it",
    ),
    GpuSpec(
        id="a10g", name="NVIDIA A10G 24GB (AWS)", memory_gib=22.49, bf16_tflops=70.0, fp8_tflops=None,
        hbm_tb_s=0.6, tdp_w=300,
        source="AWS-only A10 variant: 600 GB/s and 70 TFLOPS tensor BF16 per Baseten, 'NVIDIA A10 vs A10G for "
               "ML model inference' (https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/, "
               "2023); 300 W and 23,028 MiB as nvidia-smi reports them on g5",
    ),
    GpuSpec(
        id="b200", name="NVIDIA B200 180GB (HGX B200)", memory_gib=179.06, bf16_tflops=2250.0,
        fp8_tflops=4500.0, hbm_tb_s=8.0, tdp_w=1000,
        source="NVIDIA HGX B200 datasheet (https://www.nvidia.com/en-us/data-center/hgx/, 2024): 8 GPUs give "
               "36 PF BF16 / 72 PF FP8 with sparsity and 64 TB/s, so per GPU dense 2.25 / 4.5 PF and 8 TB/s; "
               "memory 183,359 MiB as nvidia-smi reports it",
    ),
)

_T = TypeVar("_T", ModelSpec, GpuSpec, InstanceSpec)

_PRICE_LIST = ("AWS Price List API, AmazonEC2 us-east-1, on-demand Linux shared tenancy, version "
               "20260728175247 (https://aws.amazon.com/ec2/pricing/on-demand/)")
_PRICE_LIST_G = ("AWS on-demand Linux price, us-east-1, as listed 2026-07 "
                 "(https://aws.amazon.com/ec2/pricing/on-demand/); check before use")
_SPECS = "network per https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html"

INSTANCES: tuple[InstanceSpec, ...] = (
    InstanceSpec(id="p5.48xlarge", gpu="h100", gpu_count=8, usd_per_hour=55.04, price_date="2026-07",
                 source=f"{_PRICE_LIST}; $55.04 since the June 2025 price cut ($98.32 before); {_SPECS}",
                 network_gbps=3200),
    InstanceSpec(id="p5e.48xlarge", gpu="h200", gpu_count=8, usd_per_hour=63.296, price_date="2026-07",
                 source="p5e.48xlarge has no on-demand SKU in the us-east-1 price list (Capacity Blocks "
                        f"only); this is p5en.48xlarge's on-demand rate (also 8 x H200) from the {_PRICE_LIST}; "
                        f"check before use; {_SPECS}",
                 network_gbps=3200),
    InstanceSpec(id="p4de.24xlarge", gpu="a100", gpu_count=8, usd_per_hour=27.44705, price_date="2026-07",
                 source=f"{_PRICE_LIST}; {_SPECS}", network_gbps=400),
    InstanceSpec(id="g6e.xlarge", gpu="l40s", gpu_count=1, usd_per_hour=1.861, price_date="2026-07",
                 source=f"{_PRICE_LIST_G}; network up to 20 Gbps, {_SPECS}", network_gbps=20),
    InstanceSpec(id="g6e.12xlarge", gpu="l40s", gpu_count=4, usd_per_hour=10.49264, price_date="2026-07",
                 source=f"{_PRICE_LIST_G}; {_SPECS}", network_gbps=100),
    InstanceSpec(id="g6e.48xlarge", gpu="l40s", gpu_count=8, usd_per_hour=30.13118, price_date="2026-07",
                 source=f"{_PRICE_LIST}; {_SPECS}", network_gbps=400),
    InstanceSpec(id="g5.xlarge", gpu="a10g", gpu_count=1, usd_per_hour=1.006, price_date="2026-07",
                 source=f"{_PRICE_LIST_G}; network up to 10 Gbps, {_SPECS}", network_gbps=10),
    InstanceSpec(id="g5.12xlarge", gpu="a10g", gpu_count=4, usd_per_hour=5.672, price_date="2026-07",
                 source=f"{_PRICE_LIST_G}; {_SPECS}", network_gbps=40),
    InstanceSpec(id="g5.48xlarge", gpu="a10g", gpu_count=8, usd_per_hour=16.288, price_date="2026-07",
                 source=f"{_PRICE_LIST_G}; {_SPECS}", network_gbps=100),
    InstanceSpec(id="p6-b200.48xlarge", gpu="b200", gpu_count=8, usd_per_hour=113.9328, price_date="2026-07",
                 source=f"{_PRICE_LIST}; {_SPECS}", network_gbps=3200),
)


def _lookup(kind: str, entries: tuple[_T, ...], id_: str) -> _T:
    for e in entries:
        if e.id == id_.strip().lower():
            return e
    raise ValueError(f"unknown {kind} {id_!r}; valid: {', '.join(e.id for e in entries)}")


def model(id_: str) -> ModelSpec:
    """The catalog model ``id_`` (ValueError listing the valid ids when unknown)."""
    return _lookup("model", MODELS, id_)


def gpu(id_: str) -> GpuSpec:
    """The catalog GPU ``id_`` (ValueError listing the valid ids when unknown)."""
    return _lookup("gpu", GPUS, id_)


def instance(id_: str) -> InstanceSpec:
    """The catalog instance type ``id_`` (ValueError listing the valid ids when unknown)."""
    return _lookup("instance", INSTANCES, id_)


def instances_for(gpu_id: str) -> tuple[InstanceSpec, ...]:
    """The catalog's instance types with ``gpu_id``'s GPUs, fewest GPUs first."""
    return tuple(sorted((i for i in INSTANCES if i.gpu == gpu_id), key=lambda i: (i.gpu_count, i.usd_per_hour)))


# Words in a shape's gpu_type that say nothing about which GPU it is.
_NOISE = {"nvidia", "tesla", "sxm", "sxm4", "sxm5", "gpu"}
# Variants the catalog does not hold (different memory, bandwidth or power).
_OTHER_VARIANTS = {"pcie", "nvl"}


def gpu_for_type(gpu_type: str) -> GpuSpec | None:
    """The catalog GPU a config shape's free-text ``gpu_type`` names ("h100-80gb", "H100",
    "l40s-48gb"), or None when it names none of them or another variant of one (a PCIe
    H100, a 40 GB A100)."""
    words = [w for w in re.split(r"[^a-z0-9]+", gpu_type.lower()) if w and w not in _NOISE]
    if any(w in _OTHER_VARIANTS for w in words):
        return None
    ids = {g.id: g for g in GPUS}
    found = next((ids[w] for w in words if w in ids), None)
    if found is None:
        return None
    marketed = re.search(r"(\d+)GB", found.name)
    for w in words:
        size = re.fullmatch(r"(\d+)gb?", w)
        if size and marketed and size.group(1) != marketed.group(1):
            return None
    return found
