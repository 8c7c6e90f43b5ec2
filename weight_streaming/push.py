"""Upload a model directory to the store and list what the store holds.

Order of a push, so that a reader never sees a half-pushed model as complete:
validate every local file (safetensors headers included) → remove the current
manifest → upload the files (multipart, parallel) → check each object's size and
ETag against the local bytes → write the manifest in one PUT.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import botocore.exceptions
from boto3.s3.transfer import TransferConfig

from thaw.objstore import read_json_object
from thaw.s3client import S3Client
from thaw.s3errors import S3Failure, classify, error_code, error_message
from thaw.s3uri import S3UriError, check_key_path, check_uri
from weight_streaming.manifest import (
    MANIFEST_NAME,
    PART_SIZE,
    FileEntry,
    Manifest,
    build_manifest,
    expected_etag,
    join_key,
    model_files,
    parse_s3_uri,
)
from weight_streaming.safetensors_header import MalformedSafetensors, read_header_from_file
from weight_streaming.tensor_check import TensorCrcs


class PushError(RuntimeError):
    """A push that was refused or failed; the message says why and what to do."""


class InvalidModelDir(PushError):
    """The local directory must not be pushed (no safetensors, malformed header, ...)."""


@dataclass(frozen=True)
class FileProgress:
    """One file finished (``done``) or some bytes of it sent."""

    path: str
    size: int
    bytes_sent: int
    done: bool
    seconds: float


ProgressFn = Callable[[FileProgress, int, int], None]  # (event, total bytes sent, total bytes)


def validate_model_dir(model_dir: Path) -> list[Path]:
    """The files to push; raises PushError for a directory that must not be pushed."""
    if not model_dir.is_dir():
        raise InvalidModelDir(f"{model_dir} is not a directory")
    files = model_files(model_dir)
    for p in files:
        rel = p.relative_to(model_dir).as_posix()
        try:
            check_key_path(rel, what=f"file {rel!r}")
        except S3UriError as exc:
            raise InvalidModelDir(f"refusing to push: {exc}; rename it") from None
    weights = [p for p in files if p.suffix == ".safetensors"]
    if not weights:
        other = [p for p in files if p.suffix in (".bin", ".pt", ".pth", ".gguf")]
        hint = f" (found {', '.join(p.name for p in other[:3])}: convert to safetensors first)" if other else ""
        raise InvalidModelDir(f"{model_dir} has no .safetensors files{hint}; Thaw serves safetensors weights only")
    for p in weights:
        try:
            read_header_from_file(str(p), source=str(p.relative_to(model_dir)))
        except MalformedSafetensors as exc:
            raise InvalidModelDir(f"refusing to push: {exc}") from None
    if not (model_dir / "config.json").exists() and not (model_dir / "adapter_config.json").exists():
        raise InvalidModelDir(f"{model_dir} has no config.json (a model: the engine needs it to build the "
                              "model) nor adapter_config.json (a LoRA adapter)")
    return files


def push_model(
    client: S3Client,
    model_dir: Path,
    uri: str,
    *,
    max_concurrency: int = 8,
    progress: ProgressFn | None = None,
) -> Manifest:
    """Push ``model_dir`` to ``uri`` (``s3://bucket/prefix``) and return the manifest written."""
    model_dir = Path(model_dir)
    bucket, prefix = parse_s3_uri(check_uri(uri))
    files = validate_model_dir(model_dir)
    rels = [p.relative_to(model_dir).as_posix() for p in files]
    sizes = {rel: p.stat().st_size for rel, p in zip(rels, files, strict=True)}
    total = sum(sizes.values())
    manifest_key = join_key(prefix, MANIFEST_NAME)

    try:
        client.delete_object(Bucket=bucket, Key=manifest_key)
    except botocore.exceptions.ClientError as exc:
        raise PushError(_s3_message(exc, bucket, manifest_key)) from None

    transfer = TransferConfig(
        multipart_threshold=PART_SIZE, multipart_chunksize=PART_SIZE,
        max_concurrency=max_concurrency, use_threads=True,
    )
    lock = threading.Lock()
    sent_total = 0
    # Per safetensors file, its tensors' digests (each file's thread writes its own key).
    digests: dict[str, dict[str, Any]] = {}

    def upload(rel: str) -> FileEntry:
        nonlocal sent_total
        path = model_dir / rel
        start = time.monotonic()
        sent = 0

        def on_bytes(n: int) -> None:
            nonlocal sent, sent_total
            with lock:
                sent += n
                sent_total += n
                if progress:
                    progress(FileProgress(rel, sizes[rel], sent, False, time.monotonic() - start), sent_total, total)

        # Hash before sending: the stored object is checked against these bytes (and
        # each tensor's CRC-32 for the manifest, in the same pass).
        crcs = TensorCrcs(read_header_from_file(str(path), source=rel)) if rel.endswith(".safetensors") else None
        sha, etag = expected_etag(path, crcs=crcs)
        if crcs is not None:
            digests[rel] = crcs.digests()
        key = join_key(prefix, rel)
        try:
            client.upload_file(str(path), bucket, key, Callback=on_bytes, Config=transfer)
            head = client.head_object(Bucket=bucket, Key=key)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise PushError(_s3_message(exc, bucket, key)) from None
        got_size, got_etag = int(head["ContentLength"]), head["ETag"].strip('"')
        if got_size != sizes[rel]:
            raise PushError(f"s3://{bucket}/{key}: stored {got_size} bytes, expected {sizes[rel]}")
        if got_etag != etag:
            raise PushError(f"s3://{bucket}/{key}: ETag {got_etag} does not match the local file ({etag})")
        entry = FileEntry(path=rel, size=sizes[rel], sha256=sha, etag=etag)
        if progress:
            with lock:
                progress(FileProgress(rel, sizes[rel], sizes[rel], True, time.monotonic() - start), sent_total, total)
        return entry

    # Files in parallel; each large file is also split into parallel parts.
    with ThreadPoolExecutor(max_workers=min(4, len(rels))) as pool:
        entries = list(pool.map(upload, rels))

    manifest = build_manifest(model_dir, f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}", entries,
                              digests=digests)
    body = manifest.model_dump_json(indent=2).encode()
    try:
        # One PUT: the manifest appears whole or not at all.
        client.put_object(Bucket=bucket, Key=manifest_key, Body=body, ContentType="application/json")
    except botocore.exceptions.ClientError as exc:
        raise PushError(_s3_message(exc, bucket, manifest_key)) from None
    return manifest


