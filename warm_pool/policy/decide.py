"""The pool policy: a pure function from a snapshot of the world to decisions.

``decide(snapshot, state, cfg, now) -> (decisions, state)``. No I/O, no clock: the
manager (``warm_pool.manager``) gathers the snapshot, calls this and stores the returned
state; ``warm_pool.fleet.actuator`` carries out the decisions. A test can step through ticks
by hand.

Per model, the replica count is the autoscaler's (``warm_pool.policy.autoscaler``: windows,
panic, TTFT, bounds, delays) and when an idle model goes to zero or gets a replica back
early is the keep-alive policy's (``warm_pool.policy.keepalive``, with the pooled prior every
model's histogram gives, ``idle_pools``); an open scheduled pre-warm window
(``warm_pool.policy.prewarm``) raises the model's floor. Then:
- a request at zero with no replica ready or loading → assign a standby worker of the
  model's shape now; with no standby, launch one within ``max_instances``;
- which standby: an asleep replica of the model first (a wake), then the standby that
  would serve it soonest: one holding a built engine of the model's engine class (a
  swap: only the weights move), else one that builds an engine, each by how long it
  would read the weights from what it holds (its host-memory copy, its disk copy, else
  the store), by the bytes each tier holds and the rates the worker measured
  (``expected_load_s``; ServerlessLLM's locality-aware placement, OSDI 2024); a standby
  holding an engine of another class comes last (its engine must go first);
- a failed load puts the model in exponential backoff (2 s, 4 s, … capped at 60 s);
  the failed worker is released back to standby. A successful start resets it. A
  replica that crashes after serving is placed again at once, unless another crashed
  within ``CRASH_WINDOW_S`` (then it backs off like a failed load: a crash loop);
- with ``asleep_ttl_s`` (GPU): an idle replica is put to sleep instead of released;
  demand for its model wakes it (an ``Assign`` to the asleep worker) before any standby
  is used; after ``asleep_ttl_s`` asleep it is released. Another model that finds no
  standby reclaims an asleep worker (``Release``) rather than launch an instance;
- a request at zero that finds nothing, in a pool at ``max_instances`` with nothing on
  its way: the least recently used idle replica of another model is released for it
  (``Release`` "evicted"; never one in flight, held by a floor or a pre-warm window);
  with none (after a grace of a few seconds, for reports of requests in flight to
  catch up), the model is ``at_capacity`` and its requests are refused at once
  (``warm_pool.policy.evict``).
Per shape (pool): the standby target follows recent cold starts with hysteresis
(``warm_pool.policy.sizer``), between ``standby_min`` and ``standby_max``; standby plus asleep
spend stays within the pool's budget and the global one (``warm_pool.policy.budget``: serving
replicas count first and are never cut; asleep ones are released before standby is
cut); the target is reached through the stopped tier on EC2 (start stopped ones before
launching, stop excess ones before terminating). Ones draining back to standby count;
never more than ``max_instances`` in all. With ``prebuild``, standbys build engines of
the named models' classes before any request, each class's share of the standbys
following the cold starts of its models (:func:`plan_prebuilds`).

One piece: ``decide`` and the placement rules its stages share; the other policies it
calls are modules of their own (named above).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from thaw.config import Autoscaling, InstanceShape, Model, Pool, ThawConfig
from thaw.wire import CachedWeights, FailureKind, WorkerState
from warm_pool.policy.autoscaler import ScaleResult, ScaleState, autoscale, evolve, observe
from warm_pool.policy.batch import batch_launches, lent_to_batch, to_preempt, wanting_batch
from warm_pool.policy.budget import PoolAsk, PoolGrant, grant
from warm_pool.policy.decisions import (
    Assign,
    AssignReason,
    Decision,
    Launch,
    LoadAdapter,
    Pack,
    Prebuild,
    Release,
    Sleep,
    Start,
    Stop,
    Terminate,
    UnloadAdapter,
)
from warm_pool.policy.evict import coming, idle_replicas, make_room
from warm_pool.policy.keepalive import (
    IdleHistogram,
    IdlePools,
    KeepAliveWindow,
    PoolKey,
    idle_interval,
    keep_alive_decision,
    keep_alive_window,
    pool_key,
    pooled,
    price_tier,
    record_idle,
)
from warm_pool.policy.prewarm import replica_floor
from warm_pool.policy.sizer import (
    SizerState,
    StandbyTarget,
    cold_start_rate,
    plan_tiers,
    size_standby,
)
from warm_pool.policy.states import SERVING, STANDBY_LIKE

BACKOFF_BASE_S = 2.0
# Cold starts counted for the standby sizer's rate (per shape).
COLD_START_WINDOW_S = 600.0
BACKOFF_MAX_S = 60.0
# A second crash after serving within this many seconds of the first is a crash loop.
CRASH_WINDOW_S = 300.0
# Bytes per second assumed for a source a worker has not measured yet: rough figures
# for an instance's memory, NVMe and S3 (with none measured only their order matters).
DEFAULT_LOAD_BYTES_PER_S = {"host": 8e9, "disk": 2e9, "s3": 1e9}
# Seconds a standby takes to build an engine (start the engine core, build the model,
# allocate the KV cache, warm up, compile), which a swap skips; and to first stop an
# engine of another class. Rough: placement compares them with load times, so only
# their order against those matters.
ENGINE_BUILD_S = 20.0
ENGINE_TEARDOWN_S = 10.0


@dataclass(frozen=True)
class WorkerView:
    """What the manager last saw of one worker."""

    id: str
    shape: str
    state: WorkerState
    model: str | None = None
    assignment_id: str | None = None
    error: str | None = None
    # When the worker entered its current state (for "asleep": when it was put to sleep).
    since: float | None = None
    # Weights it holds locally, and the bytes per second its loads read from each source.
    cached: tuple[CachedWeights, ...] = ()
    load_rates: tuple[tuple[str, float], ...] = ()
    # Its current assignment reached ready (so a failure now is a crash while serving).
    served: bool = False
    # The engine class of an engine it keeps across assignments (None: none), and
    # whether that engine is built (a swap can start now).
    prebuilt_class: str | None = None
    prebuilt_ready: bool = False
    # A packed engine: the worker (instance) it runs in. It is a replica like any other,
    # but no instance of its own: never a standby, never launched, stopped or counted.
    host: str | None = None
    # The memory its current engine holds (0: none, or not counted), and on a worker
    # that packs, what its engines may hold together (0: it does not pack).
    memory_bytes: int = 0
    capacity_bytes: int = 0
    # LoRA adapters in its engine: (adapter model, loading | ready | unloading | failed).
    adapters: tuple[tuple[str, str], ...] = ()
    # A failed worker: the kind of its failure.
    failure_kind: FailureKind | None = None
    # The model's registry revision its assignment serves (None: not known).
    revision: int | None = None
    # Its assignment is batch work (``warm_pool.policy.batch``): another assignment takes it.
    batch: bool = False

    def adapter(self, model: str) -> str | None:
        """The state of adapter ``model`` in this worker's engine (None: not there)."""
        return next((st for name, st in self.adapters if name == model), None)


