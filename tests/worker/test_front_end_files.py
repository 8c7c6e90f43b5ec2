"""The local copy of a model's config and tokenizer files that a swap rebuilds the
front end from: fetched once per content, checked, weights left out, reused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from thaw.objstore import S3Endpoint
from weight_streaming.fetch import front_end_key
from weight_streaming.manifest import parse_s3_uri
from weight_streaming.push import push_model
from worker.front_end_files import front_end_dir, store_fetch

pytestmark = pytest.mark.integration


def test_the_files_but_the_weights_are_fetched_once_and_kept(
        s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str, tmp_path: Path) -> None:
    manifest = push_model(s3.client(), demo_model_dir, s3_prefix)
    root = tmp_path / "model-files"
    got = asyncio.run(front_end_dir(root, store_fetch(s3.client), s3_prefix, manifest))
    assert got == str(root / front_end_key(manifest))
    names = {p.name for p in Path(got).iterdir()}
    assert "config.json" in names and "tokenizer_config.json" in names
    assert not any(n.endswith(".safetensors") for n in names)
    for f in manifest.files:
        if not f.path.endswith(".safetensors"):
            assert (Path(got) / f.path).read_bytes() == (demo_model_dir / f.path).read_bytes()

    # The same files under another prefix are the same copy, read without the store.
    bucket, prefix = parse_s3_uri(s3_prefix)
    for f in manifest.files:
        s3.client().delete_object(Bucket=bucket, Key=f"{prefix}/{f.path}")
    assert asyncio.run(front_end_dir(root, store_fetch(s3.client), s3_prefix, manifest)) == got


def test_files_that_cannot_be_had_leave_it_to_the_engine_host(
        s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str, tmp_path: Path) -> None:
    manifest = push_model(s3.client(), demo_model_dir, s3_prefix)
    bucket, prefix = parse_s3_uri(s3_prefix)
    s3.client().delete_object(Bucket=bucket, Key=f"{prefix}/config.json")
    assert asyncio.run(front_end_dir(tmp_path / "m", store_fetch(s3.client), s3_prefix, manifest)) is None
    assert asyncio.run(front_end_dir(tmp_path / "m", store_fetch(s3.client), s3_prefix, object())) is None  # no manifest
    assert list((tmp_path / "m").iterdir()) == []  # no half-fetched copy left
