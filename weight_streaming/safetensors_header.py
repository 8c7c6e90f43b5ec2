"""Parse and validate a safetensors header without reading the tensor data.

A safetensors file is: 8 bytes little-endian header length N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``),
then the data region. Offsets are relative to the start of the data region.

Everything that streams or uploads weights goes through :func:`parse_header`, so a
malformed file is refused with the same message wherever it is met.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

# The format's own limit (safetensors refuses headers over 100 MB).
MAX_HEADER_BYTES = 100_000_000

# Bytes per element of each dtype the safetensors format defines.
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E4M3FNUZ": 1,
    "F8_E5M2FNUZ": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}
# Sub-byte dtypes the format defines but Thaw does not stream (sizes are in bits).
UNSUPPORTED_DTYPES = {"F4", "F6_E2M3", "F6_E3M2"}


class MalformedSafetensors(ValueError):
    """The bytes are not a valid safetensors file; the message says what is wrong."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    # Offsets relative to the start of the data region, end exclusive.
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    header_len: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_offset(self) -> int:
        """Absolute file offset where the data region starts."""
        return 8 + self.header_len

    @property
    def data_len(self) -> int:
        return max((t.end for t in self.tensors.values()), default=0)

    @property
    def file_size(self) -> int:
        return self.data_offset + self.data_len

    def summary(self) -> dict[str, object]:
        """What a manifest records about the file: dtypes, tensor and parameter counts."""
        dtypes: dict[str, int] = {}
        for t in self.tensors.values():
            dtypes[t.dtype] = dtypes.get(t.dtype, 0) + t.numel
        return {
            "tensor_count": len(self.tensors),
            "parameter_count": sum(t.numel for t in self.tensors.values()),
            "dtypes": dict(sorted(dtypes.items())),
            "data_offset": self.data_offset,
        }


def header_length(prefix: bytes, *, source: str = "file") -> int:
    """Read the 8-byte length prefix; ``source`` names the file in errors."""
    if len(prefix) < 8:
        raise MalformedSafetensors(f"{source}: file is {len(prefix)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n == 0:
        raise MalformedSafetensors(f"{source}: header length is 0")
    if n > MAX_HEADER_BYTES:
        raise MalformedSafetensors(
            f"{source}: header length {n} exceeds the safetensors limit of {MAX_HEADER_BYTES} bytes"
        )
    return n


def parse_header(
    header_bytes: bytes, *, file_size: int | None = None, source: str = "file"
) -> SafetensorsHeader:
    """Parse the JSON header (``header_bytes`` excludes the 8-byte length prefix).

    With ``file_size``, also checks that the data region is exactly covered by the
    file (no short file, no trailing garbage).
    """
    header_len = len(header_bytes)
    try:
        raw = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedSafetensors(f"{source}: header is not valid UTF-8 JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise MalformedSafetensors(f"{source}: header must be a JSON object, got {type(raw).__name__}")

    metadata_raw = raw.pop("__metadata__", {})
    if not isinstance(metadata_raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata_raw.items()
    ):
        raise MalformedSafetensors(f"{source}: __metadata__ must map strings to strings")

    tensors: dict[str, TensorInfo] = {}
    for name, spec in raw.items():
        tensors[name] = _tensor_info(name, spec, source)
    _check_layout(tensors.values(), source)

    result = SafetensorsHeader(header_len=header_len, tensors=tensors, metadata=dict(metadata_raw))
    if file_size is not None and file_size != result.file_size:
        if file_size < result.file_size:
            raise MalformedSafetensors(
                f"{source}: file is {file_size} bytes but its header describes {result.file_size} "
                "(truncated file?)"
            )
        raise MalformedSafetensors(
            f"{source}: file is {file_size} bytes but its header describes only {result.file_size}"
        )
    return result


def read_header_from_file(path: str, *, source: str | None = None) -> SafetensorsHeader:
    """Read and validate the header of a local safetensors file."""
    import os

    name = source or path
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        n = header_length(f.read(8), source=name)
        if 8 + n > size:
            raise MalformedSafetensors(f"{name}: header length {n} runs past the end of the {size}-byte file")
        return parse_header(f.read(n), file_size=size, source=name)


def _tensor_info(name: str, spec: object, source: str) -> TensorInfo:
    where = f"{source}: tensor {name!r}"
    if not isinstance(spec, dict):
        raise MalformedSafetensors(f"{where}: entry must be an object")
    dtype = spec.get("dtype")
    if dtype in UNSUPPORTED_DTYPES:
        raise MalformedSafetensors(f"{where}: sub-byte dtype {dtype} is not supported")
    if dtype not in DTYPE_SIZES:
        raise MalformedSafetensors(f"{where}: unknown dtype {dtype!r}")
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise MalformedSafetensors(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
    offsets = spec.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
    ):
        raise MalformedSafetensors(f"{where}: data_offsets must be two non-negative integers, got {offsets!r}")
    begin, end = offsets
    if end < begin:
        raise MalformedSafetensors(f"{where}: data_offsets end {end} is before begin {begin}")
    expected = math.prod(shape) * DTYPE_SIZES[dtype]
    if end - begin != expected:
        raise MalformedSafetensors(
            f"{where}: {dtype} {tuple(shape)} needs {expected} bytes but data_offsets span {end - begin}"
        )
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def _check_layout(tensors: Iterable[TensorInfo], source: str) -> None:
    """Tensors must tile the data region from 0 with no gaps or overlaps."""
    pos = 0
    for t in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if t.begin != pos:
            kind = "overlaps the previous tensor" if t.begin < pos else f"leaves a gap at byte {pos}"
            raise MalformedSafetensors(f"{source}: tensor {t.name!r} at byte {t.begin} {kind}")
        pos = t.end