def read_manifest(client: S3Client, uri: str) -> Manifest | None:
    """The manifest at ``uri``, or None when the prefix has none (absent or interrupted push)."""
    body = read_json_object(client, uri, MANIFEST_NAME)
    return None if body is None else Manifest.model_validate(body)


@dataclass(frozen=True)
class StoredModel:
    uri: str
    manifest: Manifest | None
    # Bytes under the prefix (all objects, manifest excluded).
    stored_bytes: int

    @property
    def complete(self) -> bool:
        return self.manifest is not None


def list_models(client: S3Client, bucket: str) -> list[StoredModel]:
    """Every model prefix in ``bucket``: those with a manifest, and incomplete pushes
    (safetensors without a manifest), sorted by URI."""
    by_prefix: dict[str, int] = {}
    with_weights: set[str] = set()
    with_manifest: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            key: str = obj["Key"]
            prefix, _, name = key.rpartition("/")
            if name == MANIFEST_NAME:
                with_manifest.add(prefix)
                continue
            if name.endswith(".safetensors"):
                with_weights.add(prefix)
            by_prefix[prefix] = by_prefix.get(prefix, 0) + int(obj["Size"])
    # Weights in a sub-folder of a complete model (e.g. original/) belong to it.
    orphans = {
        p for p in with_weights
        if not any(p == m or p.startswith(m + "/") or not m for m in with_manifest)
    }
    result = []
    for prefix in sorted(with_manifest | orphans):
        uri = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        manifest = read_manifest(client, uri) if prefix in with_manifest else None
        # Sub-folders of a model (e.g. original/) count towards it.
        stored = sum(v for k, v in by_prefix.items() if k == prefix or k.startswith(prefix + "/"))
        result.append(StoredModel(uri=uri, manifest=manifest, stored_bytes=stored))
    return result


def _s3_message(exc: Exception, bucket: str, key: str) -> str:
    kind = classify(exc)
    if kind is S3Failure.NO_BUCKET:
        return f"bucket {bucket!r} does not exist (is the store up? `thaw store up` creates it)"
    if kind is S3Failure.DENIED:
        return f"s3://{bucket}/{key}: access denied ({error_code(exc)}); check the store credentials"
    if kind is not None:
        return f"s3://{bucket}/{key}: {error_code(exc)}: {error_message(exc)}"
    return f"s3://{bucket}/{key}: {exc}"
