"""Thaw's streamer as a vLLM model loader: ``--load-format thaw``.

    register()   # once per process, before vLLM parses arguments or builds a model
    vllm serve s3://bucket/prefix --load-format thaw ...

The loader reads the model's safetensors files with Thaw's streamer
(:func:`weight_streaming.s3_loader.load_s3` for ``s3://``: parallel ranged GETs,
optionally through the local disk cache; ``preadv`` for a local directory) into
host memory and feeds ``(name, tensor)`` pairs to ``model.load_weights``. Config and tokenizer files of an
``s3://`` model are pulled by vLLM itself, as for ``runai_streamer``
(``ModelConfig.maybe_pull_model_tokenizer_for_runai``: ``model`` becomes the local
copy, ``model_weights`` keeps the URI), so ``--model s3://...`` works unchanged.

Credentials and endpoint come from the environment, as
:meth:`thaw.objstore.S3Endpoint.env` sets it for an engine (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ...).

Tensor parallelism: vLLM's loaders hand every rank the full tensors and each
model's ``load_weights`` cuts its shard; this loader does the same (full tensors,
read into host memory). Untested with TP > 1 (no GPU here).

A load either fills every parameter or raises: a missing file, a malformed header,
a short read or a parameter the checkpoint does not provide fails the engine's
start with the URI and the reason, so no half-loaded model serves.

Importing this module imports vLLM and torch: only the engine processes do.
"""

from __future__ import annotations

import fnmatch
import json
import os
import time
from collections.abc import Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from vllm.config import ModelConfig
from vllm.config.load import LoadConfig
from vllm.logger import init_logger
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

from thaw.units import GiB, MiB
from weight_streaming.cache import DiskCache
from weight_streaming.manifest import Manifest, TensorDigest
from weight_streaming.s3_loader import (
    DEFAULT_S3_CHUNK_BYTES,
    DEFAULT_S3_CONCURRENCY,
    CacheTier,
    S3LoadResult,
    S3Object,
    load_s3,
    manifest_digests,
    manifest_sha256,
    resolve_objects,
)
from weight_streaming.sources import StreamError
from weight_streaming.streamer import LoadResult, load_many, map_file
from weight_streaming.tensor_check import TensorMismatch, check_tensors

# Under "vllm" so that vLLM's logging configuration (handlers, level, stream) applies.
logger = init_logger("vllm.thaw_loader")

LOAD_FORMAT = "thaw"
INDEX_FILE = "model.safetensors.index.json"

# model_loader_extra_config keys this loader understands.
_EXTRA_KEYS = frozenset({"concurrency", "chunk_mib", "cache_dir", "cache_max_gib", "host_cache_dir",
                         "host_cache_max_gib", "verify_sha256", "verify_tensors"})


class ThawLoadError(RuntimeError):
    """The model's weights cannot be loaded; the message names the URI and the reason."""


