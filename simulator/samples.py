"""A run's latency samples in bounded memory: every value while a model has few, a
histogram of fine logarithmic buckets once it has many.

A day of 10,000 requests a second is 864 million time-to-first-token samples: as a list
of floats, about 30 GB. :class:`Samples` keeps each value exactly (8 bytes each, in an
``array``) up to :data:`EXACT_MAX`, and past it folds them into buckets of relative width
``2 ** (1 / BUCKETS_PER_DOUBLING) - 1`` (0.068 %), counted per bucket. Percentiles are
by nearest rank (:func:`percentiles`): exact while every
value is kept, and from a folded histogram the bucket's geometric middle, within 0.034 %
of the exact value. Samples merge (a run's total from its models).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable

import numpy as np

# Values kept as they are, per Samples (8 MiB); past it, the histogram.
EXACT_MAX = 1 << 20
BUCKETS_PER_DOUBLING = 1024
def bucket_of(x: float) -> int:
    """The histogram bucket of a value above 0 (values at or under 0 are counted apart)."""
    return math.floor(math.log2(x) * BUCKETS_PER_DOUBLING)


def bucket_value(k: int) -> float:
    """A bucket's representative value: its geometric middle."""
    return 2.0 ** ((k + 0.5) / BUCKETS_PER_DOUBLING)


class Samples:
    """Values added one at a time (:meth:`append`) or in bulk (:meth:`add_many`);
    :meth:`percentiles` p50/p90/p99 by nearest rank. Folded, the histogram is an array
    of counts over the buckets from ``_lo`` on (grown as values come), and zeros apart."""

    __slots__ = ("_exact", "_counts", "_lo", "_zeros", "_max")

    def __init__(self, values: Iterable[float] = (), *, exact_max: int | None = None) -> None:
        self._exact: array[float] | None = array("d", values)
        self._counts = np.zeros(0, dtype=np.int64)
        self._lo = 0
        self._zeros = 0
        self._max = EXACT_MAX if exact_max is None else exact_max
        if len(self._exact) > self._max:
            self._fold()

    def __len__(self) -> int:
        return len(self._exact) if self._exact is not None else int(self._counts.sum()) + self._zeros

    @property
    def exact(self) -> bool:
        """Whether every value is kept as it was added."""
        return self._exact is not None

    def append(self, x: float) -> None:
        ex = self._exact
        if ex is not None:
            ex.append(x)
            if len(ex) > self._max:
                self._fold()
            return
        if x <= 0:
            self._zeros += 1
            return
        k = bucket_of(x)
        self._grow(k, k)
        self._counts[k - self._lo] += 1

    def add_many(self, xs: np.ndarray) -> None:
        """Add every value of a float array."""
        if len(xs) == 0:
            return
        ex = self._exact
        if ex is not None and len(ex) + len(xs) <= self._max:
            ex.extend(np.asarray(xs, dtype=np.float64).tolist())
            return
        if ex is not None:
            self._fold()
        self._count(np.asarray(xs, dtype=np.float64))

    def extend(self, other: Samples) -> None:
        """Add every value of ``other``."""
        if other._exact is not None:
            self.add_many(np.frombuffer(other._exact, dtype=np.float64) if len(other._exact) else np.empty(0))
            return
        if self._exact is not None:
            self._fold()
        self._zeros += other._zeros
        if len(other._counts):
            self._grow(other._lo, other._lo + len(other._counts) - 1)
            at = other._lo - self._lo
            self._counts[at:at + len(other._counts)] += other._counts

    def values(self) -> list[float]:
        """Every value in the order added (exact only)."""
        if self._exact is None:
            raise ValueError("these samples are folded into a histogram: their values are not kept")
        return self._exact.tolist()

    def percentiles(self) -> dict[str, float | None]:
        """p50, p90, p99 by nearest rank (None when there are none)."""
        if self._exact is not None:
            return percentiles(self._exact)
        n = len(self)
        if not n:
            return {"p50": None, "p90": None, "p99": None}
        cum = np.cumsum(self._counts)
        out: dict[str, float | None] = {}
        for q in (50, 90, 99):
            rank = min(n, max(1, math.ceil(q / 100 * n)))
            if rank <= self._zeros:
                out[f"p{q}"] = 0.0
            else:
                k = int(np.searchsorted(cum, rank - self._zeros, "left"))
                out[f"p{q}"] = bucket_value(k + self._lo)
        return out

    def _grow(self, lo: int, hi: int) -> None:
        """Make room for buckets ``lo`` to ``hi``."""
        c = self._counts
        if not len(c):
            self._lo, self._counts = lo, np.zeros(hi - lo + 1, dtype=np.int64)
            return
        if lo >= self._lo and hi < self._lo + len(c):
            return
        new_lo = min(lo, self._lo)
        grown = np.zeros(max(hi, self._lo + len(c) - 1) - new_lo + 1, dtype=np.int64)
        grown[self._lo - new_lo:self._lo - new_lo + len(c)] = c
        self._lo, self._counts = new_lo, grown

    def _fold(self) -> None:
        ex = self._exact
        assert ex is not None
        self._exact = None
        self._count(np.frombuffer(ex, dtype=np.float64) if len(ex) else np.empty(0))

    def _count(self, xs: np.ndarray) -> None:
        pos = xs[xs > 0]
        self._zeros += len(xs) - len(pos)
        if not len(pos):
            return
        keys = np.floor(np.log2(pos) * BUCKETS_PER_DOUBLING).astype(np.int64)
        lo, hi = int(keys.min()), int(keys.max())
        self._grow(lo, hi)
        at = lo - self._lo
        self._counts[at:at + hi - lo + 1] += np.bincount(keys - lo, minlength=hi - lo + 1)


def percentiles(values: Iterable[float]) -> dict[str, float | None]:
    """p50, p90, p99 of every value, by nearest rank (None when there are none)."""
    s = sorted(values)
    n = len(s)
    if not n:
        return {"p50": None, "p90": None, "p99": None}
    return {f"p{q}": s[min(n - 1, max(0, math.ceil(q / 100 * n) - 1))] for q in (50, 90, 99)}
