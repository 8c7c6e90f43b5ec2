"""The manifest Thaw writes next to a model in the store.

``s3://bucket/prefix/thaw-manifest.json`` lists every file of the model (size,
sha256, the S3 ETag it must have) and summarises each safetensors header. It is
written last, in one PUT, by `thaw push`: a model with a manifest is complete; a
prefix without one is an interrupted push and is never served.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, NonNegativeInt

from thaw.objstore import MANIFEST_NAME
from thaw.s3uri import S3UriError, check_key_path, join_key, parse_s3_uri
from weight_streaming.safetensors_header import read_header_from_file
from weight_streaming.tensor_check import TensorCrcs, file_digests

__all__ = ["MANIFEST_NAME", "S3UriError", "join_key", "parse_s3_uri"]  # re-exported for the loaders

MANIFEST_FORMAT: Literal["thaw-manifest/1"] = "thaw-manifest/1"
# Multipart part size used for uploads; the expected ETag depends on it.
PART_SIZE = 16 * 1024 * 1024


def _relative_path(path: str) -> str:
    check_key_path(path, what=f"file path {path!r}")
    return path


# A manifest is read from the store: its file names are joined to the model's prefix
# (and by the caches to local names), so one like "../other/x" or "/etc/x" is refused.
RelativePath = Annotated[str, AfterValidator(_relative_path)]


class FileEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: RelativePath
    size: NonNegativeInt
    sha256: str
    # What S3 must report for this object when uploaded with PART_SIZE parts.
    etag: str


class TensorDigest(BaseModel):
    """One tensor of a safetensors file as pushed: what a load must hand the engine."""

    model_config = ConfigDict(frozen=True)

    dtype: str
    shape: tuple[NonNegativeInt, ...]
    # zlib's CRC-32 of the tensor's bytes (weight_streaming.tensor_check): cheap enough
    # to check on every swap, where the file's sha256 is checked when a copy is made.
    crc32: NonNegativeInt


class SafetensorsSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    tensor_count: NonNegativeInt
    parameter_count: NonNegativeInt
    # Parameters per dtype, e.g. {"BF16": 1234}.
    dtypes: dict[str, NonNegativeInt]
    data_offset: NonNegativeInt
    # Every tensor by name (empty in manifests pushed before digests were recorded).
    tensors: dict[str, TensorDigest] = Field(default_factory=dict)


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True)

    format: Literal["thaw-manifest/1"] = MANIFEST_FORMAT
    uri: str
    created_at: datetime
    files: list[FileEntry]
    safetensors: dict[str, SafetensorsSummary]
    parameter_count: NonNegativeInt
    total_bytes: NonNegativeInt
    # A few fields of config.json, when present (architecture, sizes, context).
    config_summary: dict[str, object] = Field(default_factory=dict)

    @property
    def dtypes(self) -> list[str]:
        return sorted({d for s in self.safetensors.values() for d in s.dtypes})


def expected_etag(path: Path, part_size: int = PART_SIZE, crcs: TensorCrcs | None = None) -> tuple[str, str]:
    """(sha256 hex, S3 ETag) of a file, reading it once; ``crcs``: a safetensors file's
    per-tensor CRC-32s, fed in the same pass.

    A single-part upload's ETag is the MD5 of the object; a multipart upload's is
    the MD5 of the concatenated part MD5s, followed by ``-<parts>``.
    """
    sha = hashlib.sha256()
    whole = hashlib.md5(usedforsecurity=False)
    part_digests: list[bytes] = []
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(part_size):
            if crcs is not None:
                crcs.update(size, chunk)
            sha.update(chunk)
            whole.update(chunk)
            part_digests.append(hashlib.md5(chunk, usedforsecurity=False).digest())
            size += len(chunk)
    if size < part_size or len(part_digests) <= 1:
        etag = whole.hexdigest()
    else:
        etag = hashlib.md5(b"".join(part_digests), usedforsecurity=False).hexdigest() + f"-{len(part_digests)}"
    return sha.hexdigest(), etag


_CONFIG_KEYS = (
    "architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "intermediate_size", "vocab_size", "max_position_embeddings", "torch_dtype",
    "dtype",
)


def model_files(model_dir: Path) -> list[Path]:
    """The files of a Hugging Face-style model directory that belong in the store."""
    return sorted(
        p for p in model_dir.rglob("*")
        if p.is_file() and p.name != MANIFEST_NAME and not any(part.startswith(".") for part in p.relative_to(model_dir).parts)
    )


def build_manifest(
    model_dir: Path, uri: str, files: list[FileEntry], now: datetime | None = None,
    digests: Mapping[str, dict[str, Any]] | None = None,
) -> Manifest:
    """Build the manifest from already-hashed files; headers are re-read (cheap).
    ``digests``: per file path, its tensors' digests as hashed (``TensorCrcs``); a file
    without them is read once more for its CRC-32s."""
    summaries: dict[str, SafetensorsSummary] = {}
    for entry in files:
        if entry.path.endswith(".safetensors"):
            path = str(model_dir / entry.path)
            header = read_header_from_file(path, source=entry.path)
            tensors = (digests or {}).get(entry.path)
            summaries[entry.path] = SafetensorsSummary.model_validate(
                {**header.summary(), "tensors": tensors if tensors is not None else file_digests(path, header)})
    config_summary: dict[str, object] = {}
    config_path = model_dir / "config.json"
    if config_path.exists():
        try:
            raw = json.loads(config_path.read_text())
            config_summary = {k: raw[k] for k in _CONFIG_KEYS if k in raw}
        except (json.JSONDecodeError, OSError):
            config_summary = {}
    return Manifest(
        uri=uri,
        created_at=now or datetime.now(UTC),
        files=files,
        safetensors=summaries,
        parameter_count=sum(s.parameter_count for s in summaries.values()),
        total_bytes=sum(f.size for f in files),
        config_summary=config_summary,
    )
