"""Request traces for the warm-pool simulator and load tests, as flat columns.

A :class:`Trace` is parallel Python lists (one entry per request, sorted by arrival
time), because the simulator replays 100,000+ requests per second and a list of floats
iterates faster than any object per request. :func:`read_trace` reads four formats:

``generic``
    Our own CSV, ``timestamp,model,tenant,input_tokens,output_tokens`` (header
    required; ``timestamp`` in seconds from the trace start; rows in any order, sorted
    stably on read; an optional ``prefix_hit`` column; other columns ignored; one row
    per line). :func:`write_generic` writes it; reading it back gives an equal trace.
``azure``
    Azure LLM inference traces (Splitwise, ISCA'24; AzurePublicDataset):
    ``TIMESTAMP,ContextTokens,GeneratedTokens``, ISO times such as
    ``2023-11-16 18:17:03.9799600`` (7 fractional digits: the 100 ns digit is dropped;
    times without a zone are taken as UTC). One service, one tenant.
``mooncake``
    Mooncake JSONL (FAST'25): ``timestamp`` (ms from the start), ``input_length``,
    ``output_length``, ``hash_ids`` (hashes of the input's 512-token blocks). One
    service, one tenant. The conversation trace's timestamps come in steps of about 3 s
    (about 10 requests share each), so its arrivals are batched, not a smooth process.
    ``prefix_hit`` is the share of a request's blocks whose hash an earlier request
    (in trace order) already had: a prefix-cache hit estimate for one shared cache.
``servegen``
    ServeGen (Alibaba, arXiv 2505.09999) per-tenant, per-10-minute windows:
    ``category,model,client_id,timestamp,rate,cv,pat_name,pat_arg1,pat_arg2``. A
    window with ``rate > 0`` and a ``pat_name`` gets ``rate * 600`` requests, spaced by
    gaps from the fitted family and shape, rescaled to fill the window (the fitted
    scale often disagrees with the rate: see :func:`_draw_servegen`); idle windows give
    none. Deterministic given ``seed``. ServeGen windows carry no token counts: every
    request gets ``input_tokens`` / ``output_tokens``. Beware the volume: the published
    ``m-small`` tenants add up to 1.4e9 requests in 14 days, so reading refuses to draw
    more than ``servegen_max_requests`` and says how to pick a model or scale rates.

Invariants of every trace this module builds (readers, transforms, generators): ``t``
is rounded to microseconds and non-decreasing; ``models`` and ``tenants`` are sorted
names, each used by at least one request (a transform that drops a model's last
request drops the name and renumbers). So a trace equals its own round trip through
:func:`write_generic`. ``source`` says where a trace came from and is not compared.

One piece: the trace type and its four readers, which share one column layout and one
validation.
"""

from __future__ import annotations

import csv
import json
import math
import zlib
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from itertools import islice, repeat
from pathlib import Path
from typing import Literal, TextIO, TypeVar

import numpy as np

FORMATS = ("generic", "azure", "mooncake", "servegen")

