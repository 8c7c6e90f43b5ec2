"""The streamer must return exactly what ``safetensors.torch.load_file`` returns, byte for byte."""

from __future__ import annotations

import io
import json
import math
import os
import struct
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.weight_streaming.support import (
    TORCH_DTYPES,
    LateCuda,
    assert_same,
    random_tensor,
    raw_bytes,
)
from weight_streaming import streamer
from weight_streaming.s3_source import S3RangeSource
from weight_streaming.safetensors_header import MalformedSafetensors
from weight_streaming.sources import FileRangeSource, StreamError
from weight_streaming.streamer import load, load_dir, load_many, read_header

# --- helpers ------------------------------------------------------------------------


def handcrafted(
    path: Path, entries: list[tuple[str, str, list[int], bytes]], *, pad_to: int = 1
) -> None:
    """Write a safetensors file byte by byte, tensors laid out in the given order."""
    header: dict[str, object] = {}
    pos = 0
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % pad_to)
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + b"".join(e[3] for e in entries))


def write_raw(path: Path, header: object, data: bytes = b"") -> None:
    hb = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + data)


class MemorySource:
    """An in-memory RangeSource: exercises the non-file header path and failure injection."""

    def __init__(
        self, data: bytes, *, fail_at: int | None = None, exc: Exception | None = None
    ) -> None:
        self.data = data
        self.fail_at = fail_at
        self.exc = exc
        self.reads: list[tuple[int, int]] = []

    def size(self) -> int:
        return len(self.data)

    def read_into(self, offset: int, view: memoryview) -> None:
        self.reads.append((offset, len(view)))
        # The first read is the header probe, which covers the whole of a small file:
        # failures are injected into data reads only.
        is_probe = len(self.reads) == 1
        if (
            not is_probe
            and self.fail_at is not None
            and offset <= self.fail_at < offset + len(view)
        ):
            raise self.exc or StreamError(f"mem: short read at {offset}")
        view[:] = self.data[offset : offset + len(view)]

    def __repr__(self) -> str:
        return "MemorySource()"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every dtype, with odd element counts, scalars and zero-size tensors."""
    gen = torch.Generator().manual_seed(0)
    tensors: dict[str, torch.Tensor] = {}
    for dtype in TORCH_DTYPES:
        tag = str(dtype).removeprefix("torch.")
        tensors[f"{tag}.matrix"] = random_tensor(dtype, (7, 13), gen)
        tensors[f"{tag}.scalar"] = random_tensor(dtype, (), gen)
        tensors[f"{tag}.empty"] = random_tensor(dtype, (3, 0, 2), gen)
    tensors["big.bf16"] = random_tensor(torch.bfloat16, (64, 40), gen)
    path = tmp_path_factory.mktemp("model") / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


# --- bit-exact loads ----------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 8])
@pytest.mark.parametrize(
    "chunk_bytes",
    [
        3,  # smaller than most tensors and not a multiple of any element size
        1000,  # neither: splits tensors mid-element
        streamer.DEFAULT_CHUNK_BYTES,  # the whole file in one chunk
    ],
)
def test_load_equals_safetensors_bit_for_bit(
    model_file: Path, chunk_bytes: int, concurrency: int
) -> None:
    want = load_file(str(model_file))
    result = load(model_file, chunk_bytes=chunk_bytes, concurrency=concurrency)
    assert_same(result.tensors, want)
    header = read_header(FileRangeSource(model_file))
    assert result.stats.bytes == header.data_len
    assert result.stats.chunks == math.ceil(header.data_len / chunk_bytes)


def test_tensors_are_views_of_one_host_buffer(model_file: Path) -> None:
    result = load(model_file, chunk_bytes=4096)
    storages = {t.untyped_storage().data_ptr() for t in result.tensors.values() if t.numel()}
    # safetensors aligns every tensor, so nothing needed a private copy.
    assert len(storages) == 1


def test_a_mapped_file_equals_safetensors_and_writes_stay_private(model_file: Path) -> None:
    want = load_file(str(model_file))
    before = model_file.read_bytes()
    mapped = streamer.map_file(model_file)
    assert_same(mapped, want)
    # Views of one mapping, nothing copied; written to, the file does not change.
    assert len({t.untyped_storage().data_ptr() for t in mapped.values() if t.numel()}) == 1
    for t in mapped.values():
        if t.numel():
            t.view(-1).view(torch.uint8)[0] ^= 0xFF
    assert model_file.read_bytes() == before


def test_a_mapped_file_copies_only_misaligned_tensors(tmp_path: Path) -> None:
    path = tmp_path / "odd.safetensors"
    handcrafted(path, [("u8", "U8", [1], b"\x09"), ("f32", "F32", [2], struct.pack("<2f", 1.5, -2.0))])
    out = streamer.map_file(path)
    assert out["u8"].tolist() == [9] and out["f32"].tolist() == [1.5, -2.0]


def test_every_dtype_was_covered(model_file: Path) -> None:
    # Guards the fixture: a dtype silently dropped would make the bit test weaker.
    dtypes = {t.dtype for t in load(model_file).tensors.values()}
    assert dtypes == set(TORCH_DTYPES)


def test_progress_and_stats(model_file: Path) -> None:
    calls: list[tuple[int, int]] = []
    result = load(
        model_file, chunk_bytes=512, concurrency=4, progress=lambda d, t: calls.append((d, t))
    )
    total = result.stats.bytes
    assert calls[-1] == (total, total)
    assert all(t == total for _, t in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert result.stats.gbps == pytest.approx(total / result.stats.seconds / 1e9)


def test_memory_source_reads_header_in_two_steps_when_probe_is_small(
    model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streamer, "_HEADER_PROBE_BYTES", 16)
    src = MemorySource(model_file.read_bytes())
    result = load(src, chunk_bytes=777, concurrency=3)
    assert_same(result.tensors, load_file(str(model_file)))
    assert src.reads[0] == (0, 16)  # the probe, then the rest of the header
    assert src.reads[1][0] == 8


def test_misaligned_tensors_are_copied_to_aligned_memory(tmp_path: Path) -> None:
    # u8[1] first puts the f32 at data offset 1 and the bf16 at 13: views of the
    # uint8 buffer there are impossible, the loader must copy.
    f32 = struct.pack("<3f", 1.5, -2.25, 3e38)
    bf16 = torch.tensor([1.0, -3.0], dtype=torch.bfloat16)
    i64 = struct.pack("<2q", -(2**62), 7)
    path = tmp_path / "odd.safetensors"
    handcrafted(
        path,
        [
            ("u8", "U8", [1], b"\x09"),
            ("f32", "F32", [3], f32),
            ("bf16", "BF16", [2], raw_bytes(bf16)),
            ("i64", "I64", [2], i64),
            ("f32_2d", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
        ],
    )
    out = load(path, chunk_bytes=5, concurrency=2).tensors
    assert out["u8"].tolist() == [9]
    assert out["f32"].tolist() == list(struct.unpack("<3f", f32))
    assert raw_bytes(out["bf16"]) == raw_bytes(bf16)
    assert out["i64"].tolist() == [-(2**62), 7]
    assert out["f32_2d"].tolist() == [[1, 2], [3, 4]]
    for name in ("f32", "bf16", "i64", "f32_2d"):
        assert out[name].data_ptr() % out[name].element_size() == 0, name
    # Rank 1's rows of the misaligned 2-D tensor start at a misaligned offset too.
    part = load(path, tp_rank=1, tp_size=2, shard_dims=lambda n: 0 if n == "f32_2d" else None)
    assert part.tensors["f32_2d"].tolist() == [[3, 4]]


# --- tensor parallelism -------------------------------------------------------------


@pytest.fixture(scope="module")
def tp_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gen = torch.Generator().manual_seed(1)
    tensors = {
        "q.weight": random_tensor(torch.bfloat16, (8, 6), gen),
        "odd_rows": random_tensor(torch.bfloat16, (5, 3), gen),  # 5 rows: chunks of 3 and 2
        "o.weight": random_tensor(torch.float32, (6, 10), gen),
        "cube": random_tensor(torch.int16, (3, 5, 4), gen),
        "norm": random_tensor(torch.float32, (6,), gen),
        "flags": random_tensor(torch.bool, (4, 2), gen),
        "f8": random_tensor(torch.float8_e4m3fn, (6, 7), gen),
        "zero_rows": random_tensor(torch.float32, (0, 4), gen),
    }
    path = tmp_path_factory.mktemp("tp") / "tp.safetensors"
    save_file(tensors, str(path))
    return path


SPLITS: dict[str, int] = {
    "q.weight": 0,
    "odd_rows": 0,
    "o.weight": 1,
    "cube": 1,
    "flags": -1,
    "f8": 0,
    "zero_rows": 0,
}


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("chunk_bytes", [5, 1 << 20])
def test_tp_split_of_two_equals_chunk(tp_file: Path, rank: int, chunk_bytes: int) -> None:
    full = load_file(str(tp_file))
    want = {n: (t.chunk(2, SPLITS[n])[rank] if n in SPLITS else t) for n, t in full.items()}
    result = load(tp_file, tp_rank=rank, tp_size=2, shard_dims=SPLITS.get, chunk_bytes=chunk_bytes)
    assert_same(result.tensors, want)


def test_tp_rank_reads_only_its_rows(tp_file: Path) -> None:
    header = read_header(FileRangeSource(tp_file))
    result = load(
        tp_file, tp_rank=1, tp_size=2, shard_dims=lambda n: 0 if n == "q.weight" else None
    )
    # q.weight is bf16 8x6 = 96 bytes; rank 1 skips rows 0-3: 4 * 6 * 2 = 48 bytes.
    assert result.stats.bytes == header.data_len - 48


def test_tp_rank_past_last_chunk_gets_empty_slice(tp_file: Path) -> None:
    # torch.chunk(4) of 5 rows gives 3 chunks (2, 2, 1): rank 3 owns nothing.
    result = load(
        tp_file, tp_rank=3, tp_size=4, shard_dims=lambda n: 0 if n == "odd_rows" else None
    )
    assert tuple(result.tensors["odd_rows"].shape) == (0, 3)
    full = load_file(str(tp_file))["odd_rows"]
    r2 = load(tp_file, tp_rank=2, tp_size=4, shard_dims=lambda n: 0 if n == "odd_rows" else None)
    assert raw_bytes(r2.tensors["odd_rows"]) == raw_bytes(full.chunk(4, 0)[2])


def test_tp_bad_split_dims_are_refused(tp_file: Path) -> None:
    with pytest.raises(
        StreamError, match=r"tensor 'norm' of shape \(6,\) cannot be split along dim 1"
    ):
        load(tp_file, tp_rank=0, tp_size=2, shard_dims=lambda n: 1 if n == "norm" else None)


def test_tp_scalar_cannot_be_split(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    save_file({"s": torch.tensor(1.0)}, str(path))
    with pytest.raises(StreamError, match=r"tensor 's' of shape \(\) cannot be split along dim 0"):
        load(path, tp_rank=0, tp_size=2, shard_dims=lambda n: 0)


def test_tp_size_one_ignores_shard_dims(tp_file: Path) -> None:
    result = load(tp_file, tp_size=1, shard_dims=lambda n: 0)
    assert_same(result.tensors, load_file(str(tp_file)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk_bytes": 0}, "chunk_bytes must be >= 1"),
        ({"concurrency": 0}, "concurrency must be >= 1"),
        ({"tp_rank": 2, "tp_size": 2}, "need 0 <= tp_rank < tp_size"),
        ({"device": "meta"}, "unsupported device meta"),
    ],
)
def test_bad_options_are_refused(tp_file: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load(tp_file, **kwargs)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_without_cuda_is_a_clear_error(tp_file: Path) -> None:
    with pytest.raises(StreamError, match="CUDA is not available"):
        load(tp_file, device="cuda")


# --- the CUDA path, on a fake GPU whose copies run as late as possible ---------------


@pytest.mark.parametrize("concurrency", [1, 3])
def test_cuda_path_never_overwrites_a_slot_in_flight(
    model_file: Path, monkeypatch: pytest.MonkeyPatch, concurrency: int
) -> None:
    fake = LateCuda()
    monkeypatch.setattr(streamer, "_cuda", fake)
    result = load(model_file, device="cuda", chunk_bytes=997, concurrency=concurrency)
    assert_same(result.tensors, load_file(str(model_file)))
    assert fake.done == len(fake.queue) == result.stats.chunks
    # Copies really were left in flight while reads went on (double buffering).
    assert fake.max_in_flight >= 2


def test_cuda_path_tp_and_misaligned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streamer, "_cuda", LateCuda())
    path = tmp_path / "odd.safetensors"
    rows = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    handcrafted(path, [("u8", "U8", [1], b"\x01"), ("m", "F32", [3, 2], rows)])
    out = load(path, device="cuda", chunk_bytes=3, tp_rank=1, tp_size=2, shard_dims={"m": 1}.get)
    assert out.tensors["m"].tolist() == [[2], [4], [6]]


# --- several files ------------------------------------------------------------------


def test_load_dir_merges_shards(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(2)
    want: dict[str, torch.Tensor] = {}
    for i in range(3):
        shard = {f"layers.{i}.{k}": random_tensor(torch.bfloat16, (i + 3, 5), gen) for k in "abc"}
        save_file(shard, str(tmp_path / f"model-{i:05d}-of-00003.safetensors"))
        want.update(shard)
    (tmp_path / "config.json").write_text("{}")  # not a shard: ignored
    result = load_dir(tmp_path, chunk_bytes=64, concurrency=4)
    assert_same(result.tensors, want)
    assert result.stats.files == 3


def test_same_tensor_in_two_files_is_refused(tmp_path: Path) -> None:
    save_file({"w": torch.zeros(2)}, str(tmp_path / "a.safetensors"))
    save_file({"w": torch.ones(2)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(
        StreamError, match=r"tensor 'w' is in both .*a\.safetensors and .*b\.safetensors"
    ):
        load_many([tmp_path / "a.safetensors", tmp_path / "b.safetensors"])


def test_empty_dir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StreamError, match="no \\*.safetensors files"):
        load_dir(tmp_path)


# --- errors -------------------------------------------------------------------------


def test_truncated_file_is_refused_before_reading(model_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut.safetensors"
    data = model_file.read_bytes()
    path.write_bytes(data[:-3])
    with pytest.raises(
        MalformedSafetensors,
        match=rf"file is {len(data) - 3} bytes but its header describes {len(data)} \(truncated file\?\)",
    ):
        load(path)


def test_data_offsets_past_end_of_file_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "oob.safetensors"
    write_raw(path, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8)
    with pytest.raises(MalformedSafetensors, match="header describes"):
        load(path)


def test_malformed_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 5) + b"{oops")
    with pytest.raises(
        MalformedSafetensors, match="bad.safetensors: header is not valid UTF-8 JSON"
    ):
        load(path)


def test_header_length_past_end_is_refused_for_any_source() -> None:
    src = MemorySource(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(
        MalformedSafetensors, match="header length 100 runs past the end of the 10-byte file"
    ):
        load(src)


def test_tiny_source_is_refused() -> None:
    with pytest.raises(
        MalformedSafetensors, match="file is 3 bytes, shorter than the 8-byte header length"
    ):
        load(MemorySource(b"abc"))


def test_short_read_fails_the_whole_load(model_file: Path) -> None:
    data = model_file.read_bytes()
    src = MemorySource(data, fail_at=len(data) - 10)
    with pytest.raises(StreamError, match="mem: short read"):
        load(src, chunk_bytes=64, concurrency=1)


def test_failure_stops_issuing_reads(model_file: Path) -> None:
    data = model_file.read_bytes()
    header = read_header(MemorySource(data))
    src = MemorySource(data, fail_at=header.data_offset + 10)
    with pytest.raises(StreamError):
        load(src, chunk_bytes=64, concurrency=1)
    chunk_reads = [r for r in src.reads if r[0] >= header.data_offset]
    assert len(chunk_reads) < math.ceil(header.data_len / 64) // 2


class BlockedUntilAborted(MemorySource):
    """A source whose second data chunk waits until the load aborts it (as an S3 source
    waiting for an earlier part that will never come), and whose third fails."""

    def __init__(self, data: bytes, data_offset: int, chunk: int) -> None:
        super().__init__(data)
        self.blocked_at = data_offset + chunk
        self.fails_at = data_offset + 2 * chunk
        self.aborted = threading.Event()

    def read_into(self, offset: int, view: memoryview) -> None:
        if offset == self.blocked_at:
            assert self.aborted.wait(30), "the load never aborted its sources"
            raise StreamError("mem: aborted")
        if offset == self.fails_at:
            raise StreamError("mem: the third chunk fails")
        super().read_into(offset, view)

    def abort(self) -> None:
        self.aborted.set()


def test_a_failure_aborts_a_reader_blocked_on_its_source_and_is_what_the_load_raises(model_file: Path) -> None:
    data = model_file.read_bytes()
    header = read_header(MemorySource(data))
    src = BlockedUntilAborted(data, header.data_offset, 64)
    with pytest.raises(StreamError, match="the third chunk fails"):
        load_many([src], chunk_bytes=64, concurrency=4)
    assert src.aborted.is_set()


def test_progress_that_raises_stops_the_load_and_joins_its_readers(model_file: Path) -> None:
    before = threading.active_count()

    def progress(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        load_many([model_file], chunk_bytes=64, concurrency=4, progress=progress)
    assert threading.active_count() == before  # no reader left running


def test_source_errors_get_file_and_offset(model_file: Path) -> None:
    data = model_file.read_bytes()
    header = read_header(MemorySource(data))
    src = MemorySource(data, fail_at=header.data_offset, exc=OSError(5, "Input/output error"))
    with pytest.raises(
        StreamError,
        match=rf"MemorySource\(\): reading \d+ bytes at offset {header.data_offset} failed: .*Input/output error",
    ):
        load(src, chunk_bytes=100)


def test_header_read_errors_get_the_source_name() -> None:
    class Broken(MemorySource):
        def read_into(self, offset: int, view: memoryview) -> None:
            raise OSError(5, "Input/output error")

    with pytest.raises(
        StreamError, match=r"MemorySource\(\): reading the header failed: .*Input/output error"
    ):
        load(Broken(b"x" * 100))


def test_file_source_short_read_and_out_of_range(model_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "shrinks.safetensors"
    path.write_bytes(model_file.read_bytes())
    with FileRangeSource(path) as src:
        size = src.size()
        buf = bytearray(8)
        with pytest.raises(
            StreamError,
            match=rf"read of 8 bytes at offset {size - 4} is outside the {size}-byte object",
        ):
            src.read_into(size - 4, memoryview(buf))
        with pytest.raises(StreamError, match="outside"):
            src.read_into(-1, memoryview(buf))
        os.truncate(path, size - 100)  # 4 bytes left after offset size - 104
        with pytest.raises(
            StreamError, match=r"short read: got 4 of 100 bytes .*truncated while reading"
        ):
            src.read_into(size - 104, memoryview(bytearray(100)))


def test_dtype_torch_cannot_hold_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "u16.safetensors"
    handcrafted(path, [("ok", "F32", [1], b"\0" * 4), ("w", "U16", [2], b"\0" * 4)])
    monkeypatch.setitem(streamer._TORCH_DTYPES, "U16", None)  # as on a torch without uint16
    with pytest.raises(
        StreamError, match=r"u16.safetensors: tensor 'w': dtype U16 cannot be represented in torch"
    ):
        load(path)


@pytest.mark.parametrize(
    "dtype", [torch.complex64, getattr(torch, "float8_e8m0fnu", torch.complex64)]
)
def test_newer_safetensors_dtypes_load_bit_for_bit(tmp_path: Path, dtype: torch.dtype) -> None:
    # safetensors 0.8 writes C64 and F8_E8M0; the header parser and streamer know both.
    path = tmp_path / "new.safetensors"
    save_file({"w": (torch.arange(6, dtype=torch.float32) / 3).to(dtype)}, str(path))
    got = load(path).tensors["w"]
    want = load_file(str(path))["w"]
    assert got.dtype == want.dtype
    assert bytes(got.contiguous().view(torch.uint8).numpy()) == bytes(want.contiguous().view(torch.uint8).numpy())


def test_sub_byte_dtype_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f4.safetensors"
    handcrafted(path, [("w", "F4", [2], b"\0")])
    with pytest.raises(MalformedSafetensors, match=r"tensor 'w': sub-byte dtype F4 is not supported"):
        load(path)


# --- S3 range source (fake client: no network) ---------------------------------------


class FakeS3:
    def __init__(self, data: bytes, *, break_after: int | None = None, breaks: int = 0) -> None:
        self.data = data
        self.ranges: list[str] = []
        self.break_after = break_after
        self.breaks = breaks

    def head_object(self, Bucket: str, Key: str) -> dict[str, object]:
        return {"ContentLength": len(self.data)}

    def get_object(self, Bucket: str, Key: str, Range: str) -> dict[str, object]:
        self.ranges.append(Range)
        first, last = (int(x) for x in Range.removeprefix("bytes=").split("-"))
        body = self.data[first : last + 1]
        if self.breaks > 0 and self.break_after is not None:
            self.breaks -= 1
            return {"ContentLength": len(body), "Body": _BreakingBody(body, self.break_after)}
        return {"ContentLength": len(body), "Body": io.BytesIO(body)}


class _BreakingBody(io.BytesIO):
    """Sends ``n`` bytes, then the connection resets."""

    def __init__(self, data: bytes, n: int) -> None:
        super().__init__(data)
        self.left = n

    def readinto(self, b: object) -> int:  # type: ignore[override]
        if self.left <= 0:
            raise ConnectionResetError("reset by peer")
        mv = memoryview(b)[: self.left]  # type: ignore[arg-type]
        k = super().readinto(mv)
        self.left -= k
        return k


def test_s3_source_loads_bit_exact_with_ranged_gets(model_file: Path) -> None:
    data = model_file.read_bytes()
    client = FakeS3(data)
    result = load(S3RangeSource(client, "b", "k"), chunk_bytes=4096, concurrency=4)
    assert_same(result.tensors, load_file(str(model_file)))
    header = read_header(MemorySource(data))
    # One probe GET covers the header (the file is smaller than the probe), then chunks
    # cut at multiples of chunk_bytes in the object (S3 sources ask for aligned ranges).
    assert client.ranges[0] == f"bytes=0-{len(data) - 1}"
    assert header.data_offset < 4096 < len(data)
    data_gets = sorted(client.ranges[1:], key=lambda r: int(r.removeprefix("bytes=").split("-")[0]))
    assert data_gets == [
        f"bytes={header.data_offset}-4095",
        *(f"bytes={o}-{min(o + 4096, len(data)) - 1}" for o in range(4096, len(data), 4096)),
    ]


def test_s3_source_resumes_a_broken_body() -> None:
    client = FakeS3(bytes(range(200)), break_after=30, breaks=2)
    buf = bytearray(100)
    S3RangeSource(client, "b", "k").read_into(50, memoryview(buf))
    assert bytes(buf) == bytes(range(50, 150))
    # 30 bytes, 30 more from where it broke, then the rest in one go.
    assert client.ranges == ["bytes=50-149", "bytes=80-149", "bytes=110-149"]


def test_s3_source_gives_up_after_repeated_breaks() -> None:
    client = FakeS3(bytes(200), break_after=0, breaks=10)
    with pytest.raises(
        StreamError,
        match=r"short read: got 0 of 100 bytes at offset 0 after 3 attempts .*reset by peer",
    ):
        S3RangeSource(client, "b", "k").read_into(0, memoryview(bytearray(100)))


def test_s3_source_with_real_botocore_body(model_file: Path) -> None:
    # botocore's StreamingBody must support readinto, which the source relies on.
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    with moto.mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="weights")
        client.put_object(Bucket="weights", Key="m.safetensors", Body=model_file.read_bytes())
        result = load(
            S3RangeSource(client, "weights", "m.safetensors"), chunk_bytes=1500, concurrency=2
        )
    assert_same(result.tensors, load_file(str(model_file)))