@dataclass(frozen=True)
class ModelActivity:
    """Traffic for one model, summed over the activators that reported it."""

    queued: int = 0
    in_flight: int = 0
    last_request_at: float | None = None
    # Requests accepted since the previous tick, and hot requests' TTFTs seen since then.
    arrivals: int = 0
    ttfts: tuple[float, ...] = ()

    @property
    def demand(self) -> int:
        return self.queued + self.in_flight

    def plus(self, other: ModelActivity) -> ModelActivity:
        """Both models' traffic as one (a base and the adapters served on its engines)."""
        last = max(filter(None, (self.last_request_at, other.last_request_at)), default=None)
        return ModelActivity(self.queued + other.queued, self.in_flight + other.in_flight, last,
                             self.arrivals + other.arrivals, self.ttfts + other.ttfts)


@dataclass(frozen=True)
class Snapshot:
    workers: tuple[WorkerView, ...]
    activity: dict[str, ModelActivity] = field(default_factory=dict)
    # Shapes whose launches are paused until then (capacity errors): shape -> epoch s.
    launch_blocked_until: dict[str, float] = field(default_factory=dict)
    # Each model's engine class (thaw.engine_class), where known.
    model_classes: dict[str, str] = field(default_factory=dict)
    # The memory one engine of each model holds on its shape (thaw.fit.engine_memory),
    # where known: only these are packed.
    engine_bytes: dict[str, int] = field(default_factory=dict)
    # Per model, the registry revisions whose replicas a roll replaces (weights or engine
    # settings other than the current revision's).
    outdated: dict[str, frozenset[int]] = field(default_factory=dict)
    # Per model, the lines of running batches not answered yet (warm_pool.policy.batch).
    batch_demand: dict[str, int] = field(default_factory=dict)

    # Indexes of ``workers`` the stages read, each in the workers' order, built once per
    # snapshot: a stage that judges one model reads its workers, not the fleet's.
    @cached_property
    def by_model(self) -> dict[str, tuple[WorkerView, ...]]:
        out: dict[str, list[WorkerView]] = {}
        for w in self.workers:
            if w.model is not None:
                out.setdefault(w.model, []).append(w)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def model_sizes(self) -> dict[str, int]:
        """Each model's size (by URI) as any worker's cache records it."""
        out: dict[str, int] = {}
        for w in self.workers:
            for c in w.cached:
                out[c.uri] = max(out.get(c.uri, 0), c.total_bytes)
        return out

    @cached_property
    def holding(self) -> dict[str, frozenset[str]]:
        """The workers that hold some of a model's weights, by its URI."""
        out: dict[str, set[str]] = {}
        for w in self.workers:
            for c in w.cached:
                out.setdefault(c.uri, set()).add(w.id)
        return {k: frozenset(v) for k, v in out.items()}

    @cached_property
    def prebuilt(self) -> dict[str, frozenset[str]]:
        """The workers that keep an engine, by its class."""
        out: dict[str, set[str]] = {}
        for w in self.workers:
            if w.prebuilt_class is not None:
                out.setdefault(w.prebuilt_class, set()).add(w.id)
        return {k: frozenset(v) for k, v in out.items()}

    @cached_property
    def by_shape(self) -> dict[str, tuple[WorkerView, ...]]:
        out: dict[str, list[WorkerView]] = {}
        for w in self.workers:
            out.setdefault(w.shape, []).append(w)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def hosting(self) -> frozenset[str]:
        """Workers that run packed engines: never standbys, even with no engine of their own."""
        return frozenset(w.host for w in self.workers if w.host is not None)

    @cached_property
    def standbys(self) -> dict[str, tuple[WorkerView, ...]]:
        """Standby instances by shape, by id: the ones free to take a model."""
        out: dict[str, list[WorkerView]] = {}
        hosting = self.hosting
        for w in sorted((w for w in self.workers if w.state == "standby" and w.host is None and w.id not in hosting),
                        key=lambda w: w.id):
            out.setdefault(w.shape, []).append(w)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def asleep(self) -> tuple[WorkerView, ...]:
        """Asleep workers, the longest asleep first."""
        return tuple(sorted((w for w in self.workers if w.state == "asleep"), key=lambda w: (w.since or 0.0, w.id)))

    @cached_property
    def on_batch(self) -> tuple[WorkerView, ...]:
        """Workers on batch assignments (the only ones that can be lent to batch)."""
        return tuple(w for w in self.workers if w.batch)

    @cached_property
    def troubled(self) -> tuple[WorkerView, ...]:
        """Workers failed or unreachable, or with an adapter that failed to load."""
        return tuple(w for w in self.workers if w.state in ("failed", "unreachable")
                     or (w.adapters and any(st == "failed" for _, st in w.adapters)))


@dataclass(frozen=True)
class ModelState:
    failures: int = 0
    backoff_until: float = 0.0
    last_error: str | None = None
    # Its kind: what callers are told of it.
    last_failure_kind: FailureKind | None = None
    # The assignment whose failure was last counted, so a failure seen on several
    # ticks (until the worker is reset) counts once.
    counted_assignment: str | None = None
    # When a replica of it last crashed after serving (see CRASH_WINDOW_S).
    last_crash_at: float | None = None
    # The autoscaler's carried state (windows, delays, panic) and its last result.
    scale: ScaleState = ScaleState()
    last_scale: ScaleResult | None = None
    # Since when nothing is queued or in flight (None: busy, or never used), the idle
    # intervals seen so far, and the keep-alive window they give.
    idle_since: float | None = None
    idle_histogram: IdleHistogram = IdleHistogram()
    # Since when the model has been known with no request and nothing learnt (None once
    # it has had one): the wait for its first request is its first idle interval. A
    # sparse model then says so with its first request, not after several idle periods.
    seen_since: float | None = None
    keep_alive: KeepAliveWindow | None = None
    # What the window was judged on: the histogram (by identity) and the idle start. A
    # window holds for one idle period; the pooled prior moving does not change it.
    keep_alive_basis: tuple[IdleHistogram, float | None] | None = field(default=None, compare=False, repr=False)
    # Since when requests wait with no replica ready or loading (None: they do not): a
    # cold start, counted once for the standby sizer (not once per tick it lasts), and
    # first in line for a standby (the longest waiting first).
    at_zero_since: float | None = None
    # Replicas it wanted at its last judgement that no standby (nor reclaimed asleep
    # worker) could give: launches for demand. Counted for the pools even on a tick
    # that does not judge the model (the simulator's), as the controller would count it.
    unmet: int = 0
    # Why its requests, waiting at zero, can get no instance: its pool is at
    # max_instances and no idle replica of another model could be taken for it within
    # its grace (``warm_pool.policy.evict``). The route table's failure kind "capacity": activators
    # answer its requests 503 at once. None: an instance will come, or none wait.
    at_capacity: str | None = None
    # Its replica was evicted for a waiting model in this idle period: its keep-alive
    # bet was lost to a request that was there, so it is let go until its next request
    # (not put back on the next free standby, where the next waiting model would evict
    # it again; nor judged on every tick for the rest of its keep-alive).
    evicted: bool = False


