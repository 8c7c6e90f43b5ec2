"""Usage across every activator: the segments shipped to the store plus local ledgers.

``read_usage`` answers `thaw usage` and ``GET /v1/usage``: the records of every
activator's shipped segments, and those of the ledgers on this machine (which also
hold what is not shipped yet), counted once each, with the shipping lag per activator.
When the store cannot be read, the answer is the local ledgers' alone and says so.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from activator.ledger import query_usage, replica_intervals
from activator.shipping import (
    MARKER_NAME,
    REPLICAS_NAME,
    decode_lines,
    parse_segment_key,
    read_watermark,
)
from thaw.config import ThawConfig
from thaw.s3client import S3Client

# -- pure merging ------------------------------------------------------------------------


def merge_records(sources: Iterable[Iterable[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Records of all sources, each once, oldest first; the first source to hold a
    record wins (pass local ledgers first: they are the originals).

    The key is (activator, ledger row id), not ``request_id``: the activator takes a
    client's ``x-request-id`` as is, so two requests (even two tenants') may carry the
    same one, whereas a row id is unique in its ledger and a ledger belongs to one
    activator. A segment shipped twice, or two overlapping ones after a crash between
    a PUT and the watermark's commit, hold the same (activator, id) pairs."""
    seen: set[tuple[str, int]] = set()
    out: list[dict[str, Any]] = []
    for source in sources:
        for r in source:
            key = (r["activator"], r["id"])
            if key not in seen:
                seen.add(key)
                out.append(r)
    out.sort(key=lambda r: (r["started_at"], r["activator"], r["id"]))
    return out


