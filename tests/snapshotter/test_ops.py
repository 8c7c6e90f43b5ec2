"""Restore and capture against the real store (SeaweedFS): every way a snapshot can be unusable."""

from __future__ import annotations

import io
import json
import tarfile
import threading
from pathlib import Path

import pytest

from snapshotter.archive import ArchiveInfo, sha256_file
from snapshotter.fingerprint import Fingerprint, fingerprint_inputs, fingerprint_of
from snapshotter.ops import CaptureStatus, RestoreStatus, capture_snapshot, restore_snapshot
from snapshotter.runtime import detect
from snapshotter.store import (
    SnapshotLocation,
    archive_name,
    delete_snapshot,
    list_snapshots,
    read_snapshot_manifest,
    upload_snapshot,
)
from tests.snapshotter.support import make_cache
from thaw.config import EngineArgs
from thaw.embedded_store import free_port
from thaw.objstore import S3Endpoint

pytestmark = pytest.mark.integration


@pytest.fixture
def fp() -> Fingerprint:
    return fingerprint_of(fingerprint_inputs(
        runtime=detect(), model_uri="s3://thaw-test/models/demo", model_config_sha256="c" * 64,
        engine=EngineArgs(), max_model_len=512, engine_assets_dir="/tmp/thaw-vllm-assets",
    ))


@pytest.fixture
def loc(fp: Fingerprint) -> SnapshotLocation:
    # A model name of its own per test: tests never see each other's snapshots.
    return SnapshotLocation("thaw-test", f"m{free_port()}", fp.id)


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def captured(s3: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, tmp_path: Path) -> dict[str, bytes]:
    src = tmp_path / "src"
    files = make_cache(src)
    result = capture_snapshot(s3.client(), loc, fp, src, tmp_path / "work", created_by="w1", replace=False)
    assert result.status is CaptureStatus.UPLOADED and result.bytes
    return files


def test_capture_then_restore_on_a_fresh_cache_root(
    s3: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, tmp_path: Path
) -> None:
    files = captured(s3, loc, fp, tmp_path)
    c = s3.client()
    manifest = read_snapshot_manifest(c, loc)
    assert manifest is not None
    assert manifest.format == "thaw-snapshot/1" and manifest.fingerprint == fp.id and manifest.inputs == fp.inputs
    assert manifest.model == loc.model and manifest.created_by == "w1"
    assert manifest.cache_dirs == ["modelinfos", "torch_compile_cache"] and manifest.file_count == len(files)
    assert manifest.archive.name == archive_name(manifest.archive.sha256)
    # Work files are gone.
    assert not any((tmp_path / "work").iterdir())

    root = tmp_path / "fresh" / "vllm-cache"
    result = restore_snapshot(c, loc, fp, root, tmp_path / "work")
    assert result.status is RestoreStatus.RESTORED, result.reason
    assert result.bytes == manifest.archive.size and result.files == len(files)
    assert files_under(root) == files
    assert not any((tmp_path / "work").iterdir())

    # A second capture of the same fingerprint finds the first one.
    again = capture_snapshot(c, loc, fp, tmp_path / "src", tmp_path / "work", created_by="w2", replace=False)
    assert again.status is CaptureStatus.EXISTS
    assert read_snapshot_manifest(c, loc).created_by == "w1"  # type: ignore[union-attr]


def test_no_snapshot_is_missing(s3: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, tmp_path: Path) -> None:
    result = restore_snapshot(s3.client(), loc, fp, tmp_path / "root", tmp_path / "work")
    assert result.status is RestoreStatus.MISSING and loc.uri in (result.reason or "")
    assert not (tmp_path / "root").exists()


def _put_manifest(s3: S3Endpoint, loc: SnapshotLocation, change: dict) -> None:
    c = s3.client()
    body = json.loads(c.get_object(Bucket=loc.bucket, Key=loc.manifest_key)["Body"].read())
    for key, value in change.items():
        target = body
        *path, last = key.split(".")
        for p in path:
            target = target[p]
        target[last] = value
    c.put_object(Bucket=loc.bucket, Key=loc.manifest_key, Body=json.dumps(body).encode())


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"inputs.torch": "2.99.0+cpu"}, "torch"),
        ({"inputs.cpu_isa": ["avx2"]}, "cpu_isa"),
        ({"fingerprint": "0123456789abcdef"}, "fingerprint"),
    ],
    ids=["torch-version", "cpu-isa", "fingerprint-id"],
)
def test_a_manifest_for_other_inputs_is_skipped_and_says_what_differs(
    s3: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, tmp_path: Path, change: dict, named: str
) -> None:
    captured(s3, loc, fp, tmp_path)
    _put_manifest(s3, loc, change)
    result = restore_snapshot(s3.client(), loc, fp, tmp_path / "root", tmp_path / "work")
    assert result.status is RestoreStatus.SKIPPED_MISMATCH
    assert f"{named}: " in (result.reason or ""), result.reason
    assert not (tmp_path / "root").exists()