@dataclass(frozen=True)
class PoolState:
    """The standby sizer's carried state for one shape, and its last outputs."""

    sizer: SizerState = SizerState()
    # When models of this shape needed a cold start, within COLD_START_WINDOW_S.
    cold_starts: tuple[float, ...] = ()
    # The same per engine class of the pool's prebuild list (its share of prebuilt standbys).
    class_cold_starts: dict[str, tuple[float, ...]] = field(default_factory=dict)
    target: StandbyTarget | None = None
    grant: PoolGrant | None = None


@dataclass(frozen=True)
class PolicyState:
    models: dict[str, ModelState] = field(default_factory=dict)
    pools: dict[str, PoolState] = field(default_factory=dict)
    # Incremented for every assignment, to make assignment ids unique.
    assignments: int = 0
    # The controller's start id, in assignment ids: unique across controller restarts.
    epoch: str = ""
    # Every model's idle intervals pooled: the keep-alive policy's prior (derived from
    # the models' histograms at each tick's start, by ``idle_pools``).
    idle_pools: IdlePools = IdlePools()




def _standout(snap: Snapshot, uri: str, engine_class: str | None) -> frozenset[str]:
    """The workers that hold ``uri``'s weights or an engine of ``engine_class``."""
    held = snap.holding.get(uri, frozenset())
    return held | snap.prebuilt.get(engine_class, frozenset()) if engine_class else held


def expected_load(w: WorkerView, uri: str, total_bytes: int) -> tuple[float, str]:
    """Seconds ``w`` would take to read the model at ``uri`` (``total_bytes``), and the
    slowest tier it would read from: its host copy first, then what its disk holds
    beyond that, the rest from the store, each at the rate the worker measured."""
    rates = {**DEFAULT_LOAD_BYTES_PER_S, **{k: v for k, v in w.load_rates if v > 0}}
    held = {c.tier: c.bytes for c in w.cached if c.uri == uri}
    host = min(held.get("host", 0), total_bytes)
    disk = min(max(held.get("disk", 0) - host, 0), total_bytes - host)
    s3 = total_bytes - host - disk
    seconds = host / rates["host"] + disk / rates["disk"] + s3 / rates["s3"]
    tier = "s3" if s3 > 0 or total_bytes == 0 else "disk" if disk > 0 else "host"
    return seconds, tier


def expected_start(w: WorkerView, uri: str, total_bytes: int, engine_class: str | None) -> tuple[float, str]:
    """Seconds until ``w`` would serve the model at ``uri`` (of ``engine_class``) and the
    tier it would start from: "swap" into its built engine of that class (only the
    weights move), else build an engine and load (after stopping an engine of another
    class it holds), the tier then being where the weights come from."""
    seconds, tier = expected_load(w, uri, total_bytes)
    if w.prebuilt_class is not None and w.prebuilt_class == engine_class:
        return (seconds, "swap") if w.prebuilt_ready else (seconds + ENGINE_BUILD_S, tier)
    if w.prebuilt_class is not None:
        return seconds + ENGINE_BUILD_S + ENGINE_TEARDOWN_S, tier
    return seconds + ENGINE_BUILD_S, tier


# Placement weighs every standby that holds the model's weights or an engine of its
# class, and of the others (which differ only by the read rates each measured) the
# first this many: a burst of a thousand models on a thousand standbys would otherwise
# weigh a million pairs in one tick.
PLACE_SCAN = 64


def place(standbys: list[WorkerView], uri: str, total_bytes: int,
          engine_class: str | None = None, special: Collection[str] | None = None) -> tuple[WorkerView, str, float]:
    """Take from ``standbys`` the one expected to serve ``uri`` soonest (ties: the first);
    returns it, its tier and the expected seconds of the load (a swap's or a build's).
    ``special``: the ids of the workers that hold ``uri``'s weights or an engine of
    ``engine_class`` (None: not known, every standby is weighed); the others are weighed
    only among the first ``PLACE_SCAN``."""
    if special is None or len(standbys) <= PLACE_SCAN:
        weighed: Iterable[int] = range(len(standbys))
    else:
        weighed = [i for i, w in enumerate(standbys) if i < PLACE_SCAN or w.id in special] if special \
            else range(PLACE_SCAN)
    best = min(weighed, key=lambda i: (expected_start(standbys[i], uri, total_bytes, engine_class)[0], i))
    w = standbys.pop(best)
    _, tier = expected_start(w, uri, total_bytes, engine_class)
    return w, tier, expected_load(w, uri, total_bytes)[0]


_last_kept: tuple[ThawConfig, Mapping[str, str], dict[str, str]] | None = None


def kept_classes(cfg: ThawConfig, classes: Mapping[str, str]) -> dict[str, str]:
    """The models whose engines are kept across assignments, with their class: those
    of a class their pool pre-builds (``pools[].prebuild``). Only these start swappable
    and are parked, engine and all, when released; others build and drop their engine.
    (Kept for the last config and classes, which are replaced, never changed: every
    assignment asks.)"""
    global _last_kept
    if _last_kept is not None and _last_kept[0] is cfg and _last_kept[1] is classes:
        return _last_kept[2]
    out = _kept_classes(cfg, classes)
    _last_kept = (cfg, classes, out)
    return out


