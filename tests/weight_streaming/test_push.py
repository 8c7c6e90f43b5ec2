"""Push, manifest and listing against a real SeaweedFS store."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import pytest

from thaw.objstore import S3Endpoint
from weight_streaming.manifest import MANIFEST_NAME, PART_SIZE, expected_etag, parse_s3_uri
from weight_streaming.push import InvalidModelDir, PushError, list_models, push_model, read_manifest
from weight_streaming.safetensors_header import read_header_from_file

pytestmark = pytest.mark.integration


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_push_list_and_read_back_manifest(s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str) -> None:
    client = s3.client()
    events = []
    manifest = push_model(client, demo_model_dir, s3_prefix, progress=lambda e, sent, total: events.append((e, sent, total)))

    local = sorted(p.relative_to(demo_model_dir).as_posix() for p in demo_model_dir.rglob("*") if p.is_file())
    assert [f.path for f in manifest.files] == local
    for entry in manifest.files:
        assert entry.sha256 == _sha(demo_model_dir / entry.path)
        assert entry.size == (demo_model_dir / entry.path).stat().st_size

    header = read_header_from_file(str(demo_model_dir / "model.safetensors"))
    summary = manifest.safetensors["model.safetensors"]
    assert summary.tensor_count == len(header.tensors)
    assert summary.parameter_count == sum(t.numel for t in header.tensors.values()) > 0
    assert manifest.parameter_count == summary.parameter_count
    assert manifest.config_summary["model_type"] == "llama"
    # Every tensor's digest, computed as the file was hashed for the upload.
    from weight_streaming.tensor_check import file_digests

    assert {n: d.model_dump(mode="json") for n, d in summary.tensors.items()} == file_digests(
        str(demo_model_dir / "model.safetensors"), header)

    # Every byte arrived: the objects read back equal the local files.
    bucket, prefix = parse_s3_uri(s3_prefix)
    for entry in manifest.files:
        body = client.get_object(Bucket=bucket, Key=f"{prefix}/{entry.path}")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == entry.sha256

    # Progress reached the total, and each file reported done once.
    done = [e for e, _, _ in events if e.done]
    assert sorted(e.path for e in done) == local
    assert events[-1][1] == events[-1][2] == manifest.total_bytes

    again = read_manifest(client, s3_prefix)
    assert again == manifest

    listed = {m.uri: m for m in list_models(client, bucket)}
    assert listed[s3_prefix].complete
    assert listed[s3_prefix].manifest == manifest


def test_multipart_etag_is_verified(s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str, tmp_path: Path) -> None:
    # A file over one part is uploaded in parts; its ETag (md5 of part md5s) must match.
    model = tmp_path / "big"
    shutil.copytree(demo_model_dir, model)
    blob = model / "extra.bin"
    blob.write_bytes(bytes(range(256)) * ((PART_SIZE * 2 + 12345) // 256))
    manifest = push_model(s3.client(), model, s3_prefix, max_concurrency=4)
    entry = next(f for f in manifest.files if f.path == "extra.bin")
    assert entry.etag.endswith("-3")
    assert entry.etag == expected_etag(blob)[1]


def test_corrupt_safetensors_is_refused(s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str, tmp_path: Path) -> None:
    model = tmp_path / "bad"
    shutil.copytree(demo_model_dir, model)
    weights = model / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    raw[8 : 8 + n] = b"{" + b" " * (n - 1)  # header no longer JSON
    weights.write_bytes(bytes(raw))
    with pytest.raises(InvalidModelDir, match=r"refusing to push: model.safetensors: header is not valid UTF-8 JSON"):
        push_model(s3.client(), model, s3_prefix)
    # Nothing was uploaded: validation runs before any byte is sent.
    bucket, prefix = parse_s3_uri(s3_prefix)
    assert s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount", 0) == 0


def test_truncated_safetensors_is_refused(s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str, tmp_path: Path) -> None:
    model = tmp_path / "short"
    shutil.copytree(demo_model_dir, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(InvalidModelDir, match=r"truncated file"):
        push_model(s3.client(), model, s3_prefix)


def test_directory_without_safetensors_is_refused(s3: S3Endpoint, tmp_path: Path, s3_prefix: str) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"\0" * 10)
    with pytest.raises(InvalidModelDir, match=r"no \.safetensors files \(found pytorch_model\.bin: convert"):
        push_model(s3.client(), tmp_path, s3_prefix)


def test_interrupted_repush_leaves_no_current_manifest(
    s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str, tmp_path: Path
) -> None:
    client = s3.client()
    push_model(client, demo_model_dir, s3_prefix)
    assert read_manifest(client, s3_prefix) is not None

    class Boom(Exception):
        pass

    def fail_midway(event, sent, total):  # type: ignore[no-untyped-def]
        if event.done:
            raise Boom("connection lost")

    with pytest.raises(Boom):
        push_model(client, demo_model_dir, s3_prefix, progress=fail_midway)
    # The old manifest is gone and no new one was written: the model reads as incomplete,
    # never as a complete model whose files are a mix of two pushes.
    assert read_manifest(client, s3_prefix) is None
    bucket, _ = parse_s3_uri(s3_prefix)
    listed = {m.uri: m for m in list_models(client, bucket)}
    assert not listed[s3_prefix].complete


def test_missing_bucket_is_a_clear_error(s3: S3Endpoint, demo_model_dir: Path) -> None:
    with pytest.raises(PushError, match=r"bucket 'no-such-bucket' does not exist"):
        push_model(s3.client(), demo_model_dir, "s3://no-such-bucket/x")


def test_manifest_object_is_valid_json_with_format(s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str) -> None:
    push_model(s3.client(), demo_model_dir, s3_prefix)
    bucket, prefix = parse_s3_uri(s3_prefix)
    raw = json.loads(s3.client().get_object(Bucket=bucket, Key=f"{prefix}/{MANIFEST_NAME}")["Body"].read())
    assert raw["format"] == "thaw-manifest/1"
    assert raw["uri"] == s3_prefix
