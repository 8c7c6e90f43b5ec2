"""Per-tensor digests: recorded at push from the file's bytes, checked on the tensors a
load hands over; any difference names the tensor."""

from __future__ import annotations

import hashlib
import zlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.weight_streaming.support import random_tensor, raw_bytes
from weight_streaming.manifest import FileEntry, TensorDigest, build_manifest, expected_etag
from weight_streaming.safetensors_header import read_header_from_file
from weight_streaming.streamer import load_many
from weight_streaming.tensor_check import (
    TensorCrcs,
    TensorMismatch,
    check_tensors,
    crc32_of,
    file_digests,
)


def _write(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    tensors = {"a.weight": random_tensor(torch.bfloat16, (64, 48), gen),
               "b.bias": random_tensor(torch.float32, (48,), gen),
               "c.scale": random_tensor(torch.int8, (), gen),
               "d.empty": torch.empty((0, 4), dtype=torch.float16)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    return path, tensors


def _digests(path: Path) -> dict[str, TensorDigest]:
    return {n: TensorDigest.model_validate(d) for n, d in file_digests(str(path), read_header_from_file(str(path))).items()}


def test_digests_are_the_crc32_of_each_tensors_bytes(tmp_path: Path) -> None:
    path, tensors = _write(tmp_path)
    digests = _digests(path)
    assert set(digests) == set(tensors)
    for name, t in tensors.items():
        assert digests[name].crc32 == zlib.crc32(raw_bytes(t)) == crc32_of(t)
        assert digests[name].shape == tuple(t.shape)
    assert digests["a.weight"].dtype == "BF16" and digests["c.scale"].dtype == "I8"


def test_a_loaded_file_passes_and_a_flipped_byte_names_its_tensor(tmp_path: Path) -> None:
    path, _ = _write(tmp_path)
    digests = _digests(path)
    loaded = load_many([str(path)]).tensors
    check_tensors(loaded, digests, "model.safetensors", threads=2)
    loaded["b.bias"].view(torch.uint8)[5] ^= 0x10  # one bit, in memory after the load
    with pytest.raises(TensorMismatch, match=r"model.safetensors: tensor 'b.bias' does not match the manifest "
                                             r"\(CRC-32 [0-9a-f]{8}, expected [0-9a-f]{8}\)") as info:
        check_tensors(loaded, digests, "model.safetensors")
    assert info.value.name == "b.bias"


@pytest.mark.parametrize("change, message", [
    (lambda ts: ts.update({"z.extra": torch.zeros(2)}), "tensor 'z.extra' is not in the model's manifest"),
    (lambda ts: ts.update({"a.weight": ts["a.weight"][:-1]}),
     r"tensor 'a.weight' is BF16 \[63, 48\], the manifest says BF16 \[64, 48\]"),
    (lambda ts: ts.update({"a.weight": ts["a.weight"].view(torch.float16)}),
     r"tensor 'a.weight' is F16 \[64, 48\], the manifest says BF16 \[64, 48\]"),
    (lambda ts: ts.pop("b.bias"), "the manifest lists tensors the file does not hold: b.bias"),
])
def test_another_name_shape_or_dtype_is_refused(tmp_path: Path, change, message: str) -> None:  # type: ignore[no-untyped-def]
    path, _ = _write(tmp_path)
    loaded = load_many([str(path)]).tensors
    change(loaded)
    with pytest.raises(TensorMismatch, match=message):
        check_tensors(loaded, _digests(path), "f")


def test_the_manifest_records_every_tensor(tmp_path: Path) -> None:
    path, tensors = _write(tmp_path)
    entry = FileEntry(path=path.name, size=path.stat().st_size, sha256="0" * 64, etag="x")
    manifest = build_manifest(tmp_path, "s3://b/m", [entry])
    digests = manifest.safetensors[path.name].tensors
    assert set(digests) == set(tensors) and digests == _digests(path)
    # A manifest written before digests were recorded still reads (no tensors).
    old = manifest.model_dump(mode="json")
    del old["safetensors"][path.name]["tensors"]
    assert type(manifest).model_validate(old).safetensors[path.name].tensors == {}


@pytest.mark.parametrize("chunk", [1, 7, 100, 1 << 20])
def test_crcs_fed_in_chunks_of_any_size_equal_the_whole_files(tmp_path: Path, chunk: int) -> None:
    # thaw push feeds them as it hashes the file, in parts; the manifest must not differ.
    path, _ = _write(tmp_path)
    data = path.read_bytes()
    crcs = TensorCrcs(read_header_from_file(str(path)))
    for off in range(0, len(data), chunk):
        crcs.update(off, data[off: off + chunk])
    assert crcs.digests() == file_digests(str(path), read_header_from_file(str(path)))
    sha, _ = expected_etag(path, part_size=4096, crcs=TensorCrcs(read_header_from_file(str(path))))
    assert sha == hashlib.sha256(data).hexdigest()