GENERIC_COLUMNS = ("timestamp", "model", "tenant", "input_tokens", "output_tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
SERVEGEN_COLUMNS = ("model", "client_id", "timestamp", "rate", "pat_name", "pat_arg1", "pat_arg2")
SERVEGEN_WINDOW_S = 600.0
SERVEGEN_DISTRIBUTIONS = ("Gamma", "Weibull")
# About 130 bytes of Python objects per request: 20 M requests is about 2.6 GB.
SERVEGEN_MAX_REQUESTS = 20_000_000
DEFAULT_TENANT = "default"

_CHUNK_ROWS = 100_000
_T = TypeVar("_T")


class TraceError(ValueError):
    """A trace file that cannot be read: says which file, which line and what is wrong."""

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.reason = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Trace:
    """Requests as parallel columns; request ``i`` arrives ``t[i]`` s after the trace start.

    ``model[i]`` indexes ``models``, ``tenant[i]`` indexes ``tenants``. ``prefix_hit`` is
    present for Mooncake traces only (see the module docstring).
    """

    t: list[float]
    model: list[int]
    tenant: list[int]
    input_tokens: list[int]
    output_tokens: list[int]
    models: list[str]
    tenants: list[str]
    source: str = field(default="", compare=False)
    prefix_hit: list[float] | None = None

    def __post_init__(self) -> None:
        n = len(self.t)
        lengths = {len(self.model), len(self.tenant), len(self.input_tokens), len(self.output_tokens)}
        if self.prefix_hit is not None:
            lengths.add(len(self.prefix_hit))
        if lengths != {n}:
            raise ValueError(f"trace columns differ in length: t has {n}, others {sorted(lengths)}")

    def __len__(self) -> int:
        return len(self.t)

    @property
    def duration_s(self) -> float:
        """Time of the last request from the trace start (0 for an empty trace)."""
        return self.t[-1] if self.t else 0.0


# -- building -------------------------------------------------------------------------------


def _compact(codes: np.ndarray, names: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Renumber ``codes`` so the names are sorted and each is used; drop unused names."""
    if len(codes) == 0:
        return codes, []
    used = np.flatnonzero(np.bincount(codes, minlength=len(names)))
    keep = sorted(used.tolist(), key=lambda i: names[i])
    if keep == list(range(len(names))):
        return codes, list(names)
    remap = np.full(len(names), -1, dtype=np.int64)
    remap[keep] = np.arange(len(keep))
    return remap[codes], [names[i] for i in keep]


def from_columns(
    t: np.ndarray | Sequence[float],
    model: np.ndarray | Sequence[int],
    tenant: np.ndarray | Sequence[int],
    input_tokens: np.ndarray | Sequence[int],
    output_tokens: np.ndarray | Sequence[int],
    models: Sequence[str],
    tenants: Sequence[str],
    source: str,
    prefix_hit: np.ndarray | Sequence[float] | None = None,
) -> Trace:
    """A :class:`Trace` from columns (lists or numpy arrays), in the module's canonical form.

    Times are rounded to microseconds and the requests sorted by them, stably; names no
    request uses are dropped and the rest sorted, codes renumbered to match. Readers,
    transforms and generators all build their traces here; so can a test.
    """
    ta = np.round(np.asarray(t, dtype=np.float64), 6)
    cols = [np.asarray(c, dtype=np.int64) for c in (model, tenant, input_tokens, output_tokens)]
    ph = None if prefix_hit is None else np.round(np.asarray(prefix_hit, dtype=np.float64), 6)
    if len(ta) > 1 and not bool(np.all(ta[1:] >= ta[:-1])):
        order = np.argsort(ta, kind="stable")
        ta = ta[order]
        cols = [c[order] for c in cols]
        ph = None if ph is None else ph[order]
    m, models_out = _compact(cols[0], models)
    te, tenants_out = _compact(cols[1], tenants)
    return Trace(
        t=ta.tolist(),
        model=m.tolist(),
        tenant=te.tolist(),
        input_tokens=cols[2].tolist(),
        output_tokens=cols[3].tolist(),
        models=models_out,
        tenants=tenants_out,
        source=source,
        prefix_hit=None if ph is None else ph.tolist(),
    )


def _select(trace: Trace, index: np.ndarray | slice, source: str, t: np.ndarray | None = None) -> Trace:
    """The requests at ``index`` (in order), optionally with new times."""
    ta = np.asarray(trace.t, dtype=np.float64)[index] if t is None else t
    ph = None if trace.prefix_hit is None else np.asarray(trace.prefix_hit)[index]
    return from_columns(
        ta,
        np.asarray(trace.model, dtype=np.int64)[index],
        np.asarray(trace.tenant, dtype=np.int64)[index],
        np.asarray(trace.input_tokens, dtype=np.int64)[index],
        np.asarray(trace.output_tokens, dtype=np.int64)[index],
        trace.models,
        trace.tenants,
        source,
        ph,
    )


class _Codes:
    """Names to dense codes (new names of each batch in sorted order)."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def encode(self, names: Sequence[str]) -> np.ndarray:
        index = self.index
        for n in sorted(set(names) - index.keys()):
            index[n] = len(index)
        return np.fromiter(map(index.__getitem__, names), np.int64, len(names))

    @property
    def names(self) -> list[str]:
        return list(self.index)


# -- reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Options:
    seed: int
    model: str | None
    servegen_model_per: Literal["model", "tenant"]
    input_tokens: int
    output_tokens: int
    servegen_rate_scale: float
    servegen_max_requests: int


def read_trace(
    path: str | Path,
    fmt: str | None = None,
    *,
    seed: int = 0,
    model: str | None = None,
    servegen_model_per: Literal["model", "tenant"] = "model",
    input_tokens: int = 1024,
    output_tokens: int = 256,
    servegen_rate_scale: float = 1.0,
    servegen_max_requests: int = SERVEGEN_MAX_REQUESTS,
) -> Trace:
    """Read a trace file in one of :data:`FORMATS` (``None``: tell from its first line).

    ``model``: for the one-service formats (azure, mooncake) the model's name (default:
    the file's stem); for the multi-model ones (generic, servegen) keep only that model's
    requests. ``seed``, ``servegen_model_per``, ``input_tokens``, ``output_tokens``,
    ``servegen_rate_scale`` (multiplies every window's rate) and
    ``servegen_max_requests`` (refuse to draw more, expected) apply to ServeGen only.
    Raises :class:`TraceError` for anything wrong with the file, ``ValueError`` for a bad
    argument.
    """
    if servegen_model_per not in ("model", "tenant"):
        raise ValueError(f"servegen_model_per must be 'model' or 'tenant', not {servegen_model_per!r}")
    for name, v in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
        if v < 0:
            raise ValueError(f"{name} must be >= 0, not {v}")
    if not (servegen_rate_scale > 0 and math.isfinite(servegen_rate_scale)):
        raise ValueError(f"servegen_rate_scale must be a positive number, not {servegen_rate_scale}")
    if fmt is None:
        fmt = _sniff(path)
    reader = _READERS.get(fmt)
    if reader is None:
        raise TraceError(path, None, f"unknown format {fmt!r}; valid formats: {', '.join(FORMATS)}")
    opts = _Options(seed, model, servegen_model_per, input_tokens, output_tokens,
                    servegen_rate_scale, servegen_max_requests)
    try:
        return reader(Path(path), opts)
    except OSError as exc:
        raise TraceError(path, None, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(path, None, f"not UTF-8 text ({exc.reason})") from None


def _open(path: str | Path, newline: str | None = "") -> TextIO:
    try:
        return open(path, newline=newline, encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(path, None, f"cannot read: {exc.strerror or exc}") from None


def _sniff(path: str | Path) -> str:
    """The format, from the header (CSV) or the first line (JSONL)."""
    with _open(path) as f:
        try:
            first = next((line for line in f if line.strip()), "")
        except UnicodeDecodeError as exc:
            raise TraceError(path, None, f"not UTF-8 text ({exc.reason})") from None
    if not first:
        raise TraceError(path, None, "empty file: no header to tell the format from")
    if first.lstrip().startswith("{"):
        return "mooncake"
    header = set(_header_fields(first))
    for fmt, cols in (("generic", GENERIC_COLUMNS), ("azure", AZURE_COLUMNS),
                      ("servegen", ("client_id", "timestamp", "rate", "pat_name"))):
        if header.issuperset(cols):
            return fmt
    raise TraceError(path, 1, f"cannot tell the format from the header {first.strip()!r}; "
                              f"pass fmt=, one of {', '.join(FORMATS)}")


def _header_fields(line: str) -> list[str]:
    return [h.strip() for h in next(csv.reader([line]), [])]


def _columns(path: Path, header: list[str], required: Sequence[str], fmt: str) -> dict[str, int]:
    index = {name: i for i, name in reversed(list(enumerate(header)))}
    missing = [c for c in required if c not in index]
    if missing:
        raise TraceError(path, 1, f"missing column{'s' if len(missing) > 1 else ''} "
                                  f"{', '.join(missing)} for format {fmt!r} (header: {','.join(header)})")
    return index


def _floats(path: Path, values: Sequence[str], what: str, line_of: Callable[[int], int]) -> np.ndarray:
    """``values`` as float64; a value that is no number is a TraceError naming its line."""
    try:
        return np.fromiter(map(float, values), np.float64, len(values))
    except ValueError:
        for i, v in enumerate(values):
            try:
                float(v)
            except ValueError:
                raise TraceError(path, line_of(i), f"{what} {v!r} is not a number") from None
        raise


def _first_bad(path: Path, bad: np.ndarray, values: Sequence[str], message: str,
               line_of: Callable[[int], int]) -> None:
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(path, line_of(i), message.format(values[i]))


def _counts(path: Path, values: Sequence[str], what: str, line_of: Callable[[int], int]) -> np.ndarray:
    """Token counts: whole numbers >= 0 (parsed as floats, which is faster than int())."""
    a = _floats(path, values, what, line_of)
    _first_bad(path, ~np.isfinite(a) | (a != np.floor(a)), values, what + " {!r} is not an integer", line_of)
    _first_bad(path, a < 0, values, what + " {!r} is negative", line_of)
    return a.astype(np.int64)


def _generic_fields(path: Path, lines: list[str], first_line: int, width: int,
                    ) -> tuple[list[list[str]], Callable[[int], int]]:
    """The chunk's columns, and the file line of each row."""
    text = "".join(lines)
    # Fast path, no quoting and every line `width` fields: split the whole chunk at once.
    if '"' not in text and set(map(str.count, lines, repeat(","))) == {width - 1}:
        fields = text.replace("\n", ",").split(",")
        if text.endswith("\n"):
            fields.pop()
        return [fields[i::width] for i in range(width)], lambda i: first_line + i
    numbers: list[int] = []
    rows: list[list[str]] = []
    for j, r in enumerate(csv.reader(lines)):
        if not r:  # a blank line
            continue
        if len(r) != width:
            raise TraceError(path, first_line + j, f"expected {width} fields, got {len(r)}")
        numbers.append(first_line + j)
        rows.append(r)
    if not rows:
        return [[] for _ in range(width)], numbers.__getitem__
    return [list(c) for c in zip(*rows, strict=True)], numbers.__getitem__


def _read_generic(path: Path, opts: _Options) -> Trace:
    t: list[np.ndarray] = []
    cols_out: dict[str, list[np.ndarray]] = {c: [] for c in ("model", "tenant", "input_tokens",
                                                              "output_tokens", "prefix_hit")}
    codes = {"model": _Codes(), "tenant": _Codes()}
    # Universal newlines: "\r\n" files read as "\n" (the fast path splits on "\n").
    with _open(path, newline=None) as f:
        header = _header_fields(f.readline())
        idx = _columns(path, header, GENERIC_COLUMNS, "generic")
        i_ph = idx.get("prefix_hit")
        width = len(header)
        first_line = 2
        while lines := list(islice(f, _CHUNK_ROWS)):
            cols, line_of = _generic_fields(path, lines, first_line, width)
            first_line += len(lines)
            if not cols[0]:
                continue
            values = cols[idx["timestamp"]]
            ta = _floats(path, values, "timestamp", line_of)
            _first_bad(path, ~np.isfinite(ta) | (ta < 0), values,
                       "timestamp {!r} must be a finite number >= 0", line_of)
            t.append(ta)
            for what in ("input_tokens", "output_tokens"):
                cols_out[what].append(_counts(path, cols[idx[what]], what, line_of))
            for what in ("model", "tenant"):
                values = cols[idx[what]]
                cols_out[what].append(codes[what].encode(values))
                if "" in codes[what].index:
                    raise TraceError(path, line_of(values.index("")), f"empty {what} name")
            if i_ph is not None:
                values = cols[i_ph]
                pa = _floats(path, values, "prefix_hit", line_of)
                _first_bad(path, ~((pa >= 0) & (pa <= 1)), values,
                           "prefix_hit {!r} must be between 0 and 1", line_of)
                cols_out["prefix_hit"].append(pa)

    def cat(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)

    trace = from_columns(
        cat(t, np.float64), cat(cols_out["model"], np.int64), cat(cols_out["tenant"], np.int64),
        cat(cols_out["input_tokens"], np.int64), cat(cols_out["output_tokens"], np.int64),
        codes["model"].names, codes["tenant"].names, str(path),
        cat(cols_out["prefix_hit"], np.float64) if i_ph is not None else None,
    )
    if opts.model is None:
        return trace
    if opts.model not in trace.models:
        raise TraceError(path, None, f"no requests for model {opts.model!r}; "
                                     f"models: {_some(trace.models)}")
    code = trace.models.index(opts.model)
    return _select(trace, np.flatnonzero(np.asarray(trace.model) == code),
                   f"{path} (model {opts.model})")


def _some(names: Sequence[str], n: int = 10) -> str:
    shown = ", ".join(names[:n])
    return shown + (f", … ({len(names)} in all)" if len(names) > n else "")


def _one_service(path: Path, opts: _Options, t: np.ndarray | Sequence[float], inp: Sequence[int],
                 out: Sequence[int], prefix_hit: Sequence[float] | None = None) -> Trace:
    n = len(t)
    zeros = np.zeros(n, dtype=np.int64)
    return from_columns(t, zeros, zeros, inp, out, [opts.model or path.stem], [DEFAULT_TENANT],
                  str(path), prefix_hit)


def _parse_time(s: str) -> datetime:
    s = s.strip()
    date, sep, frac = s.partition(".")
    if sep:  # Azure writes 7 fractional digits; keep 6 (µs) whatever the Python version
        digits = len(frac) - len(frac.lstrip("0123456789"))
        s = f"{date}.{frac[:min(digits, 6)]}{frac[digits:]}"
    dt = datetime.fromisoformat(s)
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt


def _csv_rows(path: Path, f: TextIO, required: Sequence[str],
              fmt: str) -> tuple[dict[str, int], Iterator[tuple[int, list[str]]]]:
    """The header's column indexes, and the non-blank rows with their line numbers (a
    row of the wrong width is an error naming its line)."""
    reader = csv.reader(f)
    header = [h.strip() for h in next(reader, [])]
    idx = _columns(path, header, required, fmt)

    def rows() -> Iterator[tuple[int, list[str]]]:
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                raise TraceError(path, reader.line_num, f"expected {len(header)} fields, got {len(row)}")
            yield reader.line_num, row

    return idx, rows()


def _read_azure(path: Path, opts: _Options) -> Trace:
    times: list[datetime] = []
    inp: list[int] = []
    out: list[int] = []
    with _open(path) as f:
        idx, rows = _csv_rows(path, f, AZURE_COLUMNS, "azure")
        i_t, i_in, i_out = (idx[c] for c in AZURE_COLUMNS)
        for line, row in rows:
            try:
                times.append(_parse_time(row[i_t]))
            except ValueError:
                raise TraceError(path, line, f"TIMESTAMP {row[i_t]!r} is not a date and time "
                                             "like 2023-11-16 18:17:03.9799600") from None
            for col, name, dest in ((i_in, "ContextTokens", inp), (i_out, "GeneratedTokens", out)):
                try:
                    v = int(row[col])
                except ValueError:
                    raise TraceError(path, line, f"{name} {row[col]!r} is not an integer") from None
                if v < 0:
                    raise TraceError(path, line, f"{name} {v} is negative")
                dest.append(v)
    start = min(times) if times else None
    t = [(d - start).total_seconds() for d in times] if start else []
    return _one_service(path, opts, t, inp, out)


def _read_mooncake(path: Path, opts: _Options) -> Trace:
    ms: list[float] = []
    inp: list[int] = []
    out: list[int] = []
    blocks: list[list[object]] = []
    with _open(path) as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError(path, line, f"not a JSON object: {exc.msg}") from None
            if not isinstance(rec, dict):
                raise TraceError(path, line, "not a JSON object")
            missing = [k for k in MOONCAKE_KEYS if k not in rec]
            if missing:
                raise TraceError(path, line, f"missing key{'s' if len(missing) > 1 else ''} "
                                             f"{', '.join(missing)} for format 'mooncake'")
            ts = rec["timestamp"]
            if not _is_number(ts) or not math.isfinite(ts) or ts < 0:
                raise TraceError(path, line, f"timestamp {ts!r} must be a finite number of ms >= 0")
            for key, dest in (("input_length", inp), ("output_length", out)):
                v = rec[key]
                if not _is_int(v):
                    raise TraceError(path, line, f"{key} {v!r} is not an integer")
                if v < 0:
                    raise TraceError(path, line, f"{key} {v} is negative")
                dest.append(int(v))
            hashes = rec.get("hash_ids", [])
            if not isinstance(hashes, list) or not all(isinstance(h, int | str) for h in hashes):
                raise TraceError(path, line, "hash_ids is not a list of block hashes (integers)")
            ms.append(float(ts))
            blocks.append(hashes)
    t = np.asarray(ms, dtype=np.float64) / 1000.0
    if len(t):
        t -= t.min()
    # Hits are counted in arrival order, so sort first (stably, as from_columns would).
    order = np.argsort(t, kind="stable").tolist()
    seen: set[object] = set()
    hit = [0.0] * len(order)
    for i in order:
        hashes = blocks[i]
        if hashes:
            hit[i] = sum(1 for h in hashes if h in seen) / len(hashes)
            seen.update(hashes)
    return _one_service(path, opts, t, inp, out, hit)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _read_servegen(path: Path, opts: _Options) -> Trace:
    ts: list[float] = []
    rates: list[float] = []
    dist: list[int] = []
    shapes: list[float] = []
    keys: list[tuple[str, str]] = []
    all_models: set[str] = set()
    with _open(path) as f:
        idx, rows = _csv_rows(path, f, SERVEGEN_COLUMNS, "servegen")
        i_m, i_c, i_t, i_r, i_p, i_a1, i_a2 = (idx[c] for c in SERVEGEN_COLUMNS)
        for line, row in rows:
            start = _number(path, line, row[i_t], "timestamp")
            rate = _number(path, line, row[i_r], "rate")
            name = row[i_p].strip()
            if name and name not in SERVEGEN_DISTRIBUTIONS:
                raise TraceError(path, line, f"pat_name {name!r} is not one of "
                                             f"{', '.join(SERVEGEN_DISTRIBUTIONS)} or empty")
            all_models.add(row[i_m])
            if rate == 0 or not name or (opts.model is not None and row[i_m] != opts.model):
                continue
            shape = _number(path, line, row[i_a1], "pat_arg1 (shape)")
            scale = _number(path, line, row[i_a2], "pat_arg2 (scale)")
            if shape == 0 or scale == 0:
                raise TraceError(path, line, f"{name} shape and scale must be > 0, "
                                             f"not {row[i_a1]!r} and {row[i_a2]!r}")
            ts.append(start)
            rates.append(rate)
            dist.append(SERVEGEN_DISTRIBUTIONS.index(name))
            shapes.append(shape)
            keys.append((row[i_m], row[i_c].strip()))
    if opts.model is not None and opts.model not in all_models:
        raise TraceError(path, None, f"no windows for model {opts.model!r}; "
                                     f"models: {_some(sorted(all_models))}")
    counts_expected = np.asarray(rates, dtype=np.float64) * SERVEGEN_WINDOW_S * opts.servegen_rate_scale
    total = float(counts_expected.sum())
    if total > opts.servegen_max_requests:
        per_model: dict[str, float] = {}
        for (m, _), c in zip(keys, counts_expected.tolist(), strict=True):
            per_model[m] = per_model.get(m, 0.0) + c
        detail = ", ".join(f"{m} {c:.3g}" for m, c in sorted(per_model.items(), key=lambda kv: -kv[1]))
        raise TraceError(path, None, f"drawing it would give about {total:.3g} requests ({detail}), "
                                     f"more than servegen_max_requests={opts.servegen_max_requests:,}; "
                                     "pick one model (model=) or scale the rates down "
                                     "(servegen_rate_scale=)")
    rng = _rng(opts.seed, "servegen")
    window, t = _draw_servegen(rng, counts_expected, np.asarray(dist), np.asarray(shapes, dtype=np.float64))
    t += np.asarray(ts, dtype=np.float64)[window]
    models, tenants = _Codes(), _Codes()
    if opts.servegen_model_per == "model":
        model_of = models.encode([m for m, _ in keys])
    else:
        model_of = models.encode([f"{m}-c{c}" for m, c in keys])
    tenant_of = tenants.encode([f"c{c}" for _, c in keys])
    n = len(t)
    source = str(path) if opts.model is None else f"{path} (model {opts.model})"
    return from_columns(t, np.asarray(model_of, dtype=np.int64)[window],
                  np.asarray(tenant_of, dtype=np.int64)[window],
                  np.full(n, opts.input_tokens), np.full(n, opts.output_tokens),
                  models.names, tenants.names, source)


def _number(path: Path, line: int, s: str, what: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise TraceError(path, line, f"{what} {s!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise TraceError(path, line, f"{what} {s!r} must be a finite number >= 0")
    return v


def _draw_servegen(rng: np.random.Generator, counts_expected: np.ndarray, dist: np.ndarray,
                   shapes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Arrivals inside each window: (window index, seconds from the window start) per request.

    ServeGen's ``rate`` is the window's request count over 600 s (``rate * 600`` is a
    whole number in every active window of the published data, at least 10), and
    ``pat_name/pat_arg1/pat_arg2`` is the inter-arrival distribution fitted inside the
    window. The fitted mean often disagrees with ``1/rate``: for Gamma,
    ``shape * scale * rate`` has median 1.000 but ranges 3e-5 to 1.10; for Weibull,
    ``scale * Γ(1 + 1/shape) * rate`` has median 1.21, 90th percentile 1.91 and reaches
    2100 (shapes down to 0.01, CVs up to 800: a renewal process with those gaps puts
    0 or thousands of times the window's count in 600 s). So we keep the window's count
    and the distribution's shape and drop its scale: a window gets ``n`` requests
    (``rate * 600``, rounded up or down at random so its mean is exact), and their
    times are ``600 * cumsum(g[:n]) / sum(g[:n+1])`` for ``n + 1`` gaps ``g`` drawn
    from the fitted family. That is the fitted process rescaled so the window's mean
    rate is ``rate``; for exponential gaps it is exactly a Poisson process given its
    count, and bursty shapes put the requests in bursts.
    """
    floor = np.floor(counts_expected)
    n = (floor + (rng.random(len(floor)) < counts_expected - floor)).astype(np.int64)
    seg = n + 1
    total = int(seg.sum())
    if total == 0 or len(n) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    seg_window = np.repeat(np.arange(len(n)), seg)
    shape_per_gap = shapes[seg_window]
    is_gamma = dist[seg_window] == 0
    g = np.empty(total)
    g[is_gamma] = rng.gamma(shape_per_gap[is_gamma])
    g[~is_gamma] = rng.weibull(shape_per_gap[~is_gamma])
    starts = np.concatenate(([0], np.cumsum(seg)[:-1]))
    sums = np.add.reduceat(g, starts)
    degenerate = ~(np.isfinite(sums) & (sums > 0))  # every gap underflowed to 0, or one overflowed
    if degenerate.any():
        g[degenerate[seg_window]] = 1.0
        sums = np.add.reduceat(g, starts)
    g /= sums[seg_window]
    c = np.cumsum(g)
    before = np.concatenate(([0.0], c[starts[1:] - 1]))
    frac = c - before[seg_window]
    last = np.zeros(total, dtype=bool)
    last[starts + seg - 1] = True
    # Keep every time inside [start, start + 600) after rounding to µs.
    frac = np.clip(frac[~last], 0.0, 1.0 - 2e-9)
    return seg_window[~last], frac * SERVEGEN_WINDOW_S


_READERS: dict[str, Callable[[Path, _Options], Trace]] = {
    "generic": _read_generic,
    "azure": _read_azure,
    "mooncake": _read_mooncake,
    "servegen": _read_servegen,
}
assert tuple(_READERS) == FORMATS


# -- writing --------------------------------------------------------------------------------


def write_generic(trace: Trace, path: str | Path) -> None:
    """Write ``trace`` as generic CSV (times and prefix hits rounded to microseconds)."""
    header = list(GENERIC_COLUMNS)
    cols: list[Sequence[object]] = [
        trace.t,
        list(map(trace.models.__getitem__, trace.model)),
        list(map(trace.tenants.__getitem__, trace.tenant)),
        trace.input_tokens,
        trace.output_tokens,
    ]
    if trace.prefix_hit is not None:
        header.append("prefix_hit")
        cols.append(trace.prefix_hit)
    with open(path, "w", newline="", encoding="utf-8") as f:
        f.write(",".join(header) + "\n")
        if not any(c in name for name in (*trace.models, *trace.tenants) for c in ',"\r\n'):
            # No name needs quoting: one format per row is much faster than csv.writer.
            row = "{:.6f},{},{},{},{}" + (",{:.6f}" if trace.prefix_hit is not None else "") + "\n"
            f.writelines(map(row.format, *cols))
            return
        cols[0] = [f"{x:.6f}" for x in trace.t]
        if trace.prefix_hit is not None:
            cols[5] = [f"{x:.6f}" for x in trace.prefix_hit]
        csv.writer(f, lineterminator="\n").writerows(zip(*cols, strict=True))


# -- transforms -----------------------------------------------------------------------------


def _rng(seed: int, purpose: str) -> np.random.Generator:
    """A stream of its own per purpose: with one stream per seed, ``thin(spread_models(tr,
    n, 0), k, 0)`` would keep the requests of the popular models only (both compare the
    same uniforms)."""
    return np.random.default_rng([seed, zlib.crc32(purpose.encode())])



def speedup(trace: Trace, x: float) -> Trace:
    """The same requests ``x`` times faster (times divided by ``x``)."""
    if not (x > 0 and math.isfinite(x)):
        raise ValueError(f"speedup must be a positive number, not {x}")
    t = np.round(np.asarray(trace.t, dtype=np.float64) / x, 6)
    return replace(trace, t=t.tolist(), source=f"{trace.source} | speedup {x:g}")


def thin(trace: Trace, keep: float, seed: int = 0) -> Trace:
    """Keep each request with probability ``keep`` (independently; deterministic by seed)."""
    if not 0 < keep <= 1:
        raise ValueError(f"keep must be in (0, 1], not {keep}")
    mask = _rng(seed, "thin").random(len(trace)) < keep
    return _select(trace, np.flatnonzero(mask), f"{trace.source} | thin {keep:g} seed {seed}")


def spread_models(trace: Trace, n: int, seed: int = 0, *, zipf_s: float = 1.0,
                  prefix: str | None = None) -> Trace:
    """Give each request one of ``n`` models, model ``k`` (from 0) with weight ``1/(k+1)**zipf_s``.

    Turns one busy service into many models of Zipf popularity: each model's arrivals
    are a random thinning of the whole, so the unpopular ones see long idle gaps, which
    is what scale-to-zero is about. Names are ``<prefix>NNN`` (``m000`` …, at least three
    digits, ``m000`` the most popular); ``prefix`` defaults to ``<model>-`` for a one-model
    trace and ``m`` otherwise. Models that draw no request are left out.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, not {n}")
    if not (zipf_s >= 0 and math.isfinite(zipf_s)):
        raise ValueError(f"zipf_s must be a finite number >= 0, not {zipf_s}")
    if prefix is None:
        prefix = f"{trace.models[0]}-" if len(trace.models) == 1 else "m"
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** zipf_s
    codes = _rng(seed, "spread_models").choice(n, size=len(trace), p=weights / weights.sum())
    width = max(3, len(str(n - 1)))
    names = [f"{prefix}{k:0{width}d}" for k in range(n)]
    return from_columns(trace.t, codes, trace.tenant, trace.input_tokens, trace.output_tokens, names,
                  trace.tenants, f"{trace.source} | spread_models {n} zipf {zipf_s:g} seed {seed}",
                  trace.prefix_hit)


def window(trace: Trace, start_s: float, duration_s: float) -> Trace:
    """Requests with ``start_s <= t < start_s + duration_s``, times shifted to start at 0."""
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, not {duration_s}")
    lo = bisect_left(trace.t, start_s)
    hi = bisect_left(trace.t, start_s + duration_s)
    t = np.asarray(trace.t[lo:hi], dtype=np.float64) - start_s
    return _select(trace, slice(lo, hi), f"{trace.source} | window {start_s:g}+{duration_s:g}s", t=t)


def head(trace: Trace, n: int) -> Trace:
    """The first ``n`` requests."""
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    return _select(trace, slice(0, n), f"{trace.source} | head {n}")


def merge(*traces: Trace) -> Trace:
    """All requests of ``traces`` in one trace, by time (ties in argument order).

    Models and tenants are matched by name. ``prefix_hit`` is kept only if every trace
    has it.
    """
    if not traces:
        raise ValueError("merge needs at least one trace")
    models = sorted({m for tr in traces for m in tr.models})
    tenants = sorted({te for tr in traces for te in tr.tenants})
    m_index = {m: i for i, m in enumerate(models)}
    te_index = {te: i for i, te in enumerate(tenants)}
    model_cols = [np.asarray([m_index[m] for m in tr.models], dtype=np.int64)[np.asarray(tr.model, dtype=np.int64)]
                  for tr in traces]
    tenant_cols = [np.asarray([te_index[te] for te in tr.tenants], dtype=np.int64)[np.asarray(tr.tenant, dtype=np.int64)]
                   for tr in traces]
    has_ph = all(tr.prefix_hit is not None for tr in traces)
    return from_columns(
        np.concatenate([np.asarray(tr.t, dtype=np.float64) for tr in traces]),
        np.concatenate(model_cols),
        np.concatenate(tenant_cols),
        np.concatenate([np.asarray(tr.input_tokens, dtype=np.int64) for tr in traces]),
        np.concatenate([np.asarray(tr.output_tokens, dtype=np.int64) for tr in traces]),
        models,
        tenants,
        " + ".join(f"({tr.source})" for tr in traces),
        np.concatenate([np.asarray(tr.prefix_hit, dtype=np.float64) for tr in traces]) if has_ph else None,
    )