def _kept_classes(cfg: ThawConfig, classes: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pool in cfg.pools:
        wanted = {classes[n] for n in pool.prebuild if n in classes}
        out.update({m.name: classes[m.name] for m in cfg.models
                    if m.shape == pool.shape and classes.get(m.name) in wanted})
    return out


def plan_prebuilds(prebuild: list[tuple[str, str]], standbys: list[WorkerView], *, target: int,
                   class_cold_starts: dict[str, int]) -> list[Prebuild]:
    """Which idle standbys should build an engine, and of which class.

    ``prebuild``: ``(model, engine class)`` in the pool's order (the first model named
    for a class builds it); ``standbys``: the pool's idle standbys; ``target``: the
    pool's standby target; ``class_cold_starts``: recent cold starts per class, of all
    the pool's models (``""``: models of no prebuilt class). Each class wants
    ``ceil(target x its share of the cold starts)`` standbys with its engine, at least
    one; with no cold starts yet, one each. Standbys holding an engine (built or
    building) count where they are; only standbys without one are given one, in id
    order, never more than there are.
    """
    classes: dict[str, str] = {}
    for model, cls in prebuild:
        classes.setdefault(cls, model)
    total = sum(class_cold_starts.values())
    have = {cls: sum(1 for w in standbys if w.prebuilt_class == cls) for cls in classes}
    plain = sorted((w for w in standbys if w.prebuilt_class is None), key=lambda w: w.id)
    out: list[Prebuild] = []
    for cls, model in classes.items():
        share = class_cold_starts.get(cls, 0) / total if total else 0.0
        wanted = max(1, math.ceil(target * share))
        for _ in range(max(wanted - have[cls], 0)):
            if not plain:
                return out
            out.append(Prebuild(plain.pop(0).id, model, cls))
    return out


def pack_room(workers: Collection[WorkerView]) -> dict[str, int]:
    """Free memory per worker that can take a packed engine now: one that packs
    (``capacity_bytes``), is serving or hosts packed engines (a live worker: a plain
    standby is taken whole instead), less what its engine and its packed engines hold."""
    held: dict[str, int] = {}
    for w in workers:
        if w.host is not None and w.state in ("loading", "ready", "draining", "failed", "asleep"):
            held[w.host] = held.get(w.host, 0) + w.memory_bytes
    room = {}
    for w in workers:
        if w.host is not None or w.capacity_bytes <= 0:
            continue
        serving = w.state in ("loading", "ready")
        if serving and w.memory_bytes <= 0:
            continue  # its own engine's memory is not known: nothing is packed beside it
        if serving or (w.state == "standby" and w.id in held):
            mine = w.memory_bytes if serving else 0
            room[w.id] = w.capacity_bytes - mine - held.get(w.id, 0)
    return room


def place_packed(room: dict[str, int], shape_of: Mapping[str, str], shape: str, need: int) -> str | None:
    """The worker of ``shape`` to pack an engine needing ``need`` bytes into: the one
    with the least room that fits it (best fit: the larger rooms stay for larger
    models; ties by id); None when none fits."""
    fits = [(r, wid) for wid, r in room.items() if shape_of.get(wid) == shape and r >= need]
    return min(fits)[1] if fits else None


def _held(w: WorkerView, wanted_classes: Collection[str] = ()) -> tuple[bool, bool, int, int]:
    """What a standby is worth keeping for: an engine of a class its pool pre-builds,
    then any built engine (the fastest cold starts of their classes), then its copies
    of weights, bytes in memory, then on disk."""
    return (w.prebuilt_class in wanted_classes, w.prebuilt_class is not None,
            sum(c.bytes for c in w.cached if c.tier == "host"), sum(c.bytes for c in w.cached if c.tier == "disk"))


def _adapter_decisions(name: str, hosts: list[WorkerView], replicas: list[WorkerView], want: int,
                       act: ModelActivity, ms: ModelState, now: float, *, max_loras: int,
                       added: dict[str, int]) -> list[Decision]:
    """Load adapter ``name`` into engines of its base that have a slot (the fewest
    adapters first), or unload it (loading ones first, then the newest); ``added``:
    adapters this tick has loaded per worker already. With no engine of its base, its
    traffic is its base's demand, which brings one up."""
    out: list[Decision] = []
    if len(replicas) < want and now >= ms.backoff_until:
        def held(w: WorkerView) -> int:
            return sum(1 for _, st in w.adapters if st != "failed") + added.get(w.id, 0)

        free = sorted((w for w in hosts if w.adapter(name) is None and held(w) < max_loras),
                      key=lambda w: (held(w), w.id))
        reason: AssignReason = "demand" if act.demand and not replicas else "scale_up"
        for w in free[: want - len(replicas)]:
            added[w.id] = added.get(w.id, 0) + 1
            out.append(LoadAdapter(w.id, name, reason))
    elif len(replicas) > want:
        idle = not act.demand
        for w in sorted(replicas, key=lambda w: (w.adapter(name) != "loading", w.id))[: len(replicas) - want]:
            out.append(UnloadAdapter(w.id, name, "idle" if idle else "excess"))
    return out


def launch_backoff_s(failures: int, base_s: float, max_s: float) -> float:
    """``base_s`` doubled per failure after the first, capped at ``max_s``: the pause
    after ``failures`` failures in a row (a shape's launches, a model's loads)."""
    # (The exponent capped: thousands of failed launches must not overflow a float.)
    return min(base_s * 2.0 ** min(max(failures - 1, 0), 64), max_s)


def backoff_s(failures: int) -> float:
    """2, 4, 8, ... seconds, capped: the wait after ``failures`` consecutive failed loads."""
    return launch_backoff_s(failures, BACKOFF_BASE_S, BACKOFF_MAX_S)


def _track_idle(ms: ModelState, act: ModelActivity, a: Autoscaling, now: float) -> ModelState:
    """Keep-alive bookkeeping: when the model went idle, and each idle interval ended by
    an arrival (into the histogram the hybrid policy learns from)."""
    if act.demand or act.arrivals:
        began = ms.idle_since
        if began is None and ms.seen_since is not None and not ms.idle_histogram.total() \
                and now > ms.seen_since:
            # Its first request: the wait since it was first seen. (A request already
            # there when it was first seen shows no wait: nothing to learn.)
            began = ms.seen_since
        gap = idle_interval(began, now)
        if ms.seen_since is not None:
            ms = evolve(ms, seen_since=None)
        if gap is not None and a.keep_alive == "histogram":
            ms = evolve(ms, idle_histogram=record_idle(ms.idle_histogram, gap, a.keep_alive_histogram,
                                                       began_at=began))
        if act.demand:
            return ms if ms.idle_since is None else evolve(ms, idle_since=None)
        # Requests came and went between two ticks: idle again from the last one's end.
        return evolve(ms, idle_since=min(act.last_request_at or now, now))
    if ms.idle_since is None and act.last_request_at is not None:
        # Idle from the last request's end, as the activators last saw it (a request
        # before this controller saw the model: no first wait to learn). A model never
        # used has no idle start: nothing keeps it warm beyond min_replicas.
        return evolve(ms, idle_since=min(act.last_request_at, now), seen_since=None)
    return ms


def idle_pools(models: Mapping[str, ModelState], cfg: ThawConfig, pools: IdlePools, now: float) -> IdlePools:
    """The pooled prior as the tick at ``now`` starts: ``pools`` brought up to the
    histograms of the models that learn (``keep_alive: histogram``)."""
    if pools.at == now:
        return pools
    return pooled(pools, {name: (key, models[name].idle_histogram) for name, key in _index(cfg).learners
                          if name in models}, now)


def _keep_alive(ms: ModelState, m: Model, cfg: ThawConfig, pools: IdlePools) -> ModelState:
    """``ms`` with the keep-alive window for its idle period: judged again only when the
    histogram or the idle start changed (with the pooled prior as the tick started)."""
    basis = ms.keep_alive_basis
    if ms.keep_alive is not None and basis is not None and basis[0] is ms.idle_histogram \
            and basis[1] == ms.idle_since:
        return ms
    a = m.autoscaling
    prior = None
    if a.keep_alive == "histogram":
        prior = pools.prior(m.name, pool_key(a.keep_alive_histogram))
    window = keep_alive_window(ms.idle_histogram, a, prior, price_tier(m, cfg), idle_since=ms.idle_since)
    return evolve(ms, keep_alive=window, keep_alive_basis=(ms.idle_histogram, ms.idle_since))


def track(ms: ModelState, act: ModelActivity, m: Model, cfg: ThawConfig, now: float, pools: IdlePools) -> ModelState:
    """One tick's bookkeeping for a model, before any decision: its idle interval and
    keep-alive window, and its traffic in the autoscaler's windows. ``decide`` does this
    for every model it judges; the simulator calls it alone for a model whose decision
    cannot change this tick (same inputs, same state as ``decide`` would leave), with
    the same ``pools`` (``idle_pools`` at the tick's start)."""
    a = m.autoscaling
    ms = _keep_alive(_track_idle(ms, act, a, now), m, cfg, pools)
    return evolve(ms, scale=observe(ms.scale, now, act.demand, act.arrivals, act.ttfts, a.stable_window_s))


@dataclass(frozen=True)
class _ConfigIndex:
    """What the stages read of a config on every tick, built once per config."""

    by_name: dict[str, Model]
    order: dict[str, int]  # each model's place in the config
    adapters: tuple[Model, ...]  # models with a base, in config order
    packing: frozenset[str]  # the shapes whose pools pack engines
    learners: tuple[tuple[str, PoolKey], ...]  # models with keep_alive: histogram, and their pool


_last_index: tuple[ThawConfig, _ConfigIndex] | None = None


def _index(cfg: ThawConfig) -> _ConfigIndex:
    """``cfg``'s index (a config is frozen: the last one's is kept, with the config)."""
    global _last_index
    if _last_index is not None and _last_index[0] is cfg:
        return _last_index[1]
    index = _ConfigIndex(
        by_name={m.name: m for m in cfg.models},
        order={m.name: i for i, m in enumerate(cfg.models)},
        adapters=tuple(m for m in cfg.models if m.base is not None),
        packing=frozenset(p.shape for p in cfg.pools if p.pack),
        learners=tuple((m.name, pool_key(m.autoscaling.keep_alive_histogram)) for m in cfg.models
                       if m.autoscaling.keep_alive == "histogram"))
    _last_index = (cfg, index)
    return index


@dataclass
class _Tick:
    """One tick's working state, shared by the stages of :func:`decide` (each stage a
    function of its own, in the order ``decide`` runs them)."""

    snap: Snapshot
    cfg: ThawConfig
    now: float
    only: Collection[str] | None
    models: dict[str, ModelState]
    n_assign: int
    tag: str
    by_name: dict[str, Model]
    # Workers that run packed engines: not standbys even when their own engine is gone.
    hosting: frozenset[str]
    free: dict[str, list[WorkerView]]  # standbys by shape, ready to take a model
    packing: frozenset[str]  # the shapes whose pools pack engines
    room: dict[str, int]  # free bytes per worker that packs
    shape_of: dict[str, str]
    activity: dict[str, ModelActivity]
    decisions: list[Decision] = field(default_factory=list)
    asleep: dict[str, list[WorkerView]] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)  # asleep workers released this tick
    launches_for_demand: dict[str, int] = field(default_factory=dict)
    cold_now: dict[str, int] = field(default_factory=dict)
    cold_class_now: dict[str, int] = field(default_factory=dict)
    adapters_added: dict[str, int] = field(default_factory=dict)
    preempted: set[str] = field(default_factory=set)  # workers lent to batch, taken back this tick
    # Per shape, the models at zero whose placement found nothing this tick, in the order
    # judged (the longest waiting first): ``_make_room``'s to serve.
    stranded: dict[str, list[str]] = field(default_factory=dict)
    batch_extra: dict[str, int] = field(default_factory=dict)
    idle_pools: IdlePools = IdlePools()

    @classmethod
    def start(cls, snap: Snapshot, state: PolicyState, cfg: ThawConfig, now: float,
              only: Collection[str] | None) -> _Tick:
        index = _index(cfg)
        free = {shape: list(ws) for shape, ws in snap.standbys.items()}
        packing = index.packing
        # A base's engines serve its adapters too: it scales, and stays, for their traffic
        # as well as its own.
        activity = snap.activity
        if index.adapters and any(m.name in activity for m in index.adapters):
            activity = dict(activity)
            for m in index.adapters:
                if m.name in snap.activity:
                    base = m.base
                    assert base is not None
                    activity[base] = activity.get(base, ModelActivity()).plus(snap.activity[m.name])
        return cls(snap=snap, cfg=cfg, now=now, only=only, models=dict(state.models), n_assign=state.assignments,
                   tag=f"{state.epoch}-" if state.epoch else "", by_name=index.by_name,
                   hosting=snap.hosting, free=free, packing=packing, room=pack_room(snap.workers) if packing else {},
                   shape_of={w.id: w.shape for w in snap.workers} if packing else {}, activity=activity,
                   idle_pools=idle_pools(state.models, cfg, state.idle_pools, now))

    def assignment_id(self, model: str) -> str:
        self.n_assign += 1
        return f"{model}-{self.tag}{self.n_assign}"


