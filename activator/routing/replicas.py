"""One model's replicas as this activator sees them: those the route table lists, those
ejected here for a while, the requests each one runs (its slots), and the model's load
state (loading, failed, backing off).

Only ``activator.routing.router`` changes these; the API reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from activator.replica_choice import choose
from thaw.wire import ModelRoute, Tier


@dataclass
class Replica:
    worker_id: str
    url: str
    served_model_name: str
    assignment_id: str | None
    phases: dict[str, float | None]
    outstanding: int = 0
    # Where the worker read the weights from (thaw.wire.LoadView.tier), how long its
    # loader took, and when the worker's agent started.
    load_tier: str | None = None
    load_s: float | None = None
    load_bytes: int | None = None
    # The weights were swapped into an engine built before (thaw.wire.LoadView.swap).
    load_swap: bool = False
    # Its steps (thaw.wire.LoadView.steps_s).
    swap_steps_s: dict[str, float] = field(default_factory=dict)
    worker_started_at: float | None = None
    # An engine packed beside others on a worker that was serving (thaw.wire.ReplicaRoute).
    packed: bool = False
    # A LoRA adapter in an engine of its base, and when that engine became ready.
    adapter: bool = False
    base_ready_at: float | None = None
    # The model's registry revision it serves (thaw.wire.ReplicaRoute.revision).
    revision: int | None = None
    # Placed for batch work: batch may take all its slots (online traffic still first).
    batch: bool = False


def cold_start_tier(waiting_since: float, rep: Replica) -> Tier:
    """Where the replica that ended a cold start got its model from: woken from sleep, a
    worker launched after the request started waiting (a packed engine is no launch: its
    worker was serving), weights swapped into an engine built before, else where its
    loader read the weights (host memory, local disk, the store)."""
    if rep.phases.get("woken") is not None or rep.load_tier == "asleep":
        return "asleep"
    if rep.adapter and rep.base_ready_at is not None and rep.base_ready_at <= waiting_since:
        # Its base was serving before the request: only the adapter was loaded. (A base
        # brought up for it: where the base came from, below.)
        return "adapter"
    if rep.packed:
        return "packed"
    if rep.worker_started_at is not None and rep.worker_started_at > waiting_since:
        return "launch"
    if rep.load_swap:
        return "swap"
    if rep.load_tier in ("host", "disk"):
        return rep.load_tier  # type: ignore[return-value]
    # Configured models live in the store; a loader that reports nothing read them there.
    return "s3"


# The phases of a cold start, in order (the last ends at the first token).
PHASES = ("queued", "instance_acquired", "snapshot_restored", "weights_loaded", "engine_ready", "first_token")


def cold_phases(arrival: float, enqueued_at: float | None, rep: Replica,
                first_token: float) -> list[tuple[str, float, float]]:
    """A cold request's wait split at the worker's milestones: (phase, start, end) for
    each of ``PHASES``, end to end from its arrival to ``first_token``."""
    p = rep.phases
    marks: list[float | None] = [enqueued_at or arrival, p.get("assigned"), p.get("snapshot_restored"),
                                 p.get("weights_loaded"), p.get("engine_ready"), first_token]
    out = []
    prev = arrival
    for name, mark in zip(PHASES, marks, strict=True):
        # A missing milestone takes no time; clocks of other machines may be skewed a little.
        t = prev if mark is None else min(max(mark, prev), first_token)
        out.append((name, prev, t))
        prev = t
    return out


ModelState = Literal["ready", "loading", "failed", "cold"]

# Told (up, replica id, model, time) when a replica appears or goes.
OnReplica = Callable[[bool, str, str, float], None]


class ModelReplicas:
    """One model's replicas and load state, taken from each route table."""

    def __init__(self, model: str, on_replica: OnReplica | None = None) -> None:
        self.model = model
        self._on_replica = on_replica
        # The replicas the last table listed; ``usable`` is these less the ejected ones
        # (url -> until when, clock time): replicas that failed before a first byte here.
        self.listed: list[Replica] = []
        self.usable: list[Replica] = []
        self._ejected: dict[str, float] = {}
        self.loading = 0
        self.failures = 0
        self.error: str | None = None
        # The last failure's kind (thaw.wire.FailureKind): what callers are told.
        self.failure_kind: str | None = None
        self.backoff_until: float | None = None

    def take(self, entry: ModelRoute, now: float) -> bool:
        """Take in the model's entry of a route table; whether it reports a new failure.
        A replica still listed for the same assignment keeps its count of requests."""
        old = {r.url: r for r in self.listed}
        self.listed = []
        for r in entry.replicas:
            prev = old.get(r.url)
            rep = Replica(r.worker_id, r.url, r.served_model_name, r.assignment_id,
                          r.phases.model_dump(), load_tier=r.load.tier if r.load else None,
                          load_s=r.load.seconds if r.load else None, load_bytes=r.load.bytes if r.load else None,
                          worker_started_at=r.worker_started_at,
                          load_swap=r.load.swap if r.load else False,
                          swap_steps_s=dict(r.load.steps_s) if r.load else {}, packed=r.packed, adapter=r.adapter,
                          base_ready_at=r.base_ready_at, revision=r.revision, batch=r.batch)
            if prev is not None and prev.assignment_id == rep.assignment_id:
                rep.outstanding = prev.outstanding
            self.listed.append(rep)
        self._refresh(now)
        if self._on_replica is not None:
            before = {r.assignment_id or r.url for r in old.values()}
            after = {r.assignment_id or r.url for r in self.listed}
            for rid in after - before:
                self._on_replica(True, rid, self.model, now)
            for rid in before - after:
                self._on_replica(False, rid, self.model, now)
        # A failed load counted anew, or the pool newly unable to give the model an instance.
        new_failure = bool(entry.failures > self.failures and entry.error) or (
            entry.failure_kind == "capacity" and self.failure_kind != "capacity")
        self.loading = entry.loading
        self.failures = entry.failures
        self.error = entry.error
        self.failure_kind = entry.failure_kind
        self.backoff_until = entry.backoff_until
        return new_failure

    def state(self, now: float) -> ModelState:
        if self.usable:
            return "ready"
        if self.loading:
            return "loading"
        if self.backoff_until and self.backoff_until > now:
            return "failed"
        return "cold"

    def backing_off(self, now: float) -> bool:
        """Its last load failed and the next attempt is not under way yet."""
        return bool(self.backoff_until and self.backoff_until > now and not self.loading and self.error)

    def at_capacity(self) -> bool:
        """Its pool can give it no instance now (every one busy, at ``max_instances``):
        the controller's failure kind "capacity"."""
        return self.failure_kind == "capacity" and not self.usable and not self.loading

    # -- slots ------------------------------------------------------------------------
    def reserve(self, cap: int, key: str | None = None) -> Replica | None:
        """A slot on a usable replica with fewer than ``cap`` requests (prefix affinity
        with bounded load), taken; None if every one is full."""
        rep: Replica | None = choose([r for r in self.usable if r.outstanding < cap], key)  # type: ignore[assignment]
        if rep is not None:
            rep.outstanding += 1
        return rep

    def release(self, replica: Replica) -> None:
        """A request on ``replica`` ended: free its slot.

        A route table taken in since the request began holds a new ``Replica`` for the
        same assignment, which carried the count over: the slot is freed there too
        (else every table that arrives during a request would leak one slot)."""
        replica.outstanding = max(replica.outstanding - 1, 0)
        for live in self.listed:
            if live is not replica and live.url == replica.url and live.assignment_id == replica.assignment_id:
                live.outstanding = max(live.outstanding - 1, 0)

    def batch_room(self, cap: int, share: float, running: int) -> int:
        """How many more batch requests fit, ``running`` being run: up to ``share`` of
        the usable replicas' slots in all (all of those of a replica placed for batch),
        within the free ones."""
        free = sum(max(cap - r.outstanding, 0) for r in self.usable)
        allowed = sum(cap if r.batch else cap * share for r in self.usable)
        return max(0, min(int(allowed) - running, free))

    def serves_other(self, rep: Replica) -> bool:
        """Whether the worker of ``rep`` is listed here for another assignment."""
        return any(r.worker_id == rep.worker_id and r.assignment_id != rep.assignment_id for r in self.listed)

    # -- ejection -----------------------------------------------------------------------
    def eject(self, url: str, until: float, now: float) -> None:
        """Use no replica at ``url`` until ``until``, whatever the tables say meanwhile."""
        self._ejected[url] = until
        self._refresh(now)

    def readmit(self, url: str, until: float, now: float) -> None:
        """The ejection that lasts until ``until`` is over (unless it was ejected again since)."""
        if self._ejected.get(url) == until:
            del self._ejected[url]
        self._refresh(now)

    def _refresh(self, now: float) -> None:
        """``usable``: the listed ones but those ejected until later than ``now``."""
        for url in [u for u, until in self._ejected.items() if until <= now]:
            del self._ejected[url]
        self.usable = [r for r in self.listed if r.url not in self._ejected] if self._ejected else list(self.listed)