def test_an_archive_that_is_not_what_the_manifest_says_is_skipped(
    s3: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, tmp_path: Path
) -> None:
    captured(s3, loc, fp, tmp_path)
    c = s3.client()
    manifest = read_snapshot_manifest(c, loc)
    assert manifest is not None
    key = loc.archive_key(manifest.archive.name)
    data = bytearray(c.get_object(Bucket=loc.bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0xFF  # same size, one byte off
    c.put_object(Bucket=loc.bucket, Key=key, Body=bytes(data))
    result = restore_snapshot(c, loc, fp, tmp_path / "root", tmp_path / "work")
    assert result.status is RestoreStatus.SKIPPED_CORRUPT and "sha256" in (result.reason or "")
    assert not (tmp_path / "root").exists()
    assert not any((tmp_path / "work").iterdir())

    c.delete_object(Bucket=loc.bucket, Key=key)
    result = restore_snapshot(c, loc, fp, tmp_path / "root", tmp_path / "work")
    assert result.status is RestoreStatus.SKIPPED_CORRUPT and "missing" in (result.reason or "")


def test_a_manifest_that_is_not_one_is_corrupt(
    s3: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, tmp_path: Path
) -> None:
    s3.client().put_object(Bucket=loc.bucket, Key=loc.manifest_key, Body=b"{not json")
    result = restore_snapshot(s3.client(), loc, fp, tmp_path / "root", tmp_path / "work")
    assert result.status is RestoreStatus.SKIPPED_CORRUPT and "not a snapshot manifest" in (result.reason or "")
    # A capture replaces it.
    captured(s3, loc, fp, tmp_path)
    assert read_snapshot_manifest(s3.client(), loc) is not None


def test_an_unsafe_archive_with_a_matching_digest_is_refused(
    s3: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, tmp_path: Path
) -> None:
    # Whoever can write the manifest can make the digest match: the members are checked too.
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        m = tarfile.TarInfo("torch_compile_cache/../../../escaped")
        m.size = 4
        tf.addfile(m, io.BytesIO(b"evil"))
    upload_snapshot(s3.client(), loc, ArchiveInfo(archive, archive.stat().st_size, sha256_file(archive), 1, 4,
                                                  ["torch_compile_cache"]), fp.inputs, created_by="mallory")
    result = restore_snapshot(s3.client(), loc, fp, tmp_path / "a" / "b" / "root", tmp_path / "work")
    assert result.status is RestoreStatus.SKIPPED_CORRUPT and "leaves the destination" in (result.reason or "")
    assert not list(tmp_path.rglob("escaped"))
    assert not (tmp_path / "a" / "b" / "root").exists()


def test_a_warm_local_cache_is_kept_and_nothing_is_downloaded(
    s3: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, tmp_path: Path
) -> None:
    captured(s3, loc, fp, tmp_path)
    root = tmp_path / "root"
    (root / "torch_compile_cache" / "x").mkdir(parents=True)
    (root / "torch_compile_cache" / "x" / "mine").write_text("local")
    result = restore_snapshot(s3.client(), loc, fp, root, tmp_path / "work")
    assert result.status is RestoreStatus.LOCAL and result.bytes is None
    assert files_under(root) == {"torch_compile_cache/x/mine": b"local"}


def test_restore_adds_to_a_cache_root_without_replacing_its_entries(
    s3: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, tmp_path: Path
) -> None:
    files = captured(s3, loc, fp, tmp_path)
    root = tmp_path / "root"
    (root / "modelinfos").mkdir(parents=True)
    (root / "modelinfos" / "ours.json").write_text("ours")
    # Left by a start that failed early: no cache files, only a lock.
    (root / "torch_compile_cache" / "locks").mkdir(parents=True)
    (root / "torch_compile_cache" / "locks" / "x.lock").write_text("")
    result = restore_snapshot(s3.client(), loc, fp, root, tmp_path / "work")
    assert result.status is RestoreStatus.RESTORED
    got = files_under(root)
    assert got["modelinfos/ours.json"] == b"ours"
    assert {k: v for k, v in got.items() if k.startswith("torch_compile_cache/")} == {
        k: v for k, v in files.items() if k.startswith("torch_compile_cache/")}


def test_a_cancelled_restore_leaves_the_cache_root_alone(
    s3: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, tmp_path: Path
) -> None:
    captured(s3, loc, fp, tmp_path)
    cancelled = threading.Event()
    cancelled.set()
    result = restore_snapshot(s3.client(), loc, fp, tmp_path / "root", tmp_path / "work", cancelled=cancelled)
    assert result.status is RestoreStatus.SKIPPED_ERROR and result.reason == "cancelled"
    assert not (tmp_path / "root").exists() and not any((tmp_path / "work").iterdir())


def test_list_and_delete(s3: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, tmp_path: Path) -> None:
    captured(s3, loc, fp, tmp_path)
    c = s3.client()
    # An interrupted capture: an archive without a manifest.
    other = SnapshotLocation(loc.bucket, loc.model, "f" * 16)
    c.put_object(Bucket=loc.bucket, Key=other.archive_key("snapshot-" + "0" * 16 + ".tar.gz"), Body=b"x")
    listed = {s.fingerprint: s for s in list_snapshots(c, loc.bucket, loc.model)}
    assert set(listed) == {fp.id, "f" * 16}
    assert listed[fp.id].manifest is not None and listed[fp.id].problem is None
    assert listed["f" * 16].manifest is None and "no manifest" in (listed["f" * 16].problem or "")
    assert delete_snapshot(c, loc) == 2
    assert read_snapshot_manifest(c, loc) is None
    assert [s.fingerprint for s in list_snapshots(c, loc.bucket, loc.model)] == ["f" * 16]
