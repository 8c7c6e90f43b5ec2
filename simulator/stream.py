"""Traces too long to hold: a trace read a chunk at a time, and the production-scale day.

A :class:`TraceStream` has the trace's model and tenant names up front and yields its
requests in time order as :class:`~simulator.traces.Trace` chunks whose codes index
those names (a chunk need not use every name). The simulator reads one chunk at a time
(``simulator.sim``), so a trace of any length runs in the memory of one chunk plus what
waits. :func:`chunked` reads a whole trace that way (the same run as the whole trace).

:class:`ProductionDay` is the platform Thaw is built for, drawn as it is read and never
written out: one busy model (a 70B model at a mean 10,000 requests a second over the
day, peak to trough 4) beside a long tail of low-traffic models (1,000 at 20 requests
an hour on average, spread lognormally, each on its own daily phase). Chunk ``k`` covers
``[k * chunk_s, (k + 1) * chunk_s)`` and is drawn from its own seed ``(seed, k)``: the
same parameters give the same requests, and any chunk can be drawn alone. A day is 864
million requests at the defaults; its description is a few hundred bytes of JSON
(:meth:`ProductionDay.to_json`), which ``thaw simulate --trace`` reads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from simulator.generate import DAY_S, TOKEN_SIGMA, draw_tokens, model_names
from simulator.traces import DEFAULT_TENANT, Trace

# What a stream's JSON description starts with, and the one kind there is.
STREAM_KEY = "thaw_trace_stream"
PRODUCTION = "production"
DESCRIPTION_MAX_BYTES = 64 * 1024


@dataclass(frozen=True, eq=False)
class Columns:
    """A chunk's requests as arrays: what the simulator reads (a :class:`Trace`'s lists
    are for files and people; a day of them is built and read a chunk at a time)."""

    t: np.ndarray  # float64 seconds, ascending
    model: np.ndarray  # int64 codes of the stream's models
    input_tokens: np.ndarray
    output_tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.t)

    @classmethod
    def of(cls, tr: Trace) -> Columns:
        return cls(np.asarray(tr.t, dtype=np.float64), np.asarray(tr.model, dtype=np.int64),
                   np.asarray(tr.input_tokens, dtype=np.int64), np.asarray(tr.output_tokens, dtype=np.int64))

    def rows(self, lo: int, hi: int) -> Columns:
        return Columns(self.t[lo:hi], self.model[lo:hi], self.input_tokens[lo:hi], self.output_tokens[lo:hi])


class TraceStream(Protocol):
    r"""A trace in time-ordered chunks (see the module docstring): as :class:`Trace`\ s,
    or as :class:`Columns` (the same requests)."""

    @property
    def models(self) -> list[str]: ...
    @property
    def tenants(self) -> list[str]: ...
    @property
    def source(self) -> str: ...
    def chunks(self) -> Iterator[Trace]: ...
    def arrays(self) -> Iterator[Columns]: ...


@dataclass(frozen=True)
class Chunked:
    """A whole trace read ``rows`` requests at a time."""

    trace: Trace
    rows: int

    @property
    def models(self) -> list[str]:
        return self.trace.models

    @property
    def tenants(self) -> list[str]:
        return self.trace.tenants

    @property
    def source(self) -> str:
        return self.trace.source

    def chunks(self) -> Iterator[Trace]:
        tr = self.trace
        for lo in range(0, len(tr), self.rows):
            hi = lo + self.rows
            yield Trace(tr.t[lo:hi], tr.model[lo:hi], tr.tenant[lo:hi], tr.input_tokens[lo:hi],
                        tr.output_tokens[lo:hi], tr.models, tr.tenants, tr.source)

    def arrays(self) -> Iterator[Columns]:
        cols = Columns.of(self.trace)
        for lo in range(0, len(cols), self.rows):
            yield cols.rows(lo, lo + self.rows)


def chunked(trace: Trace, rows: int) -> Chunked:
    """``trace`` as a stream of chunks of ``rows`` requests."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, not {rows}")
    return Chunked(trace, rows)


@dataclass(frozen=True)
class ProductionDay:
    """The production-scale scenario (see the module docstring); times from midnight."""

    duration_s: float = DAY_S
    big_model: str = "llama-70b"
    big_rps: float = 10_000.0  # the busy model's mean rate over the day
    peak_to_trough: float = 4.0
    peak_hour: float = 14.0
    tail_models: int = 1000
    tail_rate_per_hour: float = 20.0  # the tail's mean rate per model
    tail_sigma: float = 1.0  # log-sd of the tail's rates across models
    tail_phase_spread_h: float = 6.0
    input_tokens: int = 1024
    output_tokens: int = 256
    token_sigma: float = TOKEN_SIGMA
    seed: int = 0
    chunk_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("duration_s", "big_rps", "chunk_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a positive number, not {v!r}")
        if not (self.peak_to_trough >= 1 and math.isfinite(self.peak_to_trough)):
            raise ValueError(f"peak_to_trough must be a number >= 1, not {self.peak_to_trough!r}")
        if self.tail_models < 0 or self.tail_rate_per_hour < 0 or self.tail_sigma < 0:
            raise ValueError("tail_models, tail_rate_per_hour and tail_sigma must be >= 0")
        if self.input_tokens < 1 or self.output_tokens < 1 or self.token_sigma < 0:
            raise ValueError("input_tokens and output_tokens must be >= 1, token_sigma >= 0")
        if self.tail_models and self.big_model in model_names(self.tail_models):
            raise ValueError(f"big_model {self.big_model!r} is also a tail model's name")

    @property
    def models(self) -> list[str]:
        """The busy model, then the tail's ``m000``, ``m001``, …"""
        return [self.big_model, *(model_names(self.tail_models) if self.tail_models else [])]

    @property
    def tenants(self) -> list[str]:
        return [DEFAULT_TENANT]

    @property
    def source(self) -> str:
        return f"production({', '.join(f'{k}={v}' for k, v in asdict(self).items())})"

    @property
    def mean_rps(self) -> float:
        """Requests a second over the day, tail included (what ``duration_s`` draws on average)."""
        return self.big_rps + self.tail_models * self.tail_rate_per_hour / 3600.0

    def chunks(self) -> Iterator[Trace]:
        for cols in self.arrays():
            yield self._trace(cols)

    def arrays(self) -> Iterator[Columns]:
        tail_rates, tail_peaks = self._tail()
        n_chunks = math.ceil(self.duration_s / self.chunk_s)
        for k in range(n_chunks):
            yield self.columns(k, tail_rates, tail_peaks)

    def chunk(self, k: int) -> Trace:
        """Chunk ``k``: the requests of ``[k * chunk_s, (k + 1) * chunk_s)`` (cut at ``duration_s``)."""
        return self._trace(self.columns(k))

    def _trace(self, cols: Columns) -> Trace:
        n = len(cols)
        return Trace(cols.t.tolist(), cols.model.tolist(), [0] * n, cols.input_tokens.tolist(),
                     cols.output_tokens.tolist(), self.models, self.tenants, self.source)

    def columns(self, k: int, tail_rates: np.ndarray | None = None, tail_peaks: np.ndarray | None = None) -> Columns:
        """Chunk ``k`` as arrays."""
        if tail_rates is None or tail_peaks is None:
            tail_rates, tail_peaks = self._tail()
        t0 = k * self.chunk_s
        t1 = min((k + 1) * self.chunk_s, self.duration_s)
        rng = np.random.default_rng([self.seed, 0, k])
        a = (self.peak_to_trough - 1.0) / (self.peak_to_trough + 1.0)
        peaks = np.concatenate([[self.peak_hour * 3600.0], tail_peaks])
        rates = np.concatenate([[self.big_rps], tail_rates])
        # Thinning: a Poisson process at each model's peak rate, each arrival kept with
        # the day's rate at its time over the peak's.
        counts = rng.poisson(rates * (1.0 + a) * (t1 - t0))
        # The busy model's times drawn in order (uniform order statistics: spacings of
        # exponentials, normalised), the tail's as they come.
        n0 = int(counts[0])
        u = np.cumsum(rng.exponential(size=n0 + 1))
        model = np.repeat(np.arange(len(rates)), counts)
        t = np.concatenate([t0 + (t1 - t0) * (u[:n0] / u[n0]), rng.uniform(t0, t1, len(model) - n0)])
        keep = rng.random(len(t)) * (1.0 + a) < 1.0 + a * np.cos(2.0 * np.pi * (t - peaks[model]) / DAY_S)
        t, model = np.round(t[keep], 6), model[keep]
        # One long run in order and the tail's few: the stable sort merges them.
        order = np.argsort(t, kind="stable")
        t, model = t[order], model[order]
        n = len(t)
        return Columns(t, model, draw_tokens(rng, self.input_tokens, self.token_sigma, n),
                       draw_tokens(rng, self.output_tokens, self.token_sigma, n))

    def _tail(self) -> tuple[np.ndarray, np.ndarray]:
        """The tail's mean rates (per s) and daily peak times (s), drawn once from the seed."""
        rng = np.random.default_rng([self.seed, 1])
        n = self.tail_models
        rate = self.tail_rate_per_hour / 3600.0
        rates = (np.full(n, rate) if self.tail_sigma == 0
                 else rate * rng.lognormal(-self.tail_sigma ** 2 / 2.0, self.tail_sigma, n))
        peaks = (self.peak_hour + rng.uniform(-0.5, 0.5, n) * self.tail_phase_spread_h) * 3600.0
        return rates, peaks

    def to_json(self) -> dict[str, Any]:
        return {STREAM_KEY: PRODUCTION, **asdict(self)}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ProductionDay:
        known = {f.name for f in fields(cls)}
        params = {k: v for k, v in body.items() if k != STREAM_KEY}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"unknown parameters of the production scenario: {unknown}; known: {sorted(known)}")
        return cls(**params)


def read_stream(path: str | Path) -> TraceStream | None:
    """The stream a JSON description at ``path`` describes; None when the file is no
    such description (any other trace file). A description that cannot be used raises
    ``ValueError`` naming the file."""
    p = Path(path)
    with p.open("rb") as f:
        # A description is a few hundred bytes: a larger file (a JSONL trace starts with
        # "{" too) is not read here, only by its reader.
        text = f.read(DESCRIPTION_MAX_BYTES + 1)
    if not text.startswith(b"{") or len(text) > DESCRIPTION_MAX_BYTES:
        return None
    try:
        body = json.loads(text)
    except ValueError:
        return None
    if not isinstance(body, dict) or STREAM_KEY not in body:
        return None
    if body[STREAM_KEY] != PRODUCTION:
        raise ValueError(f"{p}: unknown trace stream {body[STREAM_KEY]!r} (known: {PRODUCTION!r})")
    try:
        return ProductionDay.from_json(body)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{p}: {exc}") from None

