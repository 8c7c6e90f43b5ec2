"""Helpers shared by the weight_streaming tests: tensors with random bits, exact
comparison, and a fake GPU whose copies run as late as possible."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch


def raw_bytes(t: torch.Tensor) -> bytes:
    """The tensor's bytes in row-major order (works for 0-d, empty, bool and fp8)."""
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype, name
        assert tuple(g.shape) == tuple(w.shape), name
        assert raw_bytes(g) == raw_bytes(w), name


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Random bit patterns (NaNs included): a byte out of place cannot go unnoticed."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    n = math.prod(shape) * dtype.itemsize
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen).view(dtype).reshape(shape)


TORCH_DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    *[getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)],
    *[getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)],
]


class LateCuda:
    """Stands in for ``streamer._cuda``: an async copy runs only when an event or the
    stream it was queued behind is waited for, and reads its source then. A reader that
    refills a staging slot before the copy out of it finished ships the wrong bytes."""

    def __init__(self) -> None:
        self.queue: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.done = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()

    def drain(self, upto: int) -> None:
        with self.lock:
            while self.done < upto:
                dst, src = self.queue[self.done]
                dst.copy_(src)
                self.done += 1

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def set_device(self, device: torch.device) -> None:
        pass

    def empty(self, nbytes: int, device: torch.device) -> torch.Tensor:
        return torch.full((nbytes,), 0xEE, dtype=torch.uint8)

    def empty_pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def side_stream(self, device: torch.device) -> object:
        cuda = self

        class Stream:
            def synchronize(self) -> None:
                cuda.drain(len(cuda.queue))

        return Stream()

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, stream: object) -> object:
        with self.lock:
            self.queue.append((dst, src))
            position = len(self.queue)
            self.max_in_flight = max(self.max_in_flight, position - self.done)
        cuda = self

        class Event:
            def synchronize(self) -> None:
                cuda.drain(position)

        return Event()

    def synchronize_current(self, device: torch.device) -> None:
        pass


@contextlib.contextmanager
def small_filesystem(path: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``path`` (a file system that fills up for
    real). Needs root, as the dev and CI machines run tests."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"cannot mount a {size_bytes}-byte tmpfs at {path} (the test needs root): {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill_filesystem(path: Path) -> Path:
    """Write a file that takes every free byte of the file system under ``path``."""
    filler = path / ".filler"  # a dot file: not a cache entry
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    chunk = b"\0" * 4096
    try:
        while True:
            os.write(fd, chunk)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler
