"""Snapshots in the object store: layout, manifest, upload, download, listing, removal.

Layout, in the bucket that holds the model::

    snapshots/<model>/<fingerprint>/manifest.json
    snapshots/<model>/<fingerprint>/snapshot-<sha256[:16]>.tar.gz

The archive's name carries its digest, so two workers capturing the same fingerprint
at once never overwrite each other's archive: whichever manifest lands last names
its own, complete archive. The manifest is written last, in one PUT (as model pushes
do): a snapshot without a manifest is incomplete and never restored. Removal deletes
the manifest first for the same reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import botocore.exceptions
from boto3.s3.transfer import TransferConfig
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError

from snapshotter.archive import ArchiveInfo, CorruptArchive, sha256_file
from thaw.s3client import S3Client
from thaw.s3errors import is_missing_key
from thaw.s3uri import parse_s3_uri

SNAPSHOT_FORMAT = "thaw-snapshot/1"
SNAPSHOTS_PREFIX = "snapshots"
MANIFEST_NAME = "manifest.json"
PART_SIZE = 16 * 1024 * 1024


class SnapshotStoreError(RuntimeError):
    """A snapshot in the store that cannot be read as one (bad manifest, failed upload)."""


@dataclass(frozen=True)
class SnapshotLocation:
    """Where one model's snapshot for one fingerprint lives."""

    bucket: str
    model: str
    fingerprint: str

    @classmethod
    def for_model(cls, model_uri: str, model: str, fingerprint: str) -> SnapshotLocation:
        """Snapshots live in the bucket that holds the model."""
        bucket, _ = parse_s3_uri(model_uri)
        return cls(bucket, model, fingerprint)

    @property
    def prefix(self) -> str:
        return f"{SNAPSHOTS_PREFIX}/{self.model}/{self.fingerprint}"

    @property
    def manifest_key(self) -> str:
        return f"{self.prefix}/{MANIFEST_NAME}"

    def archive_key(self, archive_name: str) -> str:
        return f"{self.prefix}/{archive_name}"

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


class ArchiveRef(BaseModel):
    model_config = ConfigDict(frozen=True)

    # Names an object next to the manifest; never a path (see archive_name).
    name: Annotated[str, Field(pattern=r"^snapshot-[0-9a-f]{16}\.tar\.gz$")]
    compression: Literal["gzip"] = "gzip"
    size: NonNegativeInt
    sha256: str


class SnapshotManifest(BaseModel):
    """``manifest.json`` of one snapshot."""

    model_config = ConfigDict(frozen=True)

    format: Literal["thaw-snapshot/1"] = "thaw-snapshot/1"
    model: str
    fingerprint: str
    # The fingerprint's inputs: a mismatch says what differs.
    inputs: dict[str, Any]
    created_at: datetime
    # Worker id, or "thaw snapshot build".
    created_by: str
    archive: ArchiveRef
    file_count: NonNegativeInt
    unpacked_bytes: NonNegativeInt
    # Top-level directories of VLLM_CACHE_ROOT in the archive (e.g. torch_compile_cache).
    cache_dirs: list[str]


def archive_name(sha256: str) -> str:
    return f"snapshot-{sha256[:16]}.tar.gz"


def read_snapshot_manifest(client: S3Client, loc: SnapshotLocation) -> SnapshotManifest | None:
    """The manifest at ``loc``, or None when there is none. Raises
    :class:`SnapshotStoreError` for one that is not a valid ``thaw-snapshot/1`` manifest."""
    try:
        obj = client.get_object(Bucket=loc.bucket, Key=loc.manifest_key)
    except botocore.exceptions.ClientError as exc:
        if is_missing_key(exc):
            return None
        raise
    try:
        return SnapshotManifest.model_validate(json.loads(obj["Body"].read()))
    except (ValueError, ValidationError) as exc:
        raise SnapshotStoreError(f"s3://{loc.bucket}/{loc.manifest_key} is not a snapshot manifest: {exc}") from None


