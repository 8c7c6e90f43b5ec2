"""Pre-faulted host buffers: loads land in the pool's memory and reuse it once released."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.weight_streaming.support import assert_same, random_tensor
from weight_streaming.host_pool import HostBufferPool
from weight_streaming.streamer import LoadResult, load_many


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    gen = torch.Generator().manual_seed(3)
    d = tmp_path_factory.mktemp("pool")
    paths = []
    for i, shape in enumerate([(300, 301), (77, 5)]):
        path = d / f"s{i}.safetensors"
        save_file({f"t{i}": random_tensor(torch.bfloat16, shape, gen),
                   f"u{i}": random_tensor(torch.int8, (33,), gen)}, str(path))
        paths.append(path)
    return paths


def expected(paths: list[Path]) -> dict[str, torch.Tensor]:
    want: dict[str, torch.Tensor] = {}
    for p in paths:
        want.update(load_file(str(p)))
    return want


def block_range(pool: HostBufferPool) -> list[tuple[int, int]]:
    return [(b.data_ptr(), b.data_ptr() + b.numel()) for b in pool._blocks]


def inside(result: LoadResult, ranges: list[tuple[int, int]]) -> bool:
    return all(any(lo <= t.data_ptr() < hi for lo, hi in ranges) for t in result.tensors.values() if t.numel())


def test_load_lands_in_the_reserved_block_and_reuses_it(shards: list[Path]) -> None:
    pool = HostBufferPool()
    pool.reserve(1 << 20)
    ranges = block_range(pool)
    first = load_many(shards, chunk_bytes=4096, concurrency=4, host_pool=pool)
    assert_same(first.tensors, expected(shards))
    assert inside(first, ranges)
    assert pool.nbytes == 1 << 20

    # While the first load's tensors live, its block is taken: a second load gets new memory.
    second = load_many(shards, host_pool=pool)
    assert not inside(second, ranges)
    assert pool.nbytes > 1 << 20
    assert_same(second.tensors, expected(shards))

    # Once they are gone, the next load reuses the (already faulted) block again.
    del first
    gc.collect()
    third = load_many(shards, host_pool=pool)
    assert inside(third, ranges)
    assert_same(third.tensors, expected(shards))


def test_one_tensor_kept_keeps_the_block_in_use(shards: list[Path]) -> None:
    pool = HostBufferPool()
    pool.reserve(1 << 20)
    ranges = block_range(pool)
    result = load_many(shards, host_pool=pool)
    kept = result.tensors["u1"]
    before = kept.clone()
    del result
    gc.collect()
    again = load_many(shards, host_pool=pool)
    assert not inside(again, ranges)  # the block was not handed out under `kept`
    assert torch.equal(kept, before)


def test_reserve_is_idempotent_and_clear_drops_free_blocks(shards: list[Path]) -> None:
    pool = HostBufferPool()
    pool.reserve(4096)
    pool.reserve(4096)  # a free block that big exists: nothing new
    assert pool.nbytes == 4096
    held = load_many(shards, host_pool=pool)  # needs more than 4096: a new block, kept
    assert pool.nbytes > 4096
    pool.clear()  # drops the free 4 KiB block, keeps the one in use
    assert pool.nbytes == sum(b.numel() for b in pool._blocks) and len(pool._blocks) == 1
    del held
    gc.collect()
    pool.clear()
    assert pool.nbytes == 0