def merge_intervals(per_activator: Iterable[Iterable[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One interval per replica from every activator's view of it: the earliest start,
    and the latest end any activator saw (an activator killed while the replica was up
    never sees its end; one that saw it knows)."""
    out: dict[str, dict[str, Any]] = {}
    for intervals in per_activator:
        for iv in intervals:
            cur = out.get(iv["replica"])
            if cur is None:
                out[iv["replica"]] = dict(iv)
                continue
            cur["started_at"] = min(cur["started_at"], iv["started_at"])
            ends = [e for e in (cur["ended_at"], iv["ended_at"]) if e is not None]
            cur["ended_at"] = max(ends) if ends else None
    return sorted(out.values(), key=lambda iv: (iv["started_at"], iv["replica"]))


def in_window(r: dict[str, Any], tenant: str | None, since: float | None, until: float | None) -> bool:
    # The same filter as activator.ledger.query_usage.
    return ((tenant is None or r["tenant"] == tenant) and (since is None or r["started_at"] >= since)
            and (until is None or r["started_at"] < until))


@dataclass(frozen=True)
class ActivatorShipping:
    """How far one activator's records are in the store, and whether they were read here."""

    activator: str
    # Every record it committed before this time is in the store (None: nothing shipped).
    shipped_through: float | None
    through_id: int | None
    # Its own ledger was read on this machine: its records are complete as of now.
    local: bool

    def lag_s(self, now: float) -> float | None:
        if self.local:
            return 0.0
        return None if self.shipped_through is None else max(0.0, now - self.shipped_through)


@dataclass(frozen=True)
class FleetUsage:
    records: list[dict[str, Any]]
    intervals: list[dict[str, Any]]
    activators: dict[str, ActivatorShipping]
    # False when the store could not be read (or there is none): ``reason`` says why,
    # and the records are the local ledgers' alone.
    complete: bool
    reason: str | None
    read_at: float

    def shipping(self) -> dict[str, Any]:
        """The lag as the answers state it: per activator, and the largest."""
        per = {a: {"shipped_through": s.shipped_through, "through_id": s.through_id, "local": s.local,
                   "lag_s": _round(s.lag_s(self.read_at))} for a, s in sorted(self.activators.items())}
        lags = [v["lag_s"] for v in per.values() if v["lag_s"] is not None]
        return {"lag_s": max(lags) if lags else None, "activators": per}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def describe_lag(usage: FleetUsage) -> str:
    """One line for a table: how current the answer is."""
    if not usage.complete:
        return f"incomplete: {usage.reason}; local ledgers only"
    s = usage.shipping()
    if not s["activators"]:
        return "shipping: no activator has shipped usage yet"
    parts = [f"{a} {'local' if v['local'] else _age(v['lag_s'])}" for a, v in s["activators"].items()]
    return f"shipping lag {_age(s['lag_s'])} ({', '.join(parts)})"


def _age(lag: float | None) -> str:
    return "unknown" if lag is None else f"{lag:.0f}s"


# -- the store ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentRef:
    key: str
    activator: str
    first_id: int
    last_id: int


@dataclass
class StoreView:
    """One listing of the usage prefix, with the small mutable objects read."""

    segments: list[SegmentRef]
    markers: dict[str, dict[str, Any]]
    replicas: dict[str, list[dict[str, Any]]]
    # The newest segment's LastModified per activator (the lag when a marker is missing).
    last_modified: dict[str, float] = field(default_factory=dict)


class UsageReader:
    """Reads the shipped usage (blocking; run it in a thread; safe across threads).

    Segments never change, so their records are cached by key (the least recently used
    go past ``cache_records``); the listing is kept for ``list_ttl_s``, a failed one too,
    so a busy /v1/usage neither lists per request nor waits on a store that is down."""

    def __init__(
        self, client: S3Client, bucket: str, prefix: str = "usage/", *, list_ttl_s: float = 5.0,
        cache_records: int = 200_000, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.list_ttl_s = list_ttl_s
        self.cache_records = cache_records
        self.clock = clock
        self._lock = threading.Lock()
        self._view: tuple[float, StoreView | BaseException] | None = None
        self._etags: dict[str, tuple[str, Any]] = {}
        # key -> records of the segment by tenant
        self._segments: OrderedDict[str, dict[str, list[dict[str, Any]]]] = OrderedDict()
        self._cached = 0

    def view(self) -> StoreView:
        """The listing, at most ``list_ttl_s`` old; raises what the store raised."""
        with self._lock:
            now = self.clock()
            if self._view is None or now - self._view[0] >= self.list_ttl_s:
                try:
                    got: StoreView | BaseException = self._list()
                except Exception as exc:
                    got = exc
                self._view = (now, got)
            result = self._view[1]
        if isinstance(result, BaseException):
            raise result
        return result

    def _list(self) -> StoreView:
        segments: list[SegmentRef] = []
        mutable: dict[str, str] = {}
        last_modified: dict[str, float] = {}
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix}
            if token:
                kw["ContinuationToken"] = token
            page = self.client.list_objects_v2(**kw)
            for obj in page.get("Contents", []):
                key = obj["Key"]
                parsed = parse_segment_key(self.prefix, key)
                if parsed is not None:
                    segments.append(SegmentRef(key, *parsed))
                    at = _epoch(obj.get("LastModified"))
                    if at is not None:
                        last_modified[parsed[0]] = max(at, last_modified.get(parsed[0], at))
                elif key.endswith("/" + MARKER_NAME) or key.endswith("/" + REPLICAS_NAME):
                    mutable[key] = obj.get("ETag", "")
            if not page.get("IsTruncated"):
                break
            token = page.get("NextContinuationToken")
        markers: dict[str, dict[str, Any]] = {}
        replicas: dict[str, list[dict[str, Any]]] = {}
        for key, etag in mutable.items():
            activator = key[len(self.prefix):].partition("/")[0]
            content = self._read_mutable(key, etag)
            if key.endswith(MARKER_NAME):
                markers[activator] = content
            else:
                replicas[activator] = content
        segments.sort(key=lambda s: (s.activator, s.first_id, s.last_id))
        return StoreView(segments, markers, replicas, last_modified)

    def _read_mutable(self, key: str, etag: str) -> Any:
        cached = self._etags.get(key)
        if cached is not None and cached[0] == etag and etag:
            return cached[1]
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        content = decode_lines(body) if key.endswith(REPLICAS_NAME) else json.loads(body)
        self._etags[key] = (etag, content)
        return content

    def records(self, view: StoreView, tenant: str | None) -> Iterable[dict[str, Any]]:
        """Every shipped record (of ``tenant``), duplicates included."""
        for seg in view.segments:
            by_tenant = self._segment(seg.key)
            if tenant is None:
                for rs in by_tenant.values():
                    yield from rs
            else:
                yield from by_tenant.get(tenant, ())

    def _segment(self, key: str) -> dict[str, list[dict[str, Any]]]:
        with self._lock:
            hit = self._segments.get(key)
            if hit is not None:
                self._segments.move_to_end(key)
                return hit
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        by_tenant: dict[str, list[dict[str, Any]]] = {}
        n = 0
        for r in decode_lines(body):
            by_tenant.setdefault(r["tenant"], []).append(r)
            n += 1
        with self._lock:
            if key not in self._segments:
                self._segments[key] = by_tenant
                self._cached += n
                while self._cached > self.cache_records and len(self._segments) > 1:
                    _, old = self._segments.popitem(last=False)
                    self._cached -= sum(len(rs) for rs in old.values())
        return by_tenant


def _epoch(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    return None


def local_ledgers(cfg: ThawConfig) -> dict[str, Path]:
    """The ledgers of the activators that ran on this machine (activator id -> path):
    ``<data_dir>/activators/<id>/<ledger.path>``, or the one absolute ``ledger.path``
    (its id from its watermark)."""
    if cfg.ledger.path.is_absolute():
        path = cfg.ledger.path
        if not path.exists():
            return {}
        wm = read_watermark(path)
        return {wm.activator if wm else "local": path}
    root = cfg.data_dir / "activators"
    found = {d.name: d / cfg.ledger.path for d in sorted(root.iterdir()) if d.is_dir()} if root.is_dir() else {}
    return {a: p for a, p in found.items() if p.exists()}


# -- the answer --------------------------------------------------------------------------


def read_usage(
    reader: UsageReader | None, local: Mapping[str, Path], *, tenant: str | None = None,
    since: float | None = None, until: float | None = None, now: float | None = None,
    no_store: str = "no object store configured",
) -> FleetUsage:
    """The records of every activator (of ``tenant``, started in [since, until)), each
    once: the shipped segments, and the ledgers in ``local`` (activator id -> ledger
    path), whose records are the originals and include what is not shipped yet.
    Blocking; the store's errors become ``complete=False`` with the reason."""
    local_records: list[list[dict[str, Any]]] = []
    local_intervals: dict[str, list[dict[str, Any]]] = {}
    activators: dict[str, ActivatorShipping] = {}
    for activator, path in local.items():
        local_records.append([{**r, "activator": activator}
                              for r in query_usage(path, tenant=tenant, since=since, until=until)])
        local_intervals[activator] = replica_intervals(path)
        wm = read_watermark(path)
        activators[activator] = ActivatorShipping(activator, wm.covered_through if wm else None,
                                                  wm.last_id if wm else None, local=True)
    now = time.time() if now is None else now
    shipped: list[dict[str, Any]] = []
    intervals = dict(local_intervals)
    complete, reason = True, None
    if reader is None:
        complete, reason = False, no_store
    else:
        try:
            view = reader.view()
            shipped = [r for r in reader.records(view, tenant) if in_window(r, tenant, since, until)]
        except Exception as exc:
            complete, reason = False, f"the object store could not be read ({_short(exc)})"
        else:
            for activator in {s.activator for s in view.segments} | set(view.markers):
                if activator in activators:
                    continue
                marker = view.markers.get(activator)
                through = marker.get("covered_through") if marker else view.last_modified.get(activator)
                activators[activator] = ActivatorShipping(activator, through,
                                                          marker.get("through_id") if marker else None, local=False)
            for activator, ivs in view.replicas.items():
                intervals.setdefault(activator, ivs)  # a local ledger's own intervals are newer
    return FleetUsage(merge_records([*local_records, shipped]), merge_intervals(intervals.values()),
                      activators, complete, reason, now)


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."