def upload_snapshot(
    client: S3Client, loc: SnapshotLocation, info: ArchiveInfo, inputs: dict[str, Any], *,
    created_by: str, now: datetime | None = None,
) -> SnapshotManifest:
    """Upload the archive, check what the store holds, then write the manifest."""
    name = archive_name(info.sha256)
    key = loc.archive_key(name)
    transfer = TransferConfig(multipart_threshold=PART_SIZE, multipart_chunksize=PART_SIZE, max_concurrency=4)
    client.upload_file(str(info.path), loc.bucket, key, Config=transfer)
    stored = int(client.head_object(Bucket=loc.bucket, Key=key)["ContentLength"])
    if stored != info.size:
        raise SnapshotStoreError(f"s3://{loc.bucket}/{key}: stored {stored} bytes, uploaded {info.size}")
    manifest = SnapshotManifest(
        model=loc.model, fingerprint=loc.fingerprint, inputs=inputs,
        created_at=now or datetime.now(UTC), created_by=created_by,
        archive=ArchiveRef(name=name, size=info.size, sha256=info.sha256),
        file_count=info.file_count, unpacked_bytes=info.unpacked_bytes, cache_dirs=info.cache_dirs,
    )
    # One PUT, last: the snapshot appears whole or not at all.
    client.put_object(Bucket=loc.bucket, Key=loc.manifest_key, Body=manifest.model_dump_json(indent=2).encode(),
                      ContentType="application/json")
    return manifest


def download_archive(client: S3Client, loc: SnapshotLocation, manifest: SnapshotManifest, dest: Path) -> None:
    """Download the manifest's archive to ``dest`` and check its size and sha256
    (:class:`CorruptArchive` when either differs, or the archive is gone)."""
    key = loc.archive_key(manifest.archive.name)
    try:
        client.download_file(loc.bucket, key, str(dest))
    except botocore.exceptions.ClientError as exc:
        if is_missing_key(exc):
            raise CorruptArchive(f"s3://{loc.bucket}/{key} is missing") from None
        raise
    size = dest.stat().st_size
    if size != manifest.archive.size:
        raise CorruptArchive(f"s3://{loc.bucket}/{key}: {size} bytes, the manifest says {manifest.archive.size}")
    digest = sha256_file(dest)
    if digest != manifest.archive.sha256:
        raise CorruptArchive(f"s3://{loc.bucket}/{key}: sha256 {digest}, the manifest says {manifest.archive.sha256}")


@dataclass(frozen=True)
class StoredSnapshot:
    model: str
    fingerprint: str
    uri: str
    # None: objects without a manifest (an interrupted capture) or an unreadable one.
    manifest: SnapshotManifest | None
    stored_bytes: int
    problem: str | None = None


def list_snapshots(client: S3Client, bucket: str, model: str | None = None) -> list[StoredSnapshot]:
    """Every snapshot under ``snapshots/`` (of ``model`` only, if given), sorted."""
    prefix = f"{SNAPSHOTS_PREFIX}/{model}/" if model else f"{SNAPSHOTS_PREFIX}/"
    sizes: dict[tuple[str, str], int] = {}
    manifests: set[tuple[str, str]] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            parts = obj["Key"].split("/")
            if len(parts) != 4:
                continue  # not snapshots/<model>/<fingerprint>/<file>
            key = (parts[1], parts[2])
            sizes[key] = sizes.get(key, 0) + int(obj["Size"])
            if parts[3] == MANIFEST_NAME:
                manifests.add(key)
    out = []
    for m, fp in sorted(sizes):
        loc = SnapshotLocation(bucket, m, fp)
        manifest, problem = None, None
        if (m, fp) in manifests:
            try:
                manifest = read_snapshot_manifest(client, loc)
            except SnapshotStoreError as exc:
                problem = str(exc)
        else:
            problem = "no manifest (interrupted capture)"
        out.append(StoredSnapshot(m, fp, loc.uri, manifest, sizes[(m, fp)], problem))
    return out


def delete_snapshot(client: S3Client, loc: SnapshotLocation) -> int:
    """Delete everything under ``loc``, manifest first; returns the objects deleted."""
    keys = [obj["Key"] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=loc.bucket, Prefix=loc.prefix + "/") for obj in page.get("Contents", [])]
    # Without its manifest a snapshot is never restored: remove that first.
    keys.sort(key=lambda k: k != loc.manifest_key)
    for key in keys:
        client.delete_object(Bucket=loc.bucket, Key=key)
    return len(keys)
