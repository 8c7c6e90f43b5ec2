"""Host memory for CPU loads, faulted in ahead of time and reused across loads.

Why: on the CPU path the tensors a load returns are views of fresh host buffers, and
the first write to each 4 KiB page of fresh memory is a page fault. For 1 GiB that is
262,144 faults, ~0.45 s of kernel CPU on the 2-core dev VM: as much CPU as receiving
the bytes from the store, so on a CPU-bound machine it costs ~20 % of the load
(docs/BENCHMARKS.md). A standby worker has idle time before it is assigned a model:
``reserve`` spends it faulting the memory in, and the load then writes into mapped
pages. (Transparent huge pages were tried instead: on this VM assembling 2 MiB pages
cost more CPU than the faults they save.)

A block is reused once nothing references its memory any more (every tensor of the
load that used it is gone), which is read from the storage's reference count.
Opt-in: pass ``host_pool=`` to ``load_many`` / ``load_s3``; the memory stays with the
pool (``clear`` releases the free blocks).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

# Slices of a block start on page boundaries (which also keeps the streamer's
# 16-byte alignment of tensors).
_SLICE_ALIGN = 4096
_use_count = getattr(torch._C, "_storage_Use_Count", None)


class HostBufferPool:
    """Blocks of host memory handed out as per-file load buffers (thread-safe)."""

    def __init__(self) -> None:
        self._blocks: list[torch.Tensor] = []
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes held by the pool, free or in use."""
        with self._lock:
            return sum(b.numel() for b in self._blocks)

    def reserve(self, nbytes: int) -> None:
        """Make sure a free block of at least ``nbytes`` exists, with every page faulted in.

        Slow (it touches every page): call it while idle, e.g. in standby, with the
        size of the model about to be loaded (the sum of its files' sizes is enough).
        """
        with self._lock:
            if any(b.numel() >= nbytes and _is_free(b) for b in self._blocks):
                return
            block = torch.empty(nbytes, dtype=torch.uint8)
            block.fill_(0)  # the first touch, now rather than during the load
            self._blocks.append(block)

    def take_many(self, sizes: Sequence[int]) -> list[torch.Tensor]:
        """One buffer per size, slices of the smallest free block that holds them all
        (a new block, kept for reuse, when none does)."""
        offsets = []
        total = 0
        for n in sizes:
            offsets.append(total)
            total += -(-n // _SLICE_ALIGN) * _SLICE_ALIGN
        with self._lock:
            free = [b for b in self._blocks if b.numel() >= total and _is_free(b)]
            if free:
                block = min(free, key=lambda b: b.numel())
            else:
                block = torch.empty(max(total, 1), dtype=torch.uint8)
                self._blocks.append(block)
            # Created under the lock: once sliced, the block counts as in use.
            return [block[o : o + n] for o, n in zip(offsets, sizes, strict=True)]

    def clear(self) -> None:
        """Drop the free blocks (their memory goes back to the system once unreferenced)."""
        with self._lock:
            self._blocks = [b for b in self._blocks if not _is_free(b)]


def _is_free(block: torch.Tensor) -> bool:
    """Nothing but the pool references the block's memory."""
    if _use_count is None:  # a torch without the counter: never reuse (correct, just slower)
        return False
    # The pool's tensor and the temporary storage object made here: 2 references.
    return bool(_use_count(block.untyped_storage()._cdata) <= 2)
