"""Under pressure, idle yields to waiting: when requests wait for a model at zero and
its pool can add no instance, an idle replica of another model of that pool is given
up for it, the least recently used first. A keep-alive is a bet that a model comes
back, not a reservation against a model that is waiting now.

Pure: the pool's workers, the models' states and ``now`` in; the releases and, per
waiting model, why no instance can come to it (None: one will) out. ``decide`` calls
:func:`make_room` once per pool after every model is placed (the waiting models being
those whose placement found nothing: no wake, no packed room, no standby, no worker
lent to batch, no asleep worker to reclaim). The instance an eviction frees drains back
to standby, and free standbys go to the models waiting at zero the longest first, so
the waiting model takes it on a later tick, not a third model.

The instances a pool's waiting models can count on: its room under ``max_instances``
(demand launches are held back by nothing else: budgets never cut serving), the
instances on their way to standby (booting, draining, released or put to sleep this
tick; in a pool that packs, engines on their way out, whose room frees). Only models
beyond those evict, one replica each, and only replicas that are idle (their model has
nothing in flight or queued: ``ModelState.idle_since`` set, or never used), ready whole
instances (not packed engines nor their hosts), not decided on
this tick, not on batch work their model still has lines for (a worker lent to batch
while its model has no online traffic is taken back by the placement itself, before
any eviction: ``warm_pool.policy.batch``), and beyond their model's floor
(``min_replicas``, raised by an open pre-warm window, and its adapters' floors).
A waiting model that none of these covers is refused (``ModelState.at_capacity``; the
route table's failure kind "capacity") instead of timing out, once it has waited
:data:`CAPACITY_GRACE_S`: what the controller knows of requests in flight is the
activators' last report (one a second), so a replica whose request just ended may still
read as busy; within the grace it is taken the moment it reads idle.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from thaw.config import Model, Pool
from warm_pool.policy.decisions import Release
from warm_pool.policy.prewarm import replica_floor
from warm_pool.policy.states import SERVING

if TYPE_CHECKING:
    from warm_pool.policy.decide import ModelState, WorkerView

# Seconds a model waits at zero with nothing to take before it is refused: a few of the
# activators' report intervals (1 s), so a request in flight that just ended is seen.
CAPACITY_GRACE_S = 3.0


@dataclass(frozen=True)
class Idle:
    """A replica that may be given up: its worker, its model, and since when that model
    has had nothing in flight or queued (None: it was never used)."""

    worker_id: str
    model: str
    since: float | None


def capacity_reason(pool: Pool) -> str:
    """What a refused request is told of its pool (the pool by its shape, and its cap)."""
    return f"pool {pool.shape} is at max_instances {pool.max_instances} and every replica is busy"


def coming(pool: Pool, workers: Sequence[WorkerView], *, freed: Collection[str]) -> int:
    """What the pool's waiting models can count on: its room under ``max_instances``,
    and workers on their way to standby (booting, draining, or ``freed``: released or
    put to sleep by this tick's decisions). ``workers``: the pool's (its shape's). In a
    pool that packs, an engine on its way out (a packed one, or the own engine of a
    worker hosting packed ones) counts too: the room it leaves may take a waiting
    model's engine (counted whether or not it fits: a wait too many, never a refusal
    too many)."""
    instances = [w for w in workers if w.host is None and w.state not in ("unreachable", "stopped")]
    room = max(pool.max_instances - len(instances), 0)
    on_way = sum(1 for w in workers if w.state in ("launching", "starting", "draining") or w.id in freed)
    return room + on_way


def idle_since(ms: ModelState) -> tuple[bool, float | None]:
    """Whether the model is idle (nothing in flight or queued), and since when (None:
    never used since it was first seen)."""
    if ms.idle_since is not None:
        return True, ms.idle_since
    return ms.seen_since is not None, None


def idle_replicas(workers: Sequence[WorkerView], *, by_model: Mapping[str, Sequence[WorkerView]],
                  models: Mapping[str, ModelState], by_name: Mapping[str, Model], adapters: Sequence[Model],
                  hosting: Collection[str], taken: Collection[str], batch_demand: Mapping[str, int],
                  now: float) -> list[Idle]:
    """The replicas among ``workers`` (one pool's) that may be given up, the least
    recently used model's first (never used before any; ties by worker id). ``taken``:
    workers decided on this tick."""
    candidates: dict[str, list[WorkerView]] = {}
    for w in workers:
        if (w.state != "ready" or w.model is None or w.host is not None or w.id in hosting or w.id in taken
                or (w.batch and batch_demand.get(w.model, 0) > 0)):
            continue
        candidates.setdefault(w.model, []).append(w)
    # A base's engines hold its adapters' floors too.
    adapter_floor: dict[str, int] = {}
    for a in adapters:
        if a.base in candidates:
            adapter_floor[a.base] = max(adapter_floor.get(a.base, 0), replica_floor(a.autoscaling, a.prewarm, now))
    out: list[Idle] = []
    for name, ws in candidates.items():
        m, ms = by_name.get(name), models.get(name)
        if m is None or ms is None:
            continue  # a removed model's replicas go on their own
        idle, since = idle_since(ms)
        if not idle:
            continue
        floor = max(replica_floor(m.autoscaling, m.prewarm, now), adapter_floor.get(name, 0))
        spare = sum(1 for x in by_model.get(name, ()) if x.state in SERVING) - floor
        out += [Idle(w.id, name, since) for w in sorted(ws, key=lambda w: w.id)[:max(spare, 0)]]
    out.sort(key=lambda i: (-math.inf if i.since is None else i.since, i.worker_id))
    return out


def make_room(pool: Pool, waiting: Sequence[tuple[str, float]], supply: int, idle: Sequence[Idle],
              now: float) -> tuple[list[Release], dict[str, str | None]]:
    """For ``waiting`` (the pool's models at zero that found no placement this tick, the
    longest waiting first, each with since when it waits), given ``supply`` instances
    they can count on (:func:`coming`) and the replicas that may be given up
    (:func:`idle_replicas`): the evictions, one per model beyond the supply, and per
    waiting model why none can come to it (None: one will, or its grace runs). The
    first in line are covered first."""
    short = max(len(waiting) - supply, 0)
    releases = [Release(i.worker_id, i.model, "evicted", for_model=waiting[supply + k][0],
                        idle_s=None if i.since is None else round(now - i.since, 3))
                for k, i in enumerate(idle[:short])]
    covered = supply + len(releases)
    reason = capacity_reason(pool)
    return releases, {name: (reason if k >= covered and now - since >= CAPACITY_GRACE_S else None)
                      for k, (name, since) in enumerate(waiting)}