def decide(
    snap: Snapshot, state: PolicyState, cfg: ThawConfig, now: float, *,
    only: Collection[str] | None = None, pools: bool = True,
) -> tuple[list[Decision], PolicyState]:
    """This tick's decisions and the state for the next.

    ``only``: the models to judge (``warm_pool.judging`` in the controller, the fast mode
    in the simulator: those whose decision can change); the others keep their state
    untouched. The pools are judged every tick, unless ``pools=False`` (the simulator,
    which knows no pool's inputs changed since its last judgement: then they are judged
    only if this tick's model decisions touch them).
    """
    t = _Tick.start(snap, state, cfg, now, only)
    _failures(t)
    _removed(t)
    _asleep(t)
    for m in _judged(t):
        _model(t, m)
    _make_room(t)
    _batch(t)
    if not pools and not t.decisions and not t.launches_for_demand and not t.batch_extra:
        return t.decisions, PolicyState(models=t.models, assignments=t.n_assign, epoch=state.epoch,
                                        pools=state.pools, idle_pools=t.idle_pools)
    if only is not None:
        # Models not judged this tick still wait for the launches they asked for.
        for name, ms in t.models.items():
            if ms.unmet and name not in only:
                m_cfg = t.by_name.get(name)
                if m_cfg is not None:
                    t.launches_for_demand[m_cfg.shape] = t.launches_for_demand.get(m_cfg.shape, 0) + ms.unmet
    pool_states = _pools(t, state)
    return t.decisions, PolicyState(models=t.models, assignments=t.n_assign, epoch=state.epoch, pools=pool_states,
                                    idle_pools=t.idle_pools)


def _failures(t: _Tick) -> None:
    """1. Failed loads: count once, back off, reset the worker (an adapter: unload it);
    an unreachable worker is terminated."""
    now = t.now
    troubled = t.snap.troubled
    for w in troubled:
        for name, st in w.adapters:
            if st == "failed":
                ms = t.models.get(name, ModelState())
                key = f"{w.id}/{w.assignment_id}/{name}"
                if key != ms.counted_assignment:
                    failures = ms.failures + 1
                    t.models[name] = evolve(ms, failures=failures, backoff_until=now + backoff_s(failures),
                                            last_error=f"loading the adapter failed on {w.id}",
                                            last_failure_kind="engine", counted_assignment=key)
                t.decisions.append(UnloadAdapter(w.id, name, "failed"))
    for w in troubled:
        if w.state == "failed":
            if w.model is not None:
                ms = t.models.get(w.model, ModelState())
                if w.assignment_id is None or w.assignment_id != ms.counted_assignment:
                    if w.served and (ms.last_crash_at is None or now - ms.last_crash_at > CRASH_WINDOW_S):
                        # A replica that served, then crashed: its weights and settings are
                        # proven, so the model is placed again at once, its requests wait
                        # for that instead of being refused.
                        t.models[w.model] = evolve(ms, last_crash_at=now, counted_assignment=w.assignment_id)
                    else:
                        failures = ms.failures + 1
                        t.models[w.model] = ModelState(
                            failures=failures, backoff_until=now + backoff_s(failures),
                            last_error=w.error, last_failure_kind=w.failure_kind or "engine",
                            counted_assignment=w.assignment_id,
                            last_crash_at=now if w.served else ms.last_crash_at,
                            # What it learnt of its traffic outlives the failure.
                            idle_histogram=ms.idle_histogram,
                        )
            t.decisions.append(Release(w.id, w.model, "failed"))
        elif w.state == "unreachable":
            t.decisions.append(Terminate(w.id, "unreachable"))


