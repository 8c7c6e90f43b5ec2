"""What a snapshot is valid for: a stable id over everything that can make it wrong or useless.

A snapshot holds vLLM's compile caches. vLLM keys those itself (a hash of its config,
environment and traced source), so a foreign cache is never *loaded* for the wrong
model; the fingerprint exists so that Thaw never restores a snapshot that cannot
help (or that was built for another device or ISA) and never lets one snapshot
stand in for another. Its inputs are therefore:

- the runtime: vLLM, torch and Python versions, the interpreter's prefix (vLLM hashes
  the paths of the source files it traces), machine, device (GPU name and compute
  capability, or the CPU's vector-ISA flags that inductor compiles for);
- the model: its store URI and the sha256 of its ``config.json`` (from the store
  manifest, nothing downloaded), and where vLLM mirrors it locally (vLLM hashes
  the model's local path);
- the engine settings that change compiled code: dtype, tensor-parallel size, max
  model length, eager or compiled, load format, and every ``engine.extra`` flag
  (compilation config, max_num_seqs, ...). Memory sizes (KV cache, GPU memory
  utilisation) change no compiled code and are left out.

:func:`fingerprint_inputs` and :func:`fingerprint_of` are pure; :func:`probe_runtime`
does the I/O (it runs :mod:`snapshotter.runtime` in the engine's interpreter).
"""

from __future__ import annotations

import functools
import json
import subprocess
from dataclasses import dataclass
from typing import Any

from thaw.config import EngineArgs
from thaw.digest import ID_HEX_CHARS, diff_inputs, format_diff, json_normal, short_id

# Bump when the meaning of the inputs changes: every snapshot gets a new id.
FINGERPRINT_VERSION = 1

__all__ = ["ID_HEX_CHARS", "Fingerprint", "diff_inputs", "fingerprint_inputs", "fingerprint_of", "format_diff",
           "probe_runtime"]

RUNTIME_KEYS = ("vllm", "torch", "python", "python_prefix", "machine", "device", "device_name",
                "device_capability", "cpu_isa")


@dataclass(frozen=True)
class Fingerprint:
    """A snapshot's key: ``id`` names it in the store, ``inputs`` say what it is for."""

    id: str
    inputs: dict[str, Any]


def fingerprint_inputs(
    *,
    runtime: dict[str, Any],
    model_uri: str,
    model_config_sha256: str,
    engine: EngineArgs,
    max_model_len: int,
    engine_assets_dir: str,
) -> dict[str, Any]:
    """Everything a snapshot depends on, as a JSON-ready dict (see the module docstring)."""
    missing = [k for k in RUNTIME_KEYS if k not in runtime]
    if missing:
        raise ValueError(f"runtime facts lack {missing}")
    return json_normal({
        "fingerprint_version": FINGERPRINT_VERSION,
        **{k: runtime[k] for k in RUNTIME_KEYS},
        "model_uri": model_uri.rstrip("/"),
        "model_config_sha256": model_config_sha256,
        "engine_assets_dir": engine_assets_dir,
        "dtype": engine.dtype,
        "tensor_parallel_size": engine.tensor_parallel_size or 1,
        "max_model_len": max_model_len,
        "enforce_eager": engine.enforce_eager,
        "load_format": engine.load_format,
        "extra": engine.extra,
    })


def fingerprint_of(inputs: dict[str, Any]) -> Fingerprint:
    """The stable id of ``inputs``: sha256 of their canonical JSON, shortened."""
    normal = json_normal(inputs)
    return Fingerprint(short_id(normal), normal)


@functools.cache
def probe_runtime(python: str) -> dict[str, Any]:
    """Runtime facts of the interpreter ``python`` (cached per interpreter: they do not
    change while it is installed). Blocking: call it from a thread in async code."""
    out = subprocess.run([python, "-m", "snapshotter.runtime"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    facts = json.loads(out)
    if not isinstance(facts, dict):
        raise ValueError(f"{python} -m snapshotter.runtime printed {out[:200]!r}")
    return facts
