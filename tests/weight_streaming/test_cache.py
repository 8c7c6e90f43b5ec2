"""The disk cache tier on its own: budget, LRU, atomic commits, versions, concurrency."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from weight_streaming import cache as cache_module
from weight_streaming.cache import CachedModel, CacheError, DiskCache, entry_name


def put(cache: DiskCache, key: str, data: bytes, etag: str = "e1") -> bool:
    """Write and commit one entry the way the loader does; False if it was not cached."""
    w = cache.begin("b", key, etag, len(data))
    if w is None:
        return False
    half = len(data) // 2
    w.write(half, data[half:])  # out of order, as parallel chunks land
    w.write(0, data[:half])
    w.commit().result()
    return True


def names(cache: DiskCache) -> list[str]:
    """Keys of the committed entries, least recently used first."""
    by_name = {entry_name("b", k, "e1"): k for k in "ABCDEFGH"}
    return [by_name.get(e.path.name, e.path.name) for e in cache.entries()]


def test_hit_returns_the_bytes_and_miss_returns_none(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    assert cache.lookup("b", "A", "e1", 3) is None
    assert put(cache, "A", b"abc")
    path = cache.lookup("b", "A", "e1", 3)
    assert path is not None and path.read_bytes() == b"abc"
    # Same key, another ETag: a different version, not served.
    assert cache.lookup("b", "A", "e2", 3) is None


def test_budget_evicts_least_recently_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A clock a millisecond further on at every reading: distinct mtimes on any file system.
    ticks = itertools.count(1_700_000_000 * 10**9, 10**6)
    monkeypatch.setattr(cache_module.time, "time_ns", lambda: next(ticks))
    cache = DiskCache(tmp_path, max_bytes=300)
    for k in "ABC":
        assert put(cache, k, bytes(100))
    assert cache.lookup("b", "A", "e1", 100) is not None  # A is now the most recent
    # 300 used + 100 new > 300: evict the least recently used, which is B (not A).
    assert put(cache, "D", bytes(100))
    assert names(cache) == ["C", "A", "D"]
    assert cache.used_bytes() == 300
    # 250 more needs 250 freed: C (100), A (100) and D (100) go, oldest first, until it fits.
    assert put(cache, "E", bytes(250))
    assert names(cache) == ["E"]
    assert cache.used_bytes() == 250


def test_file_larger_than_the_budget_is_not_cached(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=100)
    assert put(cache, "A", bytes(60))
    assert cache.begin("b", "B", "e1", 101) is None
    # Nothing was evicted for an object that could never fit.
    assert names(cache) == ["A"]
    assert not list(tmp_path.glob(".tmp-*"))


def test_uncommitted_writes_count_against_the_budget(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=300)
    assert put(cache, "A", bytes(100))
    w1 = cache.begin("b", "B", "e1", 200)
    assert w1 is not None
    # 100 (A) + 200 (B in flight) = 300; C (200) fits only if 200 in flight + 200 <= 300: no.
    assert cache.begin("b", "C", "e1", 200) is None
    assert names(cache) == ["A"]  # not evicted in vain
    # C (100): 200 in flight + 100 = 300 fits once A goes.
    w2 = cache.begin("b", "C", "e1", 100)
    assert w2 is not None
    assert names(cache) == []
    w1.abort()
    w2.abort()
    assert cache.used_bytes() == 0


def test_entry_is_invisible_until_committed_and_incomplete_is_never_committed(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    w = cache.begin("b", "A", "e1", 10)
    assert w is not None
    w.write(0, b"01234")
    assert cache.lookup("b", "A", "e1", 10) is None
    assert w.tmp.exists() and w.tmp.name.startswith(".tmp-")
    fut = w.commit()  # 5 of 10 bytes written
    with pytest.raises(CacheError, match="wrote 5 of 10 bytes"):
        fut.result()
    assert cache.lookup("b", "A", "e1", 10) is None
    assert list(tmp_path.iterdir()) == [tmp_path / ".lock"]


def test_abort_discards_and_skips_queued_writes(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    w = cache.begin("b", "A", "e1", 4)
    assert w is not None
    w.abort()
    w.write_later(0, memoryview(b"abcd"))  # after abort: skipped, no error
    cache.flush()
    assert not w.tmp.exists()
    with pytest.raises(CacheError, match="already committed or aborted"):
        w.commit()


def test_write_later_then_commit_orders_writes_before_the_rename(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1 << 20)
    data = os.urandom(64 * 1024)
    w = cache.begin("b", "A", "e1", len(data))
    assert w is not None
    for off in range(0, len(data), 4096):
        w.write_later(off, memoryview(data)[off : off + 4096])
    w.commit()
    # lookup waits for the pending commit of that entry.
    path = cache.lookup("b", "A", "e1", len(data))
    assert path is not None and path.read_bytes() == data


def test_wrong_size_entry_is_removed_on_lookup(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    assert put(cache, "A", b"x" * 50)
    path = tmp_path / entry_name("b", "A", "e1")
    os.truncate(path, 20)  # a truncated file must never be served
    assert cache.lookup("b", "A", "e1", 50) is None
    assert not path.exists()


def test_new_version_replaces_old_one(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    assert put(cache, "A", b"old", etag="v1")
    assert put(cache, "B", b"other", etag="v1")
    assert put(cache, "A", b"new", etag="v2")
    assert cache.lookup("b", "A", "v1", 3) is None
    hit = cache.lookup("b", "A", "v2", 3)
    assert hit is not None and hit.read_bytes() == b"new"
    assert cache.lookup("b", "B", "v1", 5) is not None  # another object is untouched


def test_evict(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    assert put(cache, "A", b"abc")
    assert cache.evict("b", "A", "e1") is True
    assert cache.evict("b", "A", "e1") is False
    assert cache.lookup("b", "A", "e1", 3) is None


def test_temp_files_of_dead_processes_are_removed_on_open(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = tmp_path / f".tmp-{dead.stdout.strip()}-abcd1234-{entry_name('b', 'A', 'e1')}"
    stale.write_bytes(bytes(10))
    live = tmp_path / f".tmp-{os.getpid()}-abcd1234-{entry_name('b', 'B', 'e1')}"
    live.write_bytes(bytes(10))
    DiskCache(tmp_path, max_bytes=1000)
    assert not stale.exists()
    assert live.exists()  # a writer in a live process (this one) is left alone


def test_concurrent_writers_never_exceed_the_budget(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, cache.used_bytes())

    def writer(i: int) -> None:
        for j in range(10):
            data = bytes([i]) * 300
            w = cache.begin("b", f"k{i}-{j}", "e1", len(data))
            if w is not None:
                w.write(0, data)
                w.commit().result()

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    cache.close()
    assert peak <= 1000
    assert cache.used_bytes() <= 1000
    for e in cache.entries():  # every committed entry is whole
        data = e.path.read_bytes()
        assert len(data) == 300 and len(set(data)) == 1


def test_negative_budget_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        DiskCache(tmp_path, max_bytes=-1)


def test_model_records_report_only_what_is_still_cached(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    assert cache.models() == []
    put(cache, "A", b"x" * 10)
    put(cache, "B", b"y" * 20)
    cache.record_model("s3://b/m", [("b", "A", "e1", 10), ("b", "B", "e1", 20)])
    assert cache.models() == [CachedModel("s3://b/m", 30, 30, 2, 2)]
    assert cache.models()[0].complete
    cache.evict("b", "B", "e1")
    [partial] = cache.models()
    assert (partial.bytes, partial.total_bytes, partial.complete) == (10, 30, False)
    # A file of another size under the same name is not the recorded one.
    cache.record_model("s3://b/other", [("b", "A", "e1", 11)])
    assert [m.uri for m in cache.models()] == ["s3://b/m"]
    cache.evict("b", "A", "e1")
    assert cache.models() == []
    assert not list((tmp_path / ".models").glob("*.json"))  # records of nothing are removed


def test_clear_removes_entries_and_records(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    put(cache, "A", b"abc")
    cache.record_model("s3://b/m", [("b", "A", "e1", 3)])
    cache.clear()
    assert cache.entries() == [] and cache.models() == []
