"""The config and tokenizer files a swap rebuilds the engine's front end from.

A swap builds the new model's front end (vLLM's ``ModelConfig``, tokenizer, chat
template, generation defaults) from its files other than the weights. Pulled from the
store on every swap, they cost a LIST and a GET per file on the request path, whatever
the size of the model. The agent keeps a copy per content instead (their paths and
sha256 from the manifest it has read anyway, each file checked against it), under the
worker's data directory; the engine host reads it, and the next swap of a model with
the same files reads it again. The copies are a few MiB at most; the least recently
used beyond ``KEEP`` are removed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from thaw.log import get_logger
from weight_streaming.fetch import fetch_model_files, front_end_key, is_weights_file
from weight_streaming.manifest import Manifest

log = get_logger()

# How many models' files a worker keeps.
KEEP = 64


# Fetches the files of the model at a URI (its manifest given) into a directory.
FrontEndFetch = Callable[[str, Path, Manifest], Path]


def store_fetch(client_of: Callable[[], Any]) -> FrontEndFetch:
    """The files from the store (``client_of()``: an S3 client), each checked against
    the manifest."""
    def fetch(uri: str, dest: Path, manifest: Manifest) -> Path:
        return fetch_model_files(client_of(), uri, dest, manifest=manifest,
                                 include=lambda path: not is_weights_file(path))
    return fetch


async def front_end_dir(root: Path, fetch: FrontEndFetch, uri: str, manifest: object) -> str | None:
    """A local directory with the files of the model at ``uri`` other than its weights
    (fetched unless a copy of the same files is there); None when it cannot be had (the
    engine host then pulls them from the store itself)."""
    if not isinstance(manifest, Manifest):
        return None
    dest = root / front_end_key(manifest)
    try:
        if not (dest / ".complete").exists():
            await asyncio.to_thread(fetch, uri, dest, manifest)
        os.utime(dest)  # most recently used
        await asyncio.to_thread(_prune, root, KEEP)
    except Exception as exc:  # the engine host can still pull them: slower, not wrong
        log.warning("front_end_files_unavailable", uri=uri, error=f"{type(exc).__name__}: {exc}")
        return None
    return str(dest)


def _prune(root: Path, keep: int) -> None:
    dirs = sorted((d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")),
                  key=lambda d: d.stat().st_mtime, reverse=True)
    for d in dirs[keep:]:
        shutil.rmtree(d, ignore_errors=True)