def _removed(t: _Tick) -> None:
    """Models no longer served (`thaw models rm`): their replicas drain and are released,
    their adapters unloaded (asleep ones go in :func:`_asleep`)."""
    for w in t.snap.workers:
        if w.model is not None and w.model not in t.by_name and w.state in SERVING:
            t.decisions.append(Release(w.id, w.model, "removed"))
        for name, st in w.adapters:
            if name not in t.by_name and st in ("loading", "ready"):
                t.decisions.append(UnloadAdapter(w.id, name, "removed"))


def _asleep(t: _Tick) -> None:
    """Asleep workers: released once past their model's asleep_ttl_s (or asleep with an
    outdated revision), else kept for a wake."""
    for w in t.snap.asleep:
        m_cfg = t.by_name.get(w.model) if w.model else None
        ttl = m_cfg.autoscaling.asleep_ttl_s if m_cfg else 0.0
        if m_cfg is None or ttl <= 0 or (w.since is not None and t.now - w.since >= ttl):
            t.decisions.append(Release(w.id, w.model, "asleep_expired"))
            t.gone.add(w.id)
        elif w.revision in t.snap.outdated.get(m_cfg.name, ()):
            t.decisions.append(Release(w.id, w.model, "rolled"))  # it would wake with old weights
            t.gone.add(w.id)
        else:
            t.asleep.setdefault(m_cfg.name, []).append(w)


def _reclaim(t: _Tick, shape: str, for_model: str) -> bool:
    """Release the longest-asleep worker of another model on ``shape`` for reuse."""
    for name, ws in t.asleep.items():
        if name == for_model:
            continue
        for w in ws:
            if w.shape == shape and w.id not in t.gone:
                t.decisions.append(Release(w.id, w.model, "reclaimed"))
                t.gone.add(w.id)
                return True
    return False


def _judged(t: _Tick) -> list[Model]:
    """The models judged this tick, in order: those whose requests wait at zero take the
    free standbys first, the longest waiting first; the others follow in config order."""
    if t.only is None:
        judged = t.cfg.models
    else:
        index = _index(t.cfg)
        judged = sorted((index.by_name[n] for n in t.only if n in index.by_name), key=lambda m: index.order[m.name])
    waited = {m.name: since for m in judged
              if (prev := t.models.get(m.name)) is not None and (since := prev.at_zero_since) is not None}
    if waited:
        judged = sorted(judged, key=lambda m: waited.get(m.name, math.inf))  # stable: config order after
    return list(judged)


def _model(t: _Tick, m: Model) -> None:
    """2. One model: the autoscaler's target, with the keep-alive policy deciding when
    an idle model keeps a replica (or gets one back early) and when it goes to zero;
    then replicas placed, rolled or released to meet it."""
    snap, now = t.snap, t.now
    act = t.activity.get(m.name, ModelActivity())
    if m.base is None:
        replicas = [w for w in snap.by_model.get(m.name, ()) if w.state in SERVING]
        ready = [w for w in replicas if w.state == "ready"]
        hosts: list[WorkerView] = []
    else:
        # An adapter's replicas are the engines of its base that hold it.
        hosts = [w for w in snap.by_model.get(m.base, ()) if w.state == "ready"]
        replicas = [w for w in hosts if w.adapter(m.name) in ("loading", "ready")]
        ready = [w for w in replicas if w.adapter(m.name) == "ready"]
    ms = t.models.get(m.name) or ModelState(seen_since=t.now)
    if ready and ms.failures:
        ms = evolve(ms, failures=0, backoff_until=0.0, last_error=None, last_failure_kind=None)
    a = m.autoscaling
    # A scheduled pre-warm window raises the floor (within max_replicas) while it is open.
    floor = replica_floor(a, m.prewarm, now)
    if floor > a.min_replicas:
        a = a.model_copy(update={"min_replicas": floor})
    # A roll (a new revision's weights or engine): replicas of older revisions are
    # replaced by as many current ones. For the autoscaler the model has as many
    # replicas as the larger of the two sets (one replaces the other).
    stale = snap.outdated.get(m.name, frozenset()) if m.base is None else frozenset()
    outdated = [w for w in replicas if w.revision in stale]
    if outdated:
        replicas = [w for w in replicas if w.revision not in stale]
        ready = [w for w in replicas if w.state == "ready"]
    ms = track(ms, act, m, t.cfg, now, t.idle_pools)
    if ms.evicted and (act.demand or act.arrivals):
        ms = evolve(ms, evicted=False)  # a request again: its next idle period is a new bet
    window = ms.keep_alive
    assert window is not None  # track judged it
    keep_warm = ms.idle_since is not None and not ms.evicted and keep_alive_decision(window, ms.idle_since, now).keep
    result, scale = autoscale(ms.scale, current=max(len(replicas), len(outdated)), now=now, a=a,
                              demand_now=act.demand, keep_warm=keep_warm, loading=len(replicas) - len(ready))
    at_zero_since = None
    if act.demand and not replicas and not outdated:
        if ms.at_zero_since is None and m.base is None:  # an adapter's is its base's
            t.cold_now[m.shape] = t.cold_now.get(m.shape, 0) + 1
            cls = snap.model_classes.get(m.name, "")
            t.cold_class_now[cls] = t.cold_class_now.get(cls, 0) + 1
        at_zero_since = now if ms.at_zero_since is None else ms.at_zero_since
    t.models[m.name] = ms = evolve(ms, scale=scale, last_scale=result, at_zero_since=at_zero_since,
                                   at_capacity=ms.at_capacity if at_zero_since is not None else None)
    want = result.target
    if m.base is not None:
        t.decisions.extend(_adapter_decisions(m.name, hosts, replicas, want, act, ms, now,
                                              max_loras=int(t.cfg.engine_args(t.by_name[m.base]).extra["max_loras"]),
                                              added=t.adapters_added))
        return
    # Each old replica is released once a current one is ready to take its traffic
    # (one still loading at once: nobody waits on it).
    if outdated:
        covered = len(ready) + len(outdated) - want
        for w in sorted(outdated, key=lambda w: (w.state != "loading", w.id)):
            if w.state == "loading" or covered > 0:
                t.decisions.append(Release(w.id, m.name, "rolled"))
                covered -= w.state == "ready"
    if len(replicas) < want:
        if now < ms.backoff_until:
            if ms.unmet:
                t.models[m.name] = evolve(ms, unmet=0)
            return
        own_min = m.autoscaling.min_replicas  # without the schedule: its replicas are pre-warm
        reason: AssignReason = ("roll" if outdated else
                                "demand" if act.demand and not replicas else
                                "prewarm" if not act.demand and not replicas and want > own_min else
                                "min_replicas" if want <= own_min else "scale_up")
        unmet = _place(t, m, want - len(replicas), reason)
        if unmet != ms.unmet:
            t.models[m.name] = ms = evolve(ms, unmet=unmet)
    elif ms.unmet:
        t.models[m.name] = ms = evolve(ms, unmet=0)
    if len(replicas) > want:
        # Release loading replicas first (nobody waits on them), then the newest ready;
        # a model going idle with an asleep tier puts its ready ones to sleep instead.
        extra = len(replicas) - want
        idle = want <= a.min_replicas and not act.demand
        # One on batch work stays while the model's batches have lines to run.
        kept = snap.batch_demand.get(m.name, 0) > 0
        going = [w for w in replicas if not (w.batch and kept)]
        for w in sorted(going, key=lambda w: (w.state != "loading", w.id))[:extra]:
            if w.state == "ready" and idle and a.asleep_ttl_s > 0:
                t.decisions.append(Sleep(w.id, m.name))
            else:
                t.decisions.append(Release(w.id, m.name, "idle" if idle else "excess"))


def _place(t: _Tick, m: Model, n: int, reason: AssignReason) -> int:
    """``n`` more replicas of ``m``, each where it serves soonest: a wake, free room on a
    worker that packs, a standby, one lent to batch taken back, an asleep worker of
    another model reclaimed; how many found none (launches asked of the pool)."""
    sleeping = [w for w in reversed(t.asleep.get(m.name, [])) if w.id not in t.gone]
    unmet = 0
    for _ in range(n):
        standbys = t.free.get(m.shape) or []
        need = t.snap.engine_bytes.get(m.name) if m.shape in t.packing else None
        host = place_packed(t.room, t.shape_of, m.shape, need) if need else None
        if sleeping:
            # Waking the model where it sleeps beats loading it anywhere.
            w = sleeping.pop(0)
            t.gone.add(w.id)
            t.decisions.append(Assign(w.id, m.name, t.assignment_id(m.name), reason))
        elif host is not None and need:
            # Free room on a worker already serving: no standby is taken. (A pool that
            # packs pre-builds nothing, so no swap would be sooner.)
            t.room[host] -= need
            aid = t.assignment_id(m.name)
            t.decisions.append(Pack(host, m.name, aid, f"{host}.{aid}", need, reason))
        elif standbys:
            cls = t.snap.model_classes.get(m.name)
            w, tier, secs = place(standbys, m.uri, t.snap.model_sizes.get(m.uri, 0), cls,
                                  special=_standout(t.snap, m.uri, cls))
            t.decisions.append(Assign(w.id, m.name, t.assignment_id(m.name), reason, tier, round(secs, 3)))
        elif (taken := to_preempt(t.snap.on_batch, m.shape, t.activity, t.preempted)) is not None:
            # A standby lent to batch work: the online model takes it back now.
            t.preempted.add(taken.id)
            t.decisions.append(Assign(taken.id, m.name, t.assignment_id(m.name), reason, "preempt"))
        elif not _reclaim(t, m.shape, m.name):
            t.launches_for_demand[m.shape] = t.launches_for_demand.get(m.shape, 0) + 1
            unmet += 1
    if reason == "demand":
        if unmet == n:
            # Waiting at zero with nothing placed: an instance must come (_make_room).
            t.stranded.setdefault(m.shape, []).append(m.name)
        elif (ms := t.models[m.name]).at_capacity is not None:
            t.models[m.name] = evolve(ms, at_capacity=None)
    return unmet


def _make_room(t: _Tick) -> None:
    """2b. Under pressure, idle yields to waiting (``warm_pool.policy.evict``): in each
    pool whose waiting models no instance will come to, an idle replica of another
    model is released for each, the least recently used first; a waiting model none
    is found for is marked ``at_capacity`` once past its grace (its requests refused)."""
    if not t.stranded:
        return
    freed, taken = set(), set()
    for d in t.decisions:
        wid = getattr(d, "worker_id", None)
        if wid is not None:
            taken.add(wid)
            if isinstance(d, Sleep) or (isinstance(d, Release) and d.reason != "reclaimed"):
                freed.add(wid)  # on its way to standby (or asleep: reclaimed next), for anyone
    index = _index(t.cfg)
    for shape, waiting in t.stranded.items():
        pool = t.cfg.pool(shape)
        if pool is None:
            continue
        workers = t.snap.by_shape.get(shape, ())
        supply = coming(pool, workers, freed=freed)
        idle = idle_replicas(workers, by_model=t.snap.by_model, models=t.models, by_name=t.by_name,
                             adapters=index.adapters, hosting=t.hosting, taken=taken,
                             batch_demand=t.snap.batch_demand, now=t.now) if len(waiting) > supply else []
        since = [(name, t.models[name].at_zero_since or t.now) for name in waiting]
        releases, refused = make_room(pool, since, supply, idle, t.now)
        t.decisions.extend(releases)
        gone = freed | {r.worker_id for r in releases}
        for r in releases:
            # Its keep-alive bet is lost only when its last replica goes: a model that
            # keeps one still serves (it had two, e.g. after a worker came back), and
            # marking it evicted released that one too on the next tick its report had
            # no arrival in (found under a fault schedule: 18 s of held requests).
            if r.model is not None and not any(w.state in SERVING and w.id not in gone
                                               for w in t.snap.by_model.get(r.model, ())):
                t.models[r.model] = evolve(t.models[r.model], evicted=True)
        for name, why in refused.items():
            if (ms := t.models[name]).at_capacity != why:
                t.models[name] = evolve(ms, at_capacity=why)


def _batch(t: _Tick) -> None:
    """Batch work takes the standbys online models left free this tick; what finds none
    may buy instances within ``batch.max_usd_per_hour`` (``batch_extra``)."""
    batch_waiting: dict[str, int] = {}
    if t.snap.batch_demand:
        placed = {d.model for d in t.decisions if isinstance(d, Assign | Pack)}
        for name in wanting_batch(t.cfg, t.snap.workers, t.snap.batch_demand, placed, t.only):
            m = t.by_name[name]
            ms = t.models.get(name, ModelState())
            standbys = t.free.get(m.shape) or []
            if t.now < ms.backoff_until:
                continue
            if not standbys:
                batch_waiting[m.shape] = batch_waiting.get(m.shape, 0) + 1
                continue
            cls = t.snap.model_classes.get(name)
            w, tier, secs = place(standbys, m.uri, t.snap.model_sizes.get(m.uri, 0), cls,
                                  special=_standout(t.snap, m.uri, cls))
            t.decisions.append(Assign(w.id, name, t.assignment_id(name), "batch", tier, round(secs, 3), batch=True))
    t.batch_extra = batch_launches(t.cfg, batch_waiting)


