"""The demo model's weights: deterministic bf16 tensors streamed into safetensors files
(a small writer of its own, so a multi-GiB model never has to fit in memory), and the
files of a model directory written atomically with their sha256.

Weights come from NumPy's PCG64 raw bit stream (stable across NumPy releases by NEP
19), one stream per tensor keyed by its name, not from torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

BYTES_PER_PARAM = 2
INIT_STD = 0.02
# A single file up to this many bytes of tensor data; above it, shards of at
# most this size (a tensor larger than the limit gets a shard of its own).
MAX_SHARD_BYTES = 2 * 1024**3
# Elements generated per step when writing a tensor: bounds memory (~50 MB of
# temporaries) independently of the model size.
_CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class DemoFile:
    """One file of a demo model directory; ``sha256`` is None when not computed."""

    name: str
    size_bytes: int
    sha256: str | None = None


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (round to nearest, ties to even) and return the uint16 bits.

    Inputs are finite by construction (no NaN handling needed).
    """
    bits = x.astype("<f4", copy=False).view("<u4")
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype("<u2")


def _tensor_rng(name: str, seed: int) -> np.random.Generator:
    # One stream per tensor, keyed by name, so a tensor's values do not depend
    # on which other tensors exist or in which order they are written.
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _uniform_chunks(name: str, n: int, seed: int) -> Iterator[np.ndarray]:
    """float32 chunks of a uniform(-a, a) stream with std INIT_STD, from PCG64 raw bits.

    ``random_raw`` is the bit generator's raw output, which NumPy keeps stable
    across releases; the distribution methods carry no such promise.
    """
    bitgen = _tensor_rng(name, seed).bit_generator
    half_width = INIT_STD * math.sqrt(3.0)
    scale = np.float32(half_width / 2**23)
    done = 0
    while done < n:
        count = min(_CHUNK_ELEMENTS, n - done)
        raw = np.asarray(bitgen.random_raw((count + 1) // 2), dtype="<u8")
        words = raw.view("<u4")[:count]  # two 32-bit words per draw, low word first
        top24 = (words >> np.uint32(8)).astype(np.float32)  # exact: < 2**24
        yield (top24 - np.float32(2**23 - 0.5)) * scale
        done += count


def _tensor_bytes(name: str, shape: tuple[int, ...], seed: int) -> Iterator[bytes]:
    """The little-endian bf16 bytes of one tensor, in chunks."""
    n = math.prod(shape)
    if len(shape) == 1:  # RMSNorm weights start at 1.0
        yield float32_to_bf16_bits(np.ones(n, dtype=np.float32)).tobytes()
        return
    for chunk in _uniform_chunks(name, n, seed):
        yield float32_to_bf16_bits(chunk).tobytes()


def _safetensors_header(names: Sequence[str], shapes: dict[str, tuple[int, ...]]) -> bytes:
    """The 8-byte length plus JSON header for ``names`` laid out in that order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        nbytes = math.prod(shapes[name]) * BYTES_PER_PARAM
        header[name] = {
            "dtype": "BF16",
            "shape": list(shapes[name]),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)  # data starts 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(body)) + body


def write_safetensors(
    path: Path, names: list[str], shapes: dict[str, tuple[int, ...]], seed: int
) -> DemoFile:
    """Stream one safetensors file (tensors sorted by name) and return its size and sha256."""
    names = sorted(names)
    digest = hashlib.sha256()
    size = 0
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        for block in _iter_file_blocks(names, shapes, seed):
            f.write(block)
            digest.update(block)
            size += len(block)
    os.replace(tmp, path)
    return DemoFile(path.name, size, digest.hexdigest())


def _iter_file_blocks(
    names: list[str], shapes: dict[str, tuple[int, ...]], seed: int
) -> Iterator[bytes]:
    yield _safetensors_header(names, shapes)
    for name in names:
        yield from _tensor_bytes(name, shapes[name], seed)


def plan_shards(shapes: dict[str, tuple[int, ...]]) -> list[list[str]]:
    """Group tensors (in module order) into files of at most MAX_SHARD_BYTES each."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * BYTES_PER_PARAM
        if shards[-1] and used + nbytes > MAX_SHARD_BYTES:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    return shards


def read_safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """The JSON header of a safetensors file (tensor name -> dtype/shape/offsets), without ``__metadata__``."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def write_text(path: Path, text: str) -> DemoFile:
    data = text.encode("utf-8")
    tmp = path.with_name(path.name + ".partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return DemoFile(path.name, len(data), hashlib.sha256(data).hexdigest())


def json_text(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
