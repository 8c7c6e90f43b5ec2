"""Samples: exact percentiles while few, within a bucket's half-width once folded, and
memory that does not grow with the count past the fold."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import samples as samples_mod
from simulator.samples import Samples, percentiles

HALF_WIDTH = 2 ** (0.5 / samples_mod.BUCKETS_PER_DOUBLING) - 1


@given(st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), max_size=200))
def test_few_values_give_the_exact_nearest_rank(values: list[float]) -> None:
    s = Samples()
    for x in values:
        s.append(x)
    assert s.exact and len(s) == len(values) and s.percentiles() == percentiles(values)


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1), st.sampled_from(["append", "add_many", "extend"]))
def test_folded_percentiles_are_within_half_a_bucket(seed: int, how: str) -> None:
    rng = np.random.default_rng(seed)
    values = np.concatenate([rng.lognormal(-1.0, 1.5, 3000), np.zeros(40)])
    s = Samples(exact_max=500)
    if how == "append":
        for x in values.tolist():
            s.append(x)
    elif how == "add_many":
        for part in np.array_split(values, 7):
            s.add_many(part)
    else:
        for part in np.array_split(values, 7):
            s.extend(Samples(part.tolist()[:400], exact_max=500))
            s.extend(Samples(part.tolist()[400:], exact_max=500))
    assert not s.exact and len(s) == len(values)
    want = percentiles(values.tolist())
    got = s.percentiles()
    for q in ("p50", "p90", "p99"):
        w, g = want[q], got[q]
        assert w is not None and g is not None
        assert (w == 0 and g == 0) or abs(g - w) <= HALF_WIDTH * w * (1 + 1e-9)


def test_a_folded_histogram_does_not_grow_with_the_count() -> None:
    s = Samples(exact_max=1000)
    rng = np.random.default_rng(0)
    for _ in range(20):
        s.add_many(rng.uniform(0.5, 2.0, 100_000))  # two doublings: at most 2,048 buckets
    assert len(s) == 2_000_000 and len(s._counts) <= 2 * samples_mod.BUCKETS_PER_DOUBLING + 1
    with pytest.raises(ValueError, match="folded"):
        s.values()


def test_none_are_none() -> None:
    assert Samples().percentiles() == {"p50": None, "p90": None, "p99": None}


def test_folded_histograms_merge_across_their_ranges() -> None:
    # Each folded over its own range of buckets (and its own zeros): the merge is the
    # histogram of all of them, whichever starts lower.
    rng = np.random.default_rng(5)
    low, high = rng.uniform(0.001, 0.01, 2000), rng.uniform(50.0, 900.0, 3000)
    zeros = np.zeros(6000)
    a, b = Samples(exact_max=100), Samples(exact_max=100)
    a.add_many(high)
    b.add_many(np.concatenate([low, zeros]))
    a.extend(b)
    values = np.concatenate([high, low, zeros]).tolist()
    assert len(a) == len(values)
    want, got = percentiles(values), a.percentiles()
    assert got["p50"] == 0.0 == want["p50"]  # more than half are zeros
    for q in ("p90", "p99"):
        w, g = want[q], got[q]
        assert w is not None and g is not None and abs(g - w) <= HALF_WIDTH * w * (1 + 1e-9)