@dataclass(frozen=True)
class StreamOptions:
    """How the loader reads (``--model-loader-extra-config``, JSON)."""

    concurrency: int = DEFAULT_S3_CONCURRENCY
    chunk_bytes: int = DEFAULT_S3_CHUNK_BYTES
    # The local disk cache tier for s3:// weights (weight_streaming.cache); None: off.
    cache_dir: str | None = None
    cache_max_bytes: int = 0
    # The host-memory tier (a directory on a tmpfs), read before the disk; None: off.
    host_cache_dir: str | None = None
    host_cache_max_bytes: int = 0
    # Check every file against the sha256 in the model's Thaw manifest (CPU cost:
    # hashing every byte; off by default, the ETag and header checks always run).
    verify_sha256: bool = False
    # A swap checks every tensor it hands the engine against the manifest (name, dtype,
    # shape, CRC-32: weight_streaming.tensor_check); then the worker's memory copy,
    # whose sha256 was checked when it was filled, is not hashed again.
    verify_tensors: bool = True

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | Any) -> StreamOptions:
        """Options from ``--model-loader-extra-config``; unknown keys are refused by name."""
        extra = dict(extra or {})
        unknown = set(extra) - _EXTRA_KEYS
        if unknown:
            raise ValueError(
                f"unknown model_loader_extra_config keys for load format {LOAD_FORMAT!r}: "
                f"{sorted(unknown)}; valid: {sorted(_EXTRA_KEYS)}"
            )
        out = cls()
        for key, attr, scale, kinds in (
            ("concurrency", "concurrency", 1, int),
            ("chunk_mib", "chunk_bytes", MiB, int),
            ("cache_max_gib", "cache_max_bytes", GiB, int | float),
            ("host_cache_max_gib", "host_cache_max_bytes", GiB, int | float),
        ):
            if key in extra:
                value = extra[key]
                if isinstance(value, bool) or not isinstance(value, kinds) or value <= 0:
                    raise ValueError(f"model_loader_extra_config.{key} must be a positive number, got {value!r}")
                out = replace(out, **{attr: int(value * scale)})  # type: ignore[arg-type]
        for dir_key, budget_key in (("cache_dir", "cache_max_gib"), ("host_cache_dir", "host_cache_max_gib")):
            if dir_key in extra:
                if not isinstance(extra[dir_key], str) or not extra[dir_key]:
                    raise ValueError(f"model_loader_extra_config.{dir_key} must be a directory path")
                if budget_key not in extra:
                    raise ValueError(f"model_loader_extra_config.{dir_key} needs {budget_key} (the cache's budget)")
                out = replace(out, **{dir_key: extra[dir_key]})
        for flag in ("verify_sha256", "verify_tensors"):
            if flag in extra:
                if not isinstance(extra[flag], bool):
                    raise ValueError(f"model_loader_extra_config.{flag} must be true or false")
                out = replace(out, **{flag: extra[flag]})
        return out


# --- where the weights are ------------------------------------------------------------


def s3_client_from_env(max_pool_connections: int) -> Any:
    """A boto3 S3 client configured from the environment an engine runs with.

    Path-style addressing unless the environment asks for virtual hosts: the runai
    streamer's switch (``RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING``) is what Thaw
    sets for an engine, so both loaders address the store the same way.
    """
    import boto3
    import botocore.config

    virtual = os.environ.get("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "1").lower() not in ("0", "false")
    # Keys in the environment are passed as they are now: boto3's default session keeps
    # the first credentials it resolves for the life of the process.
    keys = {arg: os.environ[var] for arg, var in (("aws_access_key_id", "AWS_ACCESS_KEY_ID"),
                                                  ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
                                                  ("aws_session_token", "AWS_SESSION_TOKEN"))
            if os.environ.get(var)}
    return boto3.client(
        "s3",
        endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
        **keys,
        region_name=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        config=botocore.config.Config(
            s3={"addressing_style": "virtual" if virtual else "path"},
            retries={"max_attempts": 5, "mode": "standard"},
            # One connection per reader thread (plus LIST/HEAD), or threads queue.
            max_pool_connections=max_pool_connections + 4,
            # Ranged GETs carry no whole-object checksum: do not ask for one.
            response_checksum_validation="when_required",
            request_checksum_calculation="when_required",
        ),
    )


def prewarm() -> None:
    """Load what building an S3 client loads (botocore's service data, ~0.2 s), so
    that the first client in this process, or in a process forked from it, is cheap.

    Placeholder credentials and endpoint: nothing is resolved from the
    environment or contacted, and nothing about them is cached.
    """
    import boto3

    boto3.client(
        "s3", region_name="us-east-1", endpoint_url="http://127.0.0.1:9",
        aws_access_key_id="prewarm", aws_secret_access_key="prewarm",
    )


def _select_weight_files(names: list[str], index: dict[str, Any] | None, where: str) -> list[str]:
    """The safetensors files that make up the model, sorted.

    With an index (``model.safetensors.index.json``) only the files its
    ``weight_map`` names: a repository may also carry a consolidated copy, which
    would load every tensor twice.
    """
    files = sorted(n for n in names if fnmatch.fnmatch(n, "*.safetensors"))
    if index is not None:
        wanted = set((index.get("weight_map") or {}).values())
        missing = sorted(wanted - set(files))
        if missing:
            raise ThawLoadError(f"{where}: {INDEX_FILE} names files that are not there: {missing}")
        files = sorted(wanted)
    if not files:
        raise ThawLoadError(f"{where}: no *.safetensors files (not pushed, or the wrong prefix?)")
    return files


def local_weight_files(directory: str | os.PathLike[str]) -> list[str]:
    """Paths of the safetensors files of a local model directory."""
    d = Path(directory)
    if not d.is_dir():
        raise ThawLoadError(f"{d}: not a directory")
    index_path = d / INDEX_FILE
    index = json.loads(index_path.read_text()) if index_path.is_file() else None
    return [str(d / n) for n in _select_weight_files([p.name for p in d.iterdir()], index, str(d))]


def cache_tiers(options: StreamOptions) -> list[CacheTier]:
    """The worker's weight caches the options name, fastest first (host memory, disk)."""
    tiers = []
    if options.host_cache_dir:
        tiers.append(CacheTier("host", DiskCache(options.host_cache_dir, options.host_cache_max_bytes)))
    if options.cache_dir:
        tiers.append(CacheTier("disk", DiskCache(options.cache_dir, options.cache_max_bytes)))
    return tiers


def stream_model_weights(uri: str, options: StreamOptions = StreamOptions()) -> LoadResult:
    """Every tensor of the model at ``uri`` (``s3://bucket/prefix`` or a local directory),
    in host memory.

    ``s3://`` goes through :func:`weight_streaming.s3_loader.load_s3` (parallel
    ranged GETs pinned to each object's ETag, the disk cache when configured).
    """
    try:
        if not uri.startswith("s3://"):
            return load_many(
                local_weight_files(uri), device="cpu",
                chunk_bytes=options.chunk_bytes, concurrency=options.concurrency,
            )
        client = s3_client_from_env(options.concurrency)
        tiers = cache_tiers(options)
        # The caches' writes and commits finish in the background, while the engine
        # starts: a worker stopped before they did leaves only temp files, never used.
        return load_s3(
            client, uri, device="cpu", chunk_bytes=options.chunk_bytes,
            concurrency=options.concurrency, caches=tiers,
            verify_sha256=_manifest_checksums(client, uri) if options.verify_sha256 else None,
        )
    except ThawLoadError:
        raise
    except (StreamError, ValueError, OSError) as exc:
        # StreamError covers S3 errors and short reads; MalformedSafetensors is a ValueError.
        raise _load_error(uri, exc) from exc


class FileByFileWeights:
    """Every tensor of the model at ``uri``, read one safetensors file at a time (a swap
    into a live engine: see ``worker.engine_host.swap_core``).

    Iterating yields ``(name, tensor)``; each file is read whole (parallel ranged GETs,
    through the cache tiers, checked like any load) and checked, on a thread of its
    own, one file ahead of the engine: while the engine takes file ``i``'s tensors
    (vLLM-CPU rebuilds and repacks each layer), file ``i + 1`` is read. So the memory
    this needs beyond the engine's own is the two largest files, not the model. With
    ``verify_tensors`` (the default), every tensor of a file is checked against the
    manifest before any is handed over (``weight_streaming.tensor_check``), and every
    tensor the manifest lists must come; a copy in a cache tier that fails is evicted.
    After the last tensor, :attr:`summary` says what was read from where (as
    :func:`load_summary`), how long reading (``read_s``) and the checks (``verify_s``)
    took on their thread, and how long the engine waited for them (``wait_s``). A
    failure raises :class:`ThawLoadError` from the iteration: what was handed over
    before it is already in the engine (the caller must not serve it).
    """

    def __init__(self, uri: str, options: StreamOptions = StreamOptions()) -> None:
        self.uri = uri
        self.options = options
        self.summary: dict[str, Any] | None = None
        # Time reading (or mapping) the files, and the tensor checks: their time, and
        # how many tensors passed; and the time the engine waited for both.
        self._read_s = 0.0
        self._verify_s = 0.0
        self._wait_s = 0.0
        self._verified = 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        t0 = time.perf_counter()
        try:
            sources: dict[str, int]
            if self.uri.startswith("s3://"):
                sources = yield from self._from_s3()
            else:
                sources = {"local": 0}
                for path in local_weight_files(self.uri):
                    result = load_many([path], device="cpu", chunk_bytes=self.options.chunk_bytes,
                                       concurrency=self.options.concurrency)
                    sources["local"] += result.stats.bytes
                    yield from _drain(result.tensors)
        except ThawLoadError:
            raise
        except (StreamError, ValueError, OSError) as exc:
            raise _load_error(self.uri, exc) from exc
        total = sum(sources.values())
        self.summary = {"bytes": total, "seconds": round(time.perf_counter() - t0, 4),
                        "sources": {k: v for k, v in sources.items() if v}, "read_s": round(self._read_s, 4),
                        "verify_s": round(self._verify_s, 4), "wait_s": round(self._wait_s, 4),
                        "tensors_verified": self._verified}

    def _from_s3(self) -> Generator[tuple[str, torch.Tensor], None, dict[str, int]]:
        """The tensors; returns the bytes read from each source."""
        o = self.options
        client = s3_client_from_env(o.concurrency)
        tiers = cache_tiers(o)
        manifest = _manifest(client, self.uri) if o.verify_sha256 or o.verify_tensors else None
        verify = manifest_sha256(manifest) if manifest is not None and o.verify_sha256 else None
        digests = manifest_digests(manifest) if manifest is not None and o.verify_tensors else None
        # Every tensor checked against the manifest: the worker's memory copy (hashed
        # when it was filled) is not hashed again. A manifest from before tensors were
        # recorded leaves the sha256 on.
        unhashed = frozenset({"host"}) if digests and all(digests.values()) else frozenset()
        # Unhashed, the host copy is mapped rather than read: it is in memory already.
        host = next((t for t in tiers if t.name == "host"), None) if "host" in unhashed else None
        objs = resolve_objects(client, self.uri, concurrency=o.concurrency)
        sources: dict[str, int] = {}

        def read(obj: S3Object) -> dict[str, torch.Tensor]:
            """One file's tensors, read and checked (on the read-ahead thread)."""
            t0 = time.perf_counter()
            mapped = self._mapped(host, obj) if host is not None else None
            if host is not None and mapped is not None:
                tensors, source = mapped, host.name
                sources[source] = sources.get(source, 0) + obj.size
            else:
                result = load_s3(client, [obj], device="cpu", chunk_bytes=o.chunk_bytes, concurrency=o.concurrency,
                                 caches=tiers, verify_sha256=verify, unhashed_tiers=unhashed)
                tensors, source = result.tensors, result.files[0].source if result.files else "s3"
                for src, n in result.bytes_by_source().items():
                    sources[src] = sources.get(src, 0) + n
            self._read_s += time.perf_counter() - t0
            if digests and digests.get(obj.key):
                self._check(tensors, source, obj, digests[obj.key], tiers)
            return tensors

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="thaw-read-ahead") as ahead:
            pending = ahead.submit(read, objs[0]) if objs else None
            try:
                for i in range(len(objs)):
                    assert pending is not None
                    t0 = time.perf_counter()
                    tensors = pending.result()
                    self._wait_s += time.perf_counter() - t0
                    pending = ahead.submit(read, objs[i + 1]) if i + 1 < len(objs) else None
                    yield from _drain(tensors)
                    del tensors
            finally:
                # Stopped early (a failure here or in the engine): the file being read
                # ahead is let finish (a load cannot be cut short) and dropped.
                if pending is not None:
                    pending.cancel()
        files = [(obj.bucket, obj.key, obj.etag, obj.size) for obj in objs if obj.etag]
        for t in tiers:
            try:
                t.cache.record_model(self.uri, files)
            except OSError as exc:  # a full disk: the tier just does not say it has the model
                logger.warning("cache record for %s in %s failed: %s", self.uri, t.name, exc)
        return sources

    def _mapped(self, host: CacheTier, obj: S3Object) -> dict[str, torch.Tensor] | None:
        """The file's tensors mapped from the host tier's copy (None: it has none, or a
        copy that does not parse, which is evicted)."""
        path = host.cache.lookup(obj.bucket, obj.key, obj.etag, obj.size) if obj.etag else None
        if path is None:
            return None
        try:
            return map_file(path)
        except (ValueError, OSError, StreamError) as exc:  # malformed or gone: read it elsewhere
            logger.warning("the %s tier's copy of %s cannot be mapped (%s): evicted", host.name, obj.uri, exc)
            host.cache.evict(obj.bucket, obj.key, obj.etag)
            return None

    def _check(self, tensors: dict[str, torch.Tensor], source: str, obj: S3Object,
               expected: dict[str, TensorDigest], tiers: list[CacheTier]) -> None:
        """The file's tensors against the manifest's for it; a cached copy (``source``)
        that fails is evicted (the next load reads the store)."""
        t0 = time.perf_counter()
        try:
            check_tensors(tensors, expected, obj.uri)
        except TensorMismatch as exc:
            for t in tiers:
                if t.name == source:
                    t.cache.evict(obj.bucket, obj.key, obj.etag)
                    logger.warning("evicted the %s tier's copy of %s: %s", source, obj.uri, exc)
            raise ThawLoadError(f"{exc} (read from {source})") from exc
        finally:
            self._verify_s += time.perf_counter() - t0
        self._verified += len(tensors)


def _load_error(uri: str, exc: BaseException) -> ThawLoadError:
    # The streamer's messages usually name the object already.
    return ThawLoadError(str(exc) if uri in str(exc) else f"{uri}: {exc}")


def _manifest(client: Any, uri: str) -> Manifest:
    from weight_streaming.push import read_manifest

    manifest = read_manifest(client, uri)
    if manifest is None:
        raise ThawLoadError(f"{uri}: verifying the weights needs the model's thaw-manifest.json, and there is none")
    return manifest


def _manifest_checksums(client: Any, uri: str) -> dict[str, str]:
    return manifest_sha256(_manifest(client, uri))


def weights_uri(model_config: ModelConfig) -> str:
    """Where the weights are: for an ``s3://`` model vLLM has already replaced
    ``model`` by the local copy of its config files and kept the URI here."""
    return model_config.model_weights or model_config.model


# --- the loader -------------------------------------------------------------------------


class ThawModelLoader(BaseModelLoader):
    """``load_format="thaw"``: safetensors from ``s3://`` or a local directory via
    Thaw's streamer. ``--model-loader-extra-config '{"concurrency": 16, "chunk_mib": 32}'``
    tunes the reads."""

    def __init__(self, load_config: LoadConfig) -> None:
        super().__init__(load_config)
        self.options = StreamOptions.from_extra_config(load_config.model_loader_extra_config)

    def download_model(self, model_config: ModelConfig) -> None:
        # Nothing to download ahead: the weights stream straight into memory. Listing
        # the files still refuses a model that has none before the engine goes further.
        uri = weights_uri(model_config)
        if not uri.startswith("s3://"):
            local_weight_files(uri)
            return
        try:
            resolve_objects(s3_client_from_env(self.options.concurrency), uri)
        except StreamError as exc:
            raise _load_error(uri, exc) from exc

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        uri = weights_uri(model_config)
        t0 = time.perf_counter()
        result = stream_model_weights(uri, self.options)
        t1 = time.perf_counter()
        loaded = model.load_weights(_drain(result.tensors))  # type: ignore[operator]
        t2 = time.perf_counter()
        s = result.stats
        global LAST_LOAD
        LAST_LOAD = load_summary(result, t1 - t0)
        logger.info(
            "Thaw streamer: %d files, %.1f MiB in %.2f s (%.2f GB/s) from %s; load_weights %.2f s",
            s.files, s.bytes / MiB, t1 - t0, s.gbps, uri, t2 - t1,
        )
        if model_config.quantization is None and loaded is not None:
            # Same rule as vLLM's default loader: every parameter must come from the
            # checkpoint, or the model would serve with uninitialised weights.
            missing = sorted({name for name, _ in model.named_parameters()} - set(loaded))
            if missing:
                shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
                raise ThawLoadError(f"{uri}: the checkpoint does not provide these parameters: {shown}")


# What the last load in this process read from where (the engine core reports it with
# its "weights_loaded" event: see worker.engine_host.engine_core_entry).
LAST_LOAD: dict[str, Any] | None = None


def load_summary(result: LoadResult, seconds: float) -> dict[str, Any]:
    """Bytes, seconds and bytes per source ("s3", "host", "disk", or "local" for a
    directory) of one load."""
    if not isinstance(result, S3LoadResult):
        return {"bytes": result.stats.bytes, "seconds": round(seconds, 4), "sources": {"local": result.stats.bytes}}
    return {"bytes": result.stats.bytes, "seconds": round(seconds, 4), "sources": result.bytes_by_source(),
            # Reasons cut short: the event line stays well under PIPE_BUF.
            "rejected": [{"uri": u, "tier": t, "reason": r[:200]} for u, t, r in result.rejected[:4]]}


def _drain(tensors: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield and forget each tensor, so memory a model copies out of can be freed early."""
    while tensors:
        name = next(iter(tensors))
        yield name, tensors.pop(name)


# --- registration -----------------------------------------------------------------------


def register() -> None:
    """Make ``load_format="thaw"`` known to vLLM in this process (idempotent).

    Needed in every process that builds a ``VllmConfig`` (the API server: the
    object-storage check below) or a model (the engine core: the loader registry).
    """
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER

    if _LOAD_FORMAT_TO_MODEL_LOADER.get(LOAD_FORMAT) is not ThawModelLoader:
        register_model_loader(LOAD_FORMAT)(ThawModelLoader)
    _allow_object_storage_uri()


def _allow_object_storage_uri() -> None:
    """Let ``--model s3://...`` pass vLLM's config check with ``load_format="thaw"``.

    ``VllmConfig.try_verify_and_update_config`` refuses an object-storage model
    unless the load format is one of vLLM's streaming loaders (a fixed tuple, no
    hook). The check runs once per config, when it is built; during it, "thaw"
    answers to that check as ``runai_streamer`` does (whose URI handling, config
    pulling included, it shares), then is put back.
    """
    from vllm.config.vllm import VllmConfig

    original = VllmConfig.try_verify_and_update_config
    if getattr(original, "_thaw_wrapped", False):
        return

    def try_verify_and_update_config(self: Any) -> Any:
        lc = getattr(self, "load_config", None)
        if lc is None or lc.load_format != LOAD_FORMAT:
            return original(self)
        lc.load_format = "runai_streamer"
        try:
            return original(self)
        finally:
            lc.load_format = LOAD_FORMAT

    try_verify_and_update_config._thaw_wrapped = True  # type: ignore[attr-defined]
    VllmConfig.try_verify_and_update_config = try_verify_and_update_config  # type: ignore[method-assign]
