"""`load_s3` against a real SeaweedFS: bit-exact tensors, the disk cache tier, clear errors."""

from __future__ import annotations

import gc
import io
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.weight_streaming.support import (
    TORCH_DTYPES,
    LateCuda,
    assert_same,
    fill_filesystem,
    random_tensor,
    small_filesystem,
)
from thaw.objstore import S3Endpoint
from thaw.units import KiB
from weight_streaming import streamer
from weight_streaming.cache import CachedModel, DiskCache, entry_name
from weight_streaming.host_pool import HostBufferPool
from weight_streaming.manifest import parse_s3_uri
from weight_streaming.push import push_model
from weight_streaming.s3_loader import (
    HEADER_PROBE_BYTES,
    CacheTier,
    ChecksumMismatch,
    S3LoadResult,
    load_s3,
    manifest_sha256,
    resolve_objects,
)
from weight_streaming.s3_source import S3AccessDenied, S3NotFound, S3ObjectChanged, _http_response
from weight_streaming.safetensors_header import MalformedSafetensors
from weight_streaming.sources import StreamError

pytestmark = pytest.mark.integration

# Small chunks so a ~1 MB model is many parallel ranged GETs.
CHUNK = 64 * KiB
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def shard_tensors(seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Shard 1: every dtype (odd sizes, scalars, empties). Shard 2: 2-D tensors to split for TP."""
    gen = torch.Generator().manual_seed(seed)
    first: dict[str, torch.Tensor] = {}
    for dtype in TORCH_DTYPES:
        tag = str(dtype).removeprefix("torch.")
        first[f"{tag}.matrix"] = random_tensor(dtype, (7, 13), gen)
        first[f"{tag}.scalar"] = random_tensor(dtype, (), gen)
        first[f"{tag}.empty"] = random_tensor(dtype, (3, 0, 2), gen)
    first["big.f32"] = random_tensor(torch.float32, (600, 601), gen)
    second = {
        "w.bf16": random_tensor(torch.bfloat16, (1025, 768), gen),
        "col.f16": random_tensor(torch.float16, (64, 131), gen),
        "row.i32": random_tensor(torch.int32, (129, 33), gen),
    }
    return first, second


@dataclass(frozen=True)
class Model:
    uri: str
    bucket: str
    prefix: str
    files: list[Path]

    def expected(self) -> dict[str, torch.Tensor]:
        want: dict[str, torch.Tensor] = {}
        for f in self.files:
            want.update(load_file(str(f)))
        return want

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"


def upload(s3: S3Endpoint, directory: Path, uri: str) -> Model:
    bucket, prefix = parse_s3_uri(uri)
    client = s3.client()
    files = sorted(directory.glob("*.safetensors"))
    for f in files:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{f.name}", Body=f.read_bytes())
    return Model(uri, bucket, prefix, files)


def write_shards(directory: Path, seed: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, tensors in zip(SHARDS, shard_tensors(seed), strict=True):
        save_file(tensors, str(directory / name), metadata={"format": "pt"})


@pytest.fixture
def model(s3: S3Endpoint, s3_prefix: str, tmp_path: Path) -> Model:
    """Two shards (1.5 MB each, more than the 1 MiB header probe), every dtype, under a fresh prefix."""
    write_shards(tmp_path / "model")
    return upload(s3, tmp_path / "model", s3_prefix)


class Calls:
    """Counts the S3 requests a client makes, by operation (and key)."""

    def __init__(self, client: Any) -> None:
        self.ops: list[tuple[str, str | None]] = []
        client.meta.events.register("before-parameter-build.s3", self._on)

    def _on(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.ops.append((model.name, params.get("Key")))

    def count(self, op: str, key: str | None = None) -> int:
        return sum(o == op and (key is None or k == key) for o, k in self.ops)

    def clear(self) -> None:
        self.ops.clear()


@pytest.fixture
def client(s3: S3Endpoint) -> Any:
    return s3.client(max_pool_connections=16)


def load(client: Any, objects: Any, **kw: Any) -> S3LoadResult:
    return load_s3(client, objects, chunk_bytes=CHUNK, concurrency=4, **kw)


def tp_dims(name: str) -> int | None:
    """Rows of w.bf16 and row.i32, columns of col.f16 and big.f32 (odd sizes: uneven chunks)."""
    if name in ("w.bf16", "row.i32"):
        return 0
    if name in ("col.f16", "big.f32"):
        return 1
    return None


def tp_expected(want: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in want.items():
        dim = tp_dims(name)
        out[name] = t if dim is None else t.chunk(2, dim)[rank]
    return out


# --- bit-exact loads ----------------------------------------------------------------


def test_prefix_load_equals_safetensors_bit_for_bit(model: Model, client: Any) -> None:
    calls = Calls(client)
    result = load(client, model.uri)
    assert_same(result.tensors, model.expected())
    assert [f.uri for f in result.files] == [f"s3://{model.bucket}/{model.key(n)}" for n in SHARDS]
    assert {f.source for f in result.files} == {"s3"}
    # One LIST gives sizes and ETags (no HEAD); per file one header GET of the first
    # 1 MiB, then one GET per data chunk not already inside those first bytes.
    assert calls.count("ListObjectsV2") == 1
    assert calls.count("HeadObject") == 0
    for name, path in zip(SHARDS, model.files, strict=True):
        size = path.stat().st_size
        assert size > HEADER_PROBE_BYTES
        # Chunks end at multiples of CHUNK (aligned), so those ending past 1 MiB are
        # the blocks from 1 MiB / 64 KiB = 16 to the last one.
        data_gets = (size - 1) // CHUNK - HEADER_PROBE_BYTES // CHUNK + 1
        assert calls.count("GetObject", model.key(name)) == 1 + data_gets


def test_explicit_objects_and_single_file_uri(model: Model, client: Any) -> None:
    calls = Calls(client)
    pairs = [(model.bucket, model.key(n)) for n in SHARDS]
    assert_same(load(client, pairs).tensors, model.expected())
    assert calls.count("HeadObject") == 2
    one = load(client, f"s3://{model.bucket}/{model.key(SHARDS[1])}")
    assert_same(one.tensors, load_file(str(model.files[1])))


def test_endpoint_builds_its_own_client(model: Model, s3: S3Endpoint) -> None:
    assert_same(load_s3(s3, model.uri, concurrency=3).tensors, model.expected())


def test_fast_body_path_is_used_with_a_real_botocore_response(model: Model, client: Any) -> None:
    # The fast reader relies on botocore/urllib3 internals: if they change, this fails
    # (the loader would still be correct, through the portable path, but slower).
    resp = client.get_object(Bucket=model.bucket, Key=model.key(SHARDS[0]), Range="bytes=0-99")
    raw = _http_response(resp["Body"])
    assert raw is not None
    resp["Body"].close()


@pytest.mark.parametrize("rank", [0, 1])
def test_tp_split_of_two_equals_chunk(model: Model, client: Any, rank: int) -> None:
    result = load(client, model.uri, tp_rank=rank, tp_size=2, shard_dims=tp_dims)
    assert_same(result.tensors, tp_expected(model.expected(), rank))


def test_index_selects_shards_and_must_be_complete(model: Model, client: Any) -> None:
    raw = client
    # A consolidated copy next to the shards must not be loaded twice.
    raw.put_object(Bucket=model.bucket, Key=model.key("consolidated.safetensors"),
                   Body=model.files[0].read_bytes())
    index = {"weight_map": {k: SHARDS[0] for k in load_file(str(model.files[0]))}}
    index["weight_map"].update({k: SHARDS[1] for k in load_file(str(model.files[1]))})
    raw.put_object(Bucket=model.bucket, Key=model.key("model.safetensors.index.json"),
                   Body=json.dumps(index).encode())
    result = load(client, model.uri)
    assert [f.uri.rsplit("/", 1)[1] for f in result.files] == list(SHARDS)
    assert_same(result.tensors, model.expected())

    raw.delete_object(Bucket=model.bucket, Key=model.key(SHARDS[1]))
    with pytest.raises(S3NotFound, match=r"index.json names files that are not in the store: \['model-00002"):
        load(client, model.uri)


# --- the disk cache tier ------------------------------------------------------------


def test_second_load_is_served_from_the_cache_without_data_gets(
    model: Model, client: Any, tmp_path: Path
) -> None:
    cache = DiskCache(tmp_path / "cache", max_bytes=10 << 20)
    calls = Calls(client)
    first = load(client, model.uri, cache=cache)
    assert [f.source for f in first.files] == ["s3", "s3"]
    assert all(f.cache_written for f in first.files)
    cache.flush()
    assert sorted(e.size for e in cache.entries()) == sorted(p.stat().st_size for p in model.files)

    calls.clear()
    second = load(client, model.uri, cache=cache)
    assert [f.source for f in second.files] == ["disk", "disk"]
    assert calls.count("GetObject") == 0  # no data, no headers
    assert calls.ops == [("ListObjectsV2", None)]  # the LIST that gives the ETags
    assert_same(second.tensors, model.expected())
    # The cached files are byte-identical to the objects.
    for path in model.files:
        hit = cache.lookup(model.bucket, model.key(path.name), _etag(client, model, path.name),
                           path.stat().st_size)
        assert hit is not None and hit.read_bytes() == path.read_bytes()


def test_cache_hit_with_explicit_objects_costs_one_head_each(model: Model, client: Any, tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "cache", max_bytes=10 << 20)
    pairs = [(model.bucket, model.key(n)) for n in SHARDS]
    load(client, pairs, cache=cache)
    cache.flush()
    calls = Calls(client)
    result = load(client, pairs, cache=cache)
    # Sizes and ETags from one HEAD per object (in parallel); no GET.
    assert sorted(calls.ops) == [("HeadObject", model.key(n)) for n in SHARDS]
    assert_same(result.tensors, model.expected())


def test_changed_object_is_downloaded_again(model: Model, client: Any, tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "cache", max_bytes=10 << 20)
    load(client, model.uri, cache=cache)
    cache.flush()
    write_shards(tmp_path / "v2", seed=1)
    new_second = tmp_path / "v2" / SHARDS[1]
    client.put_object(Bucket=model.bucket, Key=model.key(SHARDS[1]), Body=new_second.read_bytes())

    calls = Calls(client)
    result = load(client, model.uri, cache=cache)
    assert [f.source for f in result.files] == ["disk", "s3"]
    assert calls.count("GetObject", model.key(SHARDS[0])) == 0
    assert calls.count("GetObject", model.key(SHARDS[1])) > 0
    want = load_file(str(model.files[0]))
    want.update(load_file(str(new_second)))
    assert_same(result.tensors, want)
    cache.flush()
    # The old version's entry was replaced, not kept next to the new one.
    assert len(cache.entries()) == 2


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: os.truncate(p, p.stat().st_size - 1), id="truncated"),
        pytest.param(lambda p: _overwrite(p, 0, b"\xff" * 8), id="bad-header-length"),
        pytest.param(lambda p: _overwrite(p, 9, b"\x00\x00"), id="bad-header-json"),
    ],
)
def test_damaged_cache_file_is_detected_and_fetched_again(
    model: Model, client: Any, tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    cache = DiskCache(tmp_path / "cache", max_bytes=10 << 20)
    load(client, model.uri, cache=cache)
    cache.flush()
    entry = tmp_path / "cache" / entry_name(model.bucket, model.key(SHARDS[0]), _etag(client, model, SHARDS[0]))
    damage(entry)

    calls = Calls(client)
    result = load(client, model.uri, cache=cache)
    assert [f.source for f in result.files] == ["s3", "disk"]
    assert calls.count("GetObject", model.key(SHARDS[0])) > 0
    assert_same(result.tensors, model.expected())
    cache.flush()
    assert entry.read_bytes() == model.files[0].read_bytes()  # written again, whole


def test_corrupt_data_in_cache_is_caught_by_sha256_and_refetched(
    s3: S3Endpoint, client: Any, s3_prefix: str, tmp_path: Path
) -> None:
    src = tmp_path / "model"
    write_shards(src)
    (src / "config.json").write_text("{}")
    manifest = push_model(client, src, s3_prefix)
    sha = manifest_sha256(manifest)
    bucket, prefix = parse_s3_uri(s3_prefix)
    cache = DiskCache(tmp_path / "cache", max_bytes=10 << 20)
    load(client, s3_prefix, cache=cache, verify_sha256=sha)
    cache.flush()
    key = f"{prefix}/{SHARDS[1]}"
    entry = tmp_path / "cache" / entry_name(bucket, key, client.head_object(Bucket=bucket, Key=key)["ETag"])
    size = entry.stat().st_size
    _overwrite(entry, size - 3, b"\x5a\x5a\x5a")  # same size, valid header: only a hash sees it

    without = load(client, s3_prefix, cache=cache)  # no verification: the damage is served
    assert not all(torch.equal(without.tensors[k], v) for k, v in load_file(str(src / SHARDS[1])).items())

    result = load(client, s3_prefix, cache=cache, verify_sha256=sha)
    assert [f.source for f in result.files] == ["disk", "s3"]
    want = load_file(str(src / SHARDS[0]))
    want.update(load_file(str(src / SHARDS[1])))
    assert_same(result.tensors, want)
    cache.flush()
    assert entry.read_bytes() == (src / SHARDS[1]).read_bytes()


def test_sha256_mismatch_from_s3_fails_the_load(model: Model, client: Any) -> None:
    sha = {model.key(p.name): _sha256(p) for p in model.files}
    assert_same(load(client, model.uri, verify_sha256=sha).tensors, model.expected())
    sha[model.key(SHARDS[1])] = "0" * 64
    with pytest.raises(ChecksumMismatch, match=rf"{SHARDS[1]}: sha256 [0-9a-f]{{64}} does not match"):
        load(client, model.uri, verify_sha256=sha)
    del sha[model.key(SHARDS[1])]
    with pytest.raises(StreamError, match=rf"verify_sha256 has no sha256 for s3://.*{SHARDS[1]}"):
        load(client, model.uri, verify_sha256=sha)


def test_tp_with_cache_fills_whole_files_then_ranks_read_from_disk(
    model: Model, client: Any, tmp_path: Path
) -> None:
    cache = DiskCache(tmp_path / "cache", max_bytes=10 << 20)
    sha = {model.key(p.name): _sha256(p) for p in model.files}
    r0 = load(client, model.uri, cache=cache, tp_rank=0, tp_size=2, shard_dims=tp_dims, verify_sha256=sha)
    assert_same(r0.tensors, tp_expected(model.expected(), 0))
    cache.flush()
    calls = Calls(client)
    r1 = load(client, model.uri, cache=cache, tp_rank=1, tp_size=2, shard_dims=tp_dims, verify_sha256=sha)
    assert [f.source for f in r1.files] == ["disk", "disk"]
    assert calls.count("GetObject") == 0
    assert_same(r1.tensors, tp_expected(model.expected(), 1))


class GatedCache(DiskCache):
    """Background work (queued writes, commits) waits until ``gate`` is set: anything
    queued from a buffer that is reused meanwhile would write the wrong bytes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()

    def _background(self, fn: Callable[[], None]) -> Future[None]:
        def gated() -> None:
            self.gate.wait(30)
            fn()

        return super()._background(gated)


def test_cuda_path_streams_caches_and_verifies(
    model: Model, client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fake GPU whose copies out of the pinned staging slots run as late as possible:
    # the cache file must get each chunk before its slot is reused.
    monkeypatch.setattr(streamer, "_cuda", LateCuda())
    cache = GatedCache(tmp_path / "cache", max_bytes=10 << 20)
    sha = {model.key(p.name): _sha256(p) for p in model.files}
    first = load(client, model.uri, device="cuda", cache=cache, verify_sha256=sha)
    assert_same(first.tensors, model.expected())
    cache.gate.set()
    cache.flush()
    for path in model.files:
        entry = tmp_path / "cache" / entry_name(model.bucket, model.key(path.name), _etag(client, model, path.name))
        assert entry.read_bytes() == path.read_bytes()
    second = load(client, model.uri, device="cuda", cache=cache, verify_sha256=sha)
    assert [f.source for f in second.files] == ["disk", "disk"]
    assert_same(second.tensors, model.expected())


def test_cache_writes_queued_from_the_buffer_survive_the_caller_dropping_it(
    model: Model, client: Any, tmp_path: Path, s3: S3Endpoint
) -> None:
    # On the CPU path the cache file is written from the load's buffer after the load
    # returned. The caller may drop the tensors and load again into pooled memory before
    # the disk catches up: the queued writes must keep their bytes alive and intact.
    cache = GatedCache(tmp_path / "cache", max_bytes=10 << 20)
    pool = HostBufferPool()
    pool.reserve(sum(p.stat().st_size for p in model.files))
    write_shards(tmp_path / "other", seed=4)
    other = upload(s3, tmp_path / "other", f"{model.uri}-other")
    first = load(client, model.uri, cache=cache, host_pool=pool)
    del first
    gc.collect()
    second = load(client, other.uri, host_pool=pool)  # must not land in memory still queued
    assert_same(second.tensors, other.expected())
    cache.gate.set()
    cache.flush()
    for path in model.files:
        entry = tmp_path / "cache" / entry_name(model.bucket, model.key(path.name), _etag(client, model, path.name))
        assert entry.read_bytes() == path.read_bytes()


def test_tp_with_sha256_needs_a_cache(model: Model, client: Any) -> None:
    with pytest.raises(ValueError, match="verify_sha256 with tp_size > 1 needs a cache"):
        load(client, model.uri, tp_rank=0, tp_size=2, shard_dims=tp_dims, verify_sha256={})


def test_cache_budget_is_respected(model: Model, client: Any, tmp_path: Path) -> None:
    sizes = [p.stat().st_size for p in model.files]
    # Room for the larger shard only: at most one entry at a time, never over the budget.
    cache = DiskCache(tmp_path / "cache", max_bytes=max(sizes))
    for _ in range(3):
        assert_same(load(client, model.uri, cache=cache).tensors, model.expected())
        cache.flush()
        assert cache.used_bytes() <= max(sizes)
    # Smaller than either shard: nothing is cached, the load is still whole.
    tiny = DiskCache(tmp_path / "tiny", max_bytes=min(sizes) - 1)
    result = load(client, model.uri, cache=tiny)
    assert not any(f.cache_written for f in result.files)
    assert_same(result.tensors, model.expected())
    assert tiny.used_bytes() == 0


# --- errors -------------------------------------------------------------------------


def test_missing_key_prefix_and_bucket_are_clear_errors(model: Model, client: Any) -> None:
    key = f"{model.prefix}/nope.safetensors"
    with pytest.raises(S3NotFound, match=rf"^s3://{model.bucket}/{key}: not found$"):
        load(client, [(model.bucket, key)])
    with pytest.raises(S3NotFound, match=rf"^s3://{model.bucket}/{key}: not found$"):
        load(client, f"s3://{model.bucket}/{key}")
    with pytest.raises(S3NotFound, match=r"no \*\.safetensors objects under this prefix"):
        load(client, f"{model.uri}-missing")
    with pytest.raises(S3NotFound, match=r"bucket 'no-such-bucket-thaw' does not exist"):
        load(client, "s3://no-such-bucket-thaw/m")


def test_wrong_credentials_are_access_denied(model: Model, s3: S3Endpoint) -> None:
    bad = S3Endpoint(s3.endpoint_url, s3.access_key, "wrong-secret", s3.region)
    with pytest.raises(S3AccessDenied, match=r"access denied \(SignatureDoesNotMatch\); check the store credentials"):
        load_s3(bad, model.uri)


def test_malformed_and_truncated_objects_are_refused(model: Model, client: Any) -> None:
    key = f"{model.prefix}/bad.safetensors"
    client.put_object(Bucket=model.bucket, Key=key, Body=(10).to_bytes(8, "little") + b"{not json}")
    with pytest.raises(MalformedSafetensors, match=rf"s3://{model.bucket}/{key}: header is not valid UTF-8 JSON"):
        load(client, [(model.bucket, key)])
    data = model.files[1].read_bytes()
    client.put_object(Bucket=model.bucket, Key=key, Body=data[:-5])
    with pytest.raises(MalformedSafetensors, match=r"truncated file\?"):
        load(client, [(model.bucket, key)])
    client.put_object(Bucket=model.bucket, Key=key, Body=(1 << 40).to_bytes(8, "little"))
    with pytest.raises(MalformedSafetensors, match=r"exceeds the safetensors limit"):
        load(client, [(model.bucket, key)])


class ShortBodies:
    """A client whose data GETs (not the header probe) send half the bytes, then EOF."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.meta = client.meta

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def get_object(self, **kw: Any) -> dict[str, Any]:
        resp = self._client.get_object(**kw)
        if kw.get("Range", "bytes=0-").startswith("bytes=0-"):
            return resp
        body = resp["Body"].read()
        return {**resp, "Body": io.BytesIO(body[: len(body) // 2])}


def test_short_body_fails_the_whole_load_and_caches_nothing(model: Model, client: Any, tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "cache", max_bytes=10 << 20)
    with pytest.raises(StreamError, match=r"short read: got \d+ of \d+ bytes at offset \d+ after 3 attempts"):
        load(ShortBodies(client), model.uri, cache=cache)
    cache.flush()
    assert cache.entries() == []
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".lock"]  # no temp left behind


def test_object_replaced_during_load_is_refused(model: Model, client: Any, tmp_path: Path) -> None:
    listed = resolve_objects(client, model.uri)
    write_shards(tmp_path / "v2", seed=2)
    client.put_object(Bucket=model.bucket, Key=model.key(SHARDS[0]),
                      Body=(tmp_path / "v2" / SHARDS[0]).read_bytes())
    # GETs carry If-Match with the listed ETag: no mixing of two versions' bytes.
    with pytest.raises(S3ObjectChanged, match=rf"{SHARDS[0]}: the object changed while it was being read"):
        load(client, listed)


def test_bad_options_are_refused(model: Model, client: Any) -> None:
    with pytest.raises(ValueError, match="chunk_bytes must be >= 1"):
        load_s3(client, model.uri, chunk_bytes=0)
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        load_s3(client, model.uri, concurrency=0)
    with pytest.raises(ValueError, match="need 0 <= tp_rank < tp_size"):
        load_s3(client, model.uri, tp_rank=2, tp_size=2)


# --- helpers ------------------------------------------------------------------------


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _etag(client: Any, model: Model, name: str) -> str:
    return str(client.head_object(Bucket=model.bucket, Key=model.key(name))["ETag"]).strip('"')


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()



# --- cache tiers: host memory, then local disk ----------------------------------------


def _tiers(tmp_path: Path, budget: int = 10 << 20) -> tuple[CacheTier, CacheTier]:
    return (CacheTier("host", DiskCache(tmp_path / "host", budget)),
            CacheTier("disk", DiskCache(tmp_path / "disk", budget)))


def _entry(tier: CacheTier, client: Any, model: Model, name: str) -> Path:
    return tier.cache.root / entry_name(model.bucket, model.key(name), _etag(client, model, name))


def test_tiers_fill_from_the_store_then_serve_the_fastest_copy_and_refill_it(
    model: Model, client: Any, tmp_path: Path
) -> None:
    host, disk = _tiers(tmp_path)
    total = sum(p.stat().st_size for p in model.files)
    first = load(client, model.uri, caches=[host, disk])
    assert [f.source for f in first.files] == ["s3", "s3"]
    assert first.bytes_by_source() == {"s3": total}
    for t in (host, disk):
        t.cache.flush()
        assert t.cache.models() == [CachedModel(model.uri, total, total, 2, 2)]

    calls = Calls(client)
    second = load(client, model.uri, caches=[host, disk])
    assert [f.source for f in second.files] == ["host", "host"]
    assert calls.count("GetObject") == 0
    assert_same(second.tensors, model.expected())

    host.cache.clear()  # the host copy given back (e.g. its worker stopped)
    assert host.cache.models() == []
    third = load(client, model.uri, caches=[host, disk])
    assert [f.source for f in third.files] == ["disk", "disk"]
    assert_same(third.tensors, model.expected())
    host.cache.flush()
    for p in model.files:  # refilled from the disk copy as it was read
        assert _entry(host, client, model, p.name).read_bytes() == p.read_bytes()
    assert [f.source for f in load(client, model.uri, caches=[host, disk]).files] == ["host", "host"]


def _corrupt_host_copy(model: Model, client: Any, tmp_path: Path) -> tuple[CacheTier, CacheTier, dict[str, str], Path]:
    """Both tiers filled by a checked load, then two bytes of the host copy of the second
    shard changed (its header still valid: only the hash sees it); the tiers, the
    sha256 per key and that entry."""
    host, disk = _tiers(tmp_path)
    sha = {model.key(p.name): _sha256(p) for p in model.files}
    load(client, model.uri, caches=[host, disk], verify_sha256=sha)
    host.cache.flush()
    disk.cache.flush()
    entry = _entry(host, client, model, SHARDS[1])
    _overwrite(entry, entry.stat().st_size - 2, b"\xa5\xa5")
    return host, disk, sha, entry


def test_corrupt_host_copy_is_caught_by_sha256_served_from_disk_and_rewritten(
    model: Model, client: Any, tmp_path: Path
) -> None:
    host, disk, sha, entry = _corrupt_host_copy(model, client, tmp_path)

    calls = Calls(client)
    result = load(client, model.uri, caches=[host, disk], verify_sha256=sha)
    assert [f.source for f in result.files] == ["host", "disk"]
    assert [(u, t) for u, t, _ in result.rejected] == [(f"{model.uri}/{SHARDS[1]}", "host")]
    assert calls.count("GetObject") == 0
    assert_same(result.tensors, model.expected())
    host.cache.flush()
    assert entry.read_bytes() == model.files[1].read_bytes()


def test_corrupt_copies_in_every_tier_end_in_the_store(model: Model, client: Any, tmp_path: Path) -> None:
    host, disk = _tiers(tmp_path)
    sha = {model.key(p.name): _sha256(p) for p in model.files}
    load(client, model.uri, caches=[host, disk], verify_sha256=sha)
    for t in (host, disk):
        t.cache.flush()
        entry = _entry(t, client, model, SHARDS[0])
        _overwrite(entry, entry.stat().st_size - 1, b"\x00" if entry.read_bytes()[-1:] != b"\x00" else b"\x01")
    result = load(client, model.uri, caches=[host, disk], verify_sha256=sha)
    assert [f.source for f in result.files] == ["s3", "host"]
    assert_same(result.tensors, model.expected())


def test_an_unhashed_tier_skips_the_sha256_and_copies_to_no_other_tier(
    model: Model, client: Any, tmp_path: Path
) -> None:
    # The caller checks every tensor itself (a swap): the host copy's bytes come as they
    # are, corrupt or not, and nothing is copied from them into another tier.
    host, disk, sha, _ = _corrupt_host_copy(model, client, tmp_path)
    disk.cache.clear()

    result = load(client, model.uri, caches=[host, disk], verify_sha256=sha, unhashed_tiers=frozenset({"host"}))
    assert [f.source for f in result.files] == ["host", "host"] and not result.rejected
    assert not any(f.cache_written for f in result.files)
    disk.cache.flush()
    assert disk.cache.models() == []
    # Hashed as before when the tier is not named: the corrupt copy is caught.
    checked = load(client, model.uri, caches=[host, disk], verify_sha256=sha)
    assert [(u, t) for u, t, _ in checked.rejected] == [(f"{model.uri}/{SHARDS[1]}", "host")]
    assert_same(checked.tensors, model.expected())


def test_a_full_file_system_degrades_to_the_store(model: Model, client: Any, tmp_path: Path) -> None:
    sizes = [p.stat().st_size for p in model.files]
    # Room for the first file only: the second is not started (the free space is
    # counted less what the first file's writer has yet to fill).
    with small_filesystem(tmp_path / "disk", sizes[0] + (256 << 10)) as root:
        disk = CacheTier("disk", DiskCache(root, 10 << 20))
        result = load(client, model.uri, caches=[disk])
        assert [f.source for f in result.files] == ["s3", "s3"]
        assert [f.cache_written for f in result.files] == [True, False]
        assert_same(result.tensors, model.expected())
        disk.cache.flush()
        assert [e.size for e in disk.cache.entries()] == [sizes[0]]

        # Full: nothing is cached, the load is whole.
        disk.cache.clear()
        filler = fill_filesystem(root)
        result = load(client, model.uri, caches=[disk])
        assert [f.source for f in result.files] == ["s3", "s3"]
        assert_same(result.tensors, model.expected())
        disk.cache.flush()
        assert disk.cache.entries() == []
        filler.unlink()


def test_a_file_system_that_fills_during_the_writes_drops_the_entries_not_the_load(
    model: Model, client: Any, tmp_path: Path
) -> None:
    with small_filesystem(tmp_path / "disk", 8 << 20) as root:
        cache = GatedCache(root, 10 << 20)
        result = load(client, model.uri, caches=[CacheTier("disk", cache)])
        assert all(f.cache_written for f in result.files)  # started: there was room
        filler = fill_filesystem(root)  # then the disk filled before the writes ran
        cache.gate.set()
        cache.flush()
        assert_same(result.tensors, model.expected())
        assert cache.entries() == []
        assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]  # no partial file left
        assert cache.models() == []
        filler.unlink()
        assert [f.source for f in load(client, model.uri, caches=[CacheTier("disk", cache)]).files] == ["s3", "s3"]
