"""Fetch a small pushed model (a LoRA adapter) whole into a local directory.

An adapter is a few MiB that vLLM reads from a local path, not weights streamed into
device memory: the worker downloads every file its manifest lists, checks each
against the manifest's size and sha256, and only then moves the directory into place.
A prefix without a manifest (never pushed, or an interrupted push) is refused.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from weight_streaming.manifest import join_key, parse_s3_uri
from weight_streaming.push import read_manifest

CHUNK = 1 << 20


class FetchError(Exception):
    """The files could not be fetched whole and intact (the message says which and why)."""


def fetch_model_files(client: Any, uri: str, dest: Path) -> Path:
    """Every file of the pushed model at ``uri`` in ``dest`` (created; an existing
    complete ``dest`` is kept as is). Blocking: run it in a thread."""
    if (dest / ".complete").exists():
        return dest
    manifest = read_manifest(client, uri)
    if manifest is None:
        raise FetchError(f"no thaw-manifest.json at {uri} (not pushed, or the push was interrupted)")
    bucket, prefix = parse_s3_uri(uri)
    staging = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}")
    staging.mkdir(parents=True)
    try:
        for entry in manifest.files:
            target = staging / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            digest, size = hashlib.sha256(), 0
            body = client.get_object(Bucket=bucket, Key=join_key(prefix, entry.path))["Body"]
            with open(target, "wb") as f:
                while chunk := body.read(CHUNK):
                    f.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
            if size != entry.size or digest.hexdigest() != entry.sha256:
                raise FetchError(f"{uri}/{entry.path} does not match the manifest (size {size} of {entry.size}, "
                                 f"sha256 {digest.hexdigest()[:12]}... of {entry.sha256[:12]}...)")
        (staging / ".complete").touch()
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest
