"""Fetch a small pushed model (a LoRA adapter), or a model's files other than its
weights, into a local directory.

An adapter is a few MiB that vLLM reads from a local path, not weights streamed into
device memory: the worker downloads every file its manifest lists, checks each
against the manifest's size and sha256, and only then moves the directory into place.
A prefix without a manifest (never pushed, or an interrupted push) is refused. A swap
rebuilds the engine's front end from the same kind of copy of a model's config and
tokenizer files (:func:`is_weights_file` false), kept by content for the next swap.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from weight_streaming.manifest import Manifest, join_key, parse_s3_uri
from weight_streaming.push import read_manifest

CHUNK = 1 << 20


class FetchError(Exception):
    """The files could not be fetched whole and intact (the message says which and why)."""


# Weight files, as vLLM leaves them out when it pulls a model's config and tokenizer.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".tensors")


def is_weights_file(path: str) -> bool:
    return path.endswith(WEIGHT_SUFFIXES)


def front_end_key(manifest: Manifest) -> str:
    """A name for the model's files other than its weights, from their paths and sha256:
    two models (or two pushes) with the same such files share it."""
    h = hashlib.sha256()
    for f in sorted(manifest.files, key=lambda f: f.path):
        if not is_weights_file(f.path):
            h.update(f"{f.path}\0{f.sha256}\n".encode())
    return h.hexdigest()[:32]


def fetch_model_files(client: Any, uri: str, dest: Path, *, manifest: Manifest | None = None,
                      include: Callable[[str], bool] | None = None) -> Path:
    """Every file of the pushed model at ``uri`` (those whose path ``include`` accepts)
    in ``dest`` (created; an existing complete ``dest`` is kept as is); ``manifest``:
    the model's, when the caller has read it already. Blocking: run it in a thread."""
    if (dest / ".complete").exists():
        return dest
    if manifest is None:
        manifest = read_manifest(client, uri)
    if manifest is None:
        raise FetchError(f"no thaw-manifest.json at {uri} (not pushed, or the push was interrupted)")
    bucket, prefix = parse_s3_uri(uri)
    staging = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}")
    staging.mkdir(parents=True)
    try:
        for entry in manifest.files:
            if include is not None and not include(entry.path):
                continue
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