def _pools(t: _Tick, state: PolicyState) -> dict[str, PoolState]:
    """3. Per pool: the standby target follows recent cold starts (with hysteresis),
    within the pool's budget and the global one, carried out through the stopped tier.
    A standby lent to batch is one of them. The pools' state for the next tick."""
    snap, cfg = t.snap, t.cfg
    shapes = {s.name: s for s in cfg.shapes}
    assigned_now = {d.worker_id for d in t.decisions if isinstance(d, Assign) and not d.batch}
    lent = {w.id for w in snap.on_batch if lent_to_batch(w, t.activity) and w.id not in assigned_now}
    lent |= {d.worker_id for d in t.decisions if isinstance(d, Assign) and d.batch}
    pool_states = dict(state.pools)
    asks: list[PoolAsk] = []
    for pool in cfg.pools:
        pool_states[pool.shape], ask = _size_pool(t, pool, shapes[pool.shape],
                                                  pool_states.get(pool.shape, PoolState()), lent)
        asks.append(ask)
    for pool, g in zip(cfg.pools, grant(asks, cfg.budget_usd_per_hour), strict=True):
        pool_states[pool.shape] = evolve(pool_states[pool.shape], grant=g)
        _meet_grant(t, pool, g, lent, assigned_now, pool_states[pool.shape])
    return pool_states


def _size_pool(t: _Tick, pool: Pool, shape: InstanceShape, ps: PoolState,
               lent: set[str]) -> tuple[PoolState, PoolAsk]:
    """A pool's standby target from its recent cold starts, and what it asks of the
    budgets: its serving and asleep instances and the standbys it wants."""
    snap, now = t.snap, t.now
    colds = tuple(at for at in ps.cold_starts if now - at < COLD_START_WINDOW_S) + (now,) * t.cold_now.get(pool.shape, 0)
    target, sizer = size_standby(ps.sizer, cold_starts_per_min=cold_start_rate(colds, now, COLD_START_WINDOW_S),
                                 boot_s=shape.boot_s, pool=pool, now=now)
    class_colds = ps.class_cold_starts
    if pool.prebuild:
        classes_here = {snap.model_classes.get(m.name, "") for m in t.cfg.models if m.shape == pool.shape}
        class_colds = {cls: tuple(at for at in ps.class_cold_starts.get(cls, ()) if now - at < COLD_START_WINDOW_S)
                       + (now,) * t.cold_class_now.get(cls, 0) for cls in classes_here}
    # Instances only: a packed engine is part of its worker's.
    mine = [w for w in snap.by_shape.get(pool.shape, ()) if w.host is None]
    serving = [w for w in mine if (w.state in ("loading", "ready") and w.id not in lent) or w.id in t.hosting]
    asleep_here = [w for w in mine if w.state == "asleep" and w.id not in t.gone]
    ask = PoolAsk(shape=pool.shape, price_per_hour_usd=shape.price_per_hour_usd,
                  serving=len(serving) + t.launches_for_demand.get(pool.shape, 0), asleep=len(asleep_here),
                  standby_wanted=target.target, budget_usd_per_hour=pool.budget_usd_per_hour,
                  max_instances=pool.max_instances, standby_min=pool.standby_min)
    return evolve(ps, sizer=sizer, cold_starts=colds, target=target, class_cold_starts=class_colds), ask


def _meet_grant(t: _Tick, pool: Pool, g: PoolGrant, lent: set[str], assigned_now: set[str], ps: PoolState) -> None:
    """A pool's decisions for its grant: asleep replicas over the budget released,
    launches for demand, the standby tiers brought to the grant, engines pre-built."""
    snap, now, decisions, gone, hosting = t.snap, t.now, t.decisions, t.gone, t.hosting
    here = snap.by_shape.get(pool.shape, ())
    mine = [w for w in here if w.host is None and w.state not in ("unreachable", "stopped")]
    stopped = sorted((w for w in here if w.state == "stopped"), key=lambda w: w.id)
    standby = [w for w in mine if (w.state in STANDBY_LIKE or w.id in lent) and w.id not in assigned_now
               and w.id not in hosting]
    total = len(mine)
    # Over the budget with asleep replicas: the longest asleep go first.
    over = [w for w in mine if w.state == "asleep" and w.id not in gone]
    for w in sorted(over, key=lambda w: (w.since or 0.0, w.id))[: max(len(over) - g.asleep_allowed, 0)]:
        decisions.append(Release(w.id, w.model, "budget"))
        gone.add(w.id)

    # No capacity lately: the shape is backed off, nothing launches.
    blocked = now < snap.launch_blocked_until.get(pool.shape, 0.0)
    # Demand that found no standby: launch (serving is never held back by a budget,
    # only by max_instances), counting standbys already on their way.
    need = t.launches_for_demand.get(pool.shape, 0) - len(
        [w for w in standby if w.state in ("launching", "starting", "draining")]
    )
    for _ in range(0 if blocked else max(need, 0)):
        if total >= pool.max_instances:
            break
        decisions.append(Launch(pool.shape, "demand"))
        total += 1
    # The standby: a draining worker ends in standby, so it counts toward the target,
    # but no idle standby is terminated because of one (a standby ready now beats one
    # that still has to start its engine host).
    running = len(standby)
    if running > g.standby:
        running = max(len([w for w in standby if w.state != "draining"]), g.standby)
    # Batch's own spend buys instances beyond the band while its lines wait.
    extra = t.batch_extra.get(pool.shape, 0)
    plan = plan_tiers(g.standby + extra, running, len(stopped), pool)
    for w in stopped[: plan.start_stopped]:
        decisions.append(Start(w.id, "standby"))
    for i in range(0 if blocked else plan.launch + plan.launch_to_stop):
        if total >= pool.max_instances:
            break
        for_batch = i < plan.launch and running + plan.start_stopped + i >= g.standby
        decisions.append(Launch(pool.shape, "batch" if for_batch else "standby"))
        total += 1
    # Excess goes newest first, and only ones standing by: one still booting may be a
    # launch for demand that a model takes the moment it stands by (removed then, if
    # still in excess). Ones holding weights go last, those in memory the very last:
    # they are the fast cold starts of the models they hold.
    idle_standby: list[WorkerView] = []
    if plan.stop_running or plan.terminate_running:  # (the order is only needed then)
        idle_standby = sorted((w for w in standby if w.state == "standby" and w.id not in lent),
                              key=lambda w: w.id, reverse=True)
        wanted = {snap.model_classes[n] for n in pool.prebuild if n in snap.model_classes}
        idle_standby.sort(key=lambda w: _held(w, wanted))
        if any(w.state in ("launching", "starting") for w in standby):
            # Not for one still booting: it becomes the excess once it stands by.
            idle_standby = [w for w in idle_standby if not w.cached and w.prebuilt_class is None]
    for w in idle_standby[: plan.stop_running]:
        decisions.append(Stop(w.id, "excess_standby"))
    for w in idle_standby[plan.stop_running: plan.stop_running + plan.terminate_running]:
        decisions.append(Terminate(w.id, "excess_standby"))
    for w in stopped[plan.start_stopped: plan.start_stopped + plan.terminate_stopped]:
        decisions.append(Terminate(w.id, "excess_stopped"))
    if pool.prebuild:
        removed = {d.worker_id for d in decisions if isinstance(d, Stop | Terminate)}
        named = [(n, snap.model_classes[n]) for n in pool.prebuild if n in snap.model_classes]
        waiting = [w for w in standby if w.state == "standby" and w.id not in removed and w.id not in lent]
        colds_by_class = ps.class_cold_starts
        decisions.extend(plan_prebuilds(named, waiting, target=g.standby,
                                        class_cold_starts={c: len(ts) for c, ts in colds_by_class.items()}))
