"""A discrete-event simulation of Thaw's warm pool, driven by a request trace.

What is simulated, and what runs for real:
- the controller's decisions are ``warm_pool.policy.decide.decide`` itself (autoscaler,
  keep-alive, standby sizer, budgets, the stopped tier): the same function, on the same
  kind of snapshot, with time passed in. The simulator only carries them out;
- activators: requests arrive at their trace times; a model with a ready replica with a
  free slot (``max_concurrency_per_replica``) serves at once, else the request waits in
  the model's queue (bounded by ``max_queue_length``: 429 beyond it) until a slot frees
  or a replica is ready, for at most ``activation_timeout_s`` (503 after it). A request
  that finds no ready replica opens a cold start and wakes the controller at once (the
  activators' demand signal), as in production;
- workers and providers: launches take the shape's ``boot_s``; a load takes the
  model's standby (or asleep) load time; a release takes ``release_s``; a ready replica
  serves a request in ``input_tokens / prefill_tokens_per_s`` to its first token and
  ``tpot_s`` per output token after it (``simulator.costs``);
- kept engines (where a pool has ``prebuild``; see :func:`engine_classes`): a
  ``Prebuild`` has a standby build an engine of the named model's class (a full start of
  that model: its load time); an assignment to a standby holding a built engine of the
  model's class is a swap (tier "swap": the weights' load time, no engine start, plus
  ``swap_s``), to one still building waits for the build first, to one holding another
  class's engine stops it first (``release_s`` of the model it was built for) and then
  starts in full; a ready replica released goes back to standby keeping its engine (an
  asleep or loading one does not, as on the real worker);
- several engines on one worker (where a pool has ``pack``): a ``Pack`` starts an engine
  of the model on a live worker as a replica of its own (tier "packed"): a full start of
  the model without a boot (its load time, the weights read from the worker's disk cache,
  which its engines share, else the store). The worker reports its capacity
  (``thaw.fit.engine_capacity``) and each engine the memory it holds
  (``thaw.fit.engine_memory`` of the cost model's weights: ``engine_sizes``), from which
  the policy finds the room. A packed engine is no instance: its time is its worker's,
  whose cost its engines share; released, it is gone. The policy never stops a worker
  hosting one;
- LoRA adapters (models with ``base``): a ``LoadAdapter`` loads the adapter into a ready
  engine of its base (``adapter_load_s``: loading, then ready); an ``UnloadAdapter``
  stops routing to it, waits for its requests in flight, then unloads it
  (``adapter_unload_s``); when the base's replica is released, put to sleep or stopped,
  its adapters go with it (a failed adapter load never happens here). A request for an
  adapter is served by a ready engine of its base holding it ready, at the base's speed,
  in the slots of that engine (the base's ``max_concurrency_per_replica``), which the
  base's requests and every adapter's share (a freed slot goes to the longest-waiting
  request of them); else it waits in the adapter's queue. An adapter's cold start is of
  tier "adapter" when its base had the engine ready before the request, else of the
  tier the base's engine came from (as the activator's ``cold_start_tier``). An adapter
  is no instance and no engine: the engine's time and cost are its base's; the
  adapter's row counts its requests and the seconds it was held in engines.

The controller ticks every ``tick_s``. In ``exact`` mode it judges every model and pool
on every tick, like the controller. By default it judges a model only on the ticks
where its decision can change (its inputs moved out of the band that keeps its replica
count, a worker of it changed, a keep-alive or pool deadline passed) and otherwise only
does the tick's bookkeeping (``warm_pool.policy.decide.track``). A base and its adapters are
judged as one (the base's activity includes its adapters', an adapter's replicas are
its base's engines): all of them when any one's decision can change. The two modes
make the same decisions (tests/simulator/test_sim.py), the default one many times
faster.

One piece: the event loop and the world state every event changes; split, each handler
would reach into another module's state. The rules are not here (``warm_pool.policy.decide``).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simulator.costs import CostModel, ModelCosts
from simulator.traces import Trace
from thaw.config import Model, ThawConfig
from thaw.engine_class import engine_class_of
from thaw.fit import engine_capacity, engine_memory
from thaw.units import GiB
from thaw.wire import MAX_TTFT_SAMPLES, CachedWeights, WorkerState
from thaw.wire import TIERS as WIRE_TIERS
from warm_pool.policy.autoscaler import steady_band
from warm_pool.policy.decide import (
    COLD_START_WINDOW_S,
    ModelActivity,
    ModelState,
    PolicyState,
    Snapshot,
    WorkerView,
    decide,
    idle_pools,
    kept_classes,
    track,
)
from warm_pool.policy.decisions import (
    Assign,
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
    carry_out,
)
from warm_pool.policy.keepalive import IdleHistogram, IdlePools, keep_alive_decision
from warm_pool.policy.prewarm import next_edge, scheduled_replicas
from warm_pool.policy.states import SERVING, STANDBY_LIKE

INF = math.inf


# Where a cold start's replica got its model (thaw.wire's tiers but "hot"), in the
# wire's order, about the fastest start first.
TIERS = tuple(t for t in WIRE_TIERS if t != "hot")

# Event kinds, in the order events at the same instant are handled.
_WORKER, _ADAPTER, _DONE, _TIMEOUT = 0, 1, 2, 3
# Request states.
_WAITING, _ADMITTED, _TIMED_OUT, _REFUSED = 0, 1, 2, 3


def engine_classes(cfg: ThawConfig, costs: CostModel) -> dict[str, str]:
    """Each model's engine class as the simulator assumes it; none at all when no pool
    pre-builds (the controller reads classes only then, so nothing is swapped or kept).

    A real class (``thaw.engine_class``) hashes the model's ``config.json`` from the
    store with the engine settings a built engine depends on; offline there is no
    ``config.json``. The cost model already takes every model for one architecture
    (``--catalog-model``, or a costs file's figures), so the stand-in ``config.json``
    names that one architecture and the model's size (``weights_gib``) and goes through
    the real hash with the model's own engine settings and ``max_context_tokens``:
    models are of one class when they share size, those engine settings (dtype, tensor
    parallel size, memory utilisation, eager, extra flags; not ``load_format`` nor
    ``snapshots``) and context length. That is the case ``prebuild`` is for (fine-tunes
    of one base, trace models copied from ``--model-template``) and optimistic for a
    config mixing architectures of one size: give those different ``weights_gib`` in a
    costs file to keep them apart. An adapter has no engine, so no class: it is served
    by its base's.
    """
    if not any(p.prebuild for p in cfg.pools):
        return {}
    return {m.name: engine_class_of({"architectures": ["SimulatedForCausalLM"],
                                     "weights_gib": round(costs.models[m.name].weights_gib, 6)},
                                    m.engine, max_model_len=m.max_context_tokens).id
            for m in cfg.models if m.base is None}


def engine_sizes(cfg: ThawConfig, costs: CostModel) -> dict[str, int]:
    """The memory one engine of each model of a pool that packs holds on its shape, as
    the controller's snapshot gives it (``Snapshot.engine_bytes``):
    ``thaw.fit.engine_memory`` of the cost model's weights. Empty when no pool packs;
    none for an adapter (no engine: it is loaded into its base's)."""
    packing = {p.shape for p in cfg.pools if p.pack}
    shapes = {s.name: s for s in cfg.shapes}
    return {m.name: engine_memory(int(costs.models[m.name].weights_gib * GiB), m.engine, shapes[m.shape])
            for m in cfg.models if m.shape in packing and m.base is None}


class _Worker:
    __slots__ = ("id", "shape", "price", "state", "model", "aid", "since", "entered", "inflight",
                 "epoch", "tier", "view", "releasing", "host", "disk", "cached", "engine", "engine_of",
                 "built", "built_at", "park", "inside", "packed", "mem", "cap", "adapters", "started_at",
                 "ready_at")

    def __init__(self, wid: str, shape: str, price: float, state: str, now: float, *, cap: int = 0,
                 inside: _Worker | None = None) -> None:
        self.id, self.shape, self.price, self.state = wid, shape, price, state
        # Packing: the worker a packed engine runs in (None: an instance), the packed
        # engines an instance runs, the memory its engine holds while assigned, and what
        # its engines may hold together (0: it does not pack).
        self.inside = inside
        self.packed: list[_Worker] = []
        self.mem = 0
        self.cap = cap
        self.model: _Model | None = None
        self.aid: str | None = None
        self.since: float | None = None
        self.entered = now
        self.inflight = 0
        self.epoch = 0  # bumps on every change: a scheduled transition of an older epoch is void
        self.tier = "s3"
        # When the instance was last launched or started, and when its engine last became
        # ready (an adapter's cold start is of tier "adapter" when that was before it).
        self.started_at = now
        self.ready_at = INF
        # The adapters in its engine, in the order they were loaded.
        self.adapters: dict[_Model, _Loaded] = {}
        self.releasing = False
        # Models whose weights it holds (name -> GiB), least recently loaded first, and
        # what its status says of them (rebuilt only when they change).
        self.host: dict[str, _Model] = {}
        self.disk: dict[str, _Model] = {}
        self.cached: tuple[CachedWeights, ...] = ()
        # The engine it keeps across assignments: its class (None: none), the model it
        # was built for (a teardown costs that model's release_s), whether it is built,
        # and when its build ends (a swap into one still building waits until then).
        self.engine: str | None = None
        self.engine_of: _Model | None = None
        self.built = False
        self.built_at = 0.0
        # A release of a ready replica: its engine is parked for the next model of its class.
        self.park = False
        self.view = self._view()

    def _view(self) -> WorkerView:
        return WorkerView(self.id, self.shape, WorkerState(self.state),
                          self.model.name if self.model else None, self.aid, None, self.since, self.cached,
                          prebuilt_class=self.engine, prebuilt_ready=self.built,
                          host=self.inside.id if self.inside is not None else None,
                          memory_bytes=self.mem if self.aid is not None else 0, capacity_bytes=self.cap,
                          adapters=tuple((a.name, rec.state) for a, rec in self.adapters.items()))

    def keep_engine(self, cls: str | None, of: _Model | None = None, *, built: bool = True,
                    built_at: float = 0.0) -> None:
        """Keep an engine of class ``cls`` (None: drop the one kept), built for ``of``."""
        self.engine, self.engine_of = cls, of
        self.built, self.built_at = cls is not None and built, built_at

    def hold(self, m: _Model, host_gib: float | None, disk_gib: float) -> None:
        """The worker loaded ``m``: its tiers keep a copy, least recently loaded evicted.
        ``host_gib`` None: the load did not go through its host-memory tier (a packed
        engine's: that tier is the worker's own engine's; the disk cache is shared)."""
        gib = m.costs.weights_gib
        tiers = ((self.disk, disk_gib),) if host_gib is None else ((self.host, host_gib), (self.disk, disk_gib))
        for held, budget in tiers:
            held.pop(m.name, None)
            if gib > budget:
                continue
            while held and sum(h.costs.weights_gib for h in held.values()) + gib > budget:
                held.pop(next(iter(held)))
            held[m.name] = m
        self.cached = tuple(
            CachedWeights(uri=h.cfg.uri, tier=tier, bytes=int(h.costs.weights_gib * GiB),  # type: ignore[arg-type]
                          total_bytes=int(h.costs.weights_gib * GiB))
            for tier, held in (("host", self.host), ("disk", self.disk)) for h in held.values())
        self.view = self._view()

    def tier_for(self, m: _Model) -> str:
        """Where this worker would read ``m`` from."""
        return "host" if m.name in self.host else "disk" if m.name in self.disk else "s3"


class _Loaded:
    """An adapter in a worker's engine: loading, ready or unloading (then gone), and its
    requests in flight there (an unload waits for them)."""

    __slots__ = ("m", "w", "state", "inflight", "epoch", "since")

    def __init__(self, m: _Model, w: _Worker, now: float) -> None:
        self.m, self.w, self.state, self.since = m, w, "loading", now
        self.inflight = 0
        self.epoch = 0  # bumps on every change: a scheduled transition of an older epoch is void


class _Model:
    __slots__ = ("idx", "name", "cfg", "a", "costs", "cls", "ready", "serving", "queue", "queued", "in_flight",
                 "arrivals", "hot_ttfts", "last_request_at", "cold_open", "cold_since", "cold_tier",
                 "slo_s", "prefill_tps", "tpot_s", "max_conc", "max_queue", "timeout_s",
                 "band_for", "deadline_key", "deadline_times", "schedule_next", "stats", "base", "adapters",
                 "group")

    def __init__(self, idx: int, m: Model, costs: ModelCosts, slo_s: float, cls: str | None = None) -> None:
        self.idx, self.name, self.cfg, self.a, self.costs = idx, m.name, m, m.autoscaling, costs
        self.cls = cls  # its engine class if its engine is kept (policy.kept_classes), else None
        # An adapter: its base (its ready and serving are the base's engines holding it
        # ready, and loading or ready: its replicas); a base: its adapters; either: the
        # models judged together with it (the base first, then its adapters).
        self.base: _Model | None = None
        self.adapters: list[_Model] = []
        self.group: tuple[_Model, ...] = (self,)
        self.ready: list[_Worker] = []
        self.serving = 0  # loading + ready workers
        self.queue: deque[int] = deque()
        self.queued = 0  # live entries of queue (timed-out ones are removed lazily)
        self.in_flight = 0
        self.arrivals = 0
        self.hot_ttfts: list[float] = []
        self.last_request_at: float | None = None
        self.cold_open = False
        self.cold_since = 0.0
        self.cold_tier: str | None = None
        self.slo_s = slo_s
        self.prefill_tps = costs.prefill_tokens_per_s
        self.tpot_s = costs.tpot_s
        self.max_conc = m.autoscaling.max_concurrency_per_replica
        self.max_queue = m.autoscaling.max_queue_length
        self.timeout_s = m.autoscaling.activation_timeout_s
        self.deadline_key: tuple[Any, ...] | None = None
        self.deadline_times: tuple[float, ...] = ()  # the keep-alive deadlines still due
        self.schedule_next: float | None = None  # its pre-warm windows' next edge
        # The replica count the whole window was last found in band for (None: not).
        self.band_for: int | None = None
        self.stats = _Stats()


@dataclass
class _Stats:
    requests: int = 0
    cold_starts: int = 0
    cold_waiters: int = 0
    ttfts: list[float] = field(default_factory=list)
    slo_met: int = 0
    activation_timeouts: int = 0
    queue_full: int = 0
    replica_s: float = 0.0
    asleep_s: float = 0.0
    usd: float = 0.0
    adapter_s: float = 0.0  # an adapter: seconds held in engines (loading, ready, unloading)
    cold_start_s: list[float] = field(default_factory=list)
    tiers: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ColdStart:
    model: str
    at: float
    ready_after_s: float
    tier: str  # asleep | adapter | swap | host | disk | s3 | packed | launch


@dataclass
class SimResult:
    summary: dict[str, Any]
    decisions: list[tuple[float, Decision]]
    cold_starts: list[ColdStart]
    ticks: int
    judged: int  # models judged by decide(), summed over ticks
    end_s: float
    # Each model's keep-alive histogram at the end (what a controller would keep).
    histograms: dict[str, IdleHistogram] = field(default_factory=dict)


def tier_order(tier: str) -> tuple[int, str]:
    """Sort key: the tiers in the order of :data:`TIERS` (unknown ones last)."""
    return (TIERS.index(tier) if tier in TIERS else len(TIERS), tier)


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p90, p99 by nearest rank (None when there are none)."""
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    s = sorted(values)
    n = len(s)
    return {f"p{q}": s[min(n - 1, max(0, math.ceil(q / 100 * n) - 1))] for q in (50, 90, 99)}


class Simulator:
    """One run: ``Simulator(cfg, costs, trace).run()``. Deterministic: the trace and
    the config decide everything (the seed only matters to traces drawn at random)."""

    def __init__(self, cfg: ThawConfig, costs: CostModel, trace: Trace, *, tick_s: float = 1.0,
                 exact: bool = False, ttft_slo_s: float = 5.0, record_decisions: bool = False,
                 histograms: Mapping[str, IdleHistogram] | None = None) -> None:
        missing = [name for name in trace.models if cfg.model(name) is None]
        if missing:
            raise ValueError(f"trace models not in the config: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        self.cfg, self.trace, self.tick_s, self.exact = cfg, trace, tick_s, exact
        self.record = record_decisions
        self._effects = _Effects(self)
        self.classes = engine_classes(cfg, costs)
        self.engine_bytes = engine_sizes(cfg, costs)
        # Only models of a class their pool pre-builds keep their engine (as on the controller).
        kept = kept_classes(cfg, self.classes)
        self.models = [_Model(i, m, costs.models[m.name], m.autoscaling.ttft_slo_s or ttft_slo_s,
                              kept.get(m.name)) for i, m in enumerate(cfg.models)]
        self.by_name = {m.name: m for m in self.models}
        for i, m in enumerate(cfg.models):
            if m.served_name:
                self.by_name.setdefault(m.served_name, self.models[i])
        for a in self.models:
            if a.cfg.base is not None:
                # Served by its base's engine: at its speed, in its slots.
                base = a.base = self.by_name[a.cfg.base]
                base.adapters.append(a)
                a.prefill_tps, a.tpot_s, a.max_conc = base.prefill_tps, base.tpot_s, base.max_conc
        for b in self.models:
            if b.adapters:
                b.group = (b, *b.adapters)
                for a in b.adapters:
                    a.group = b.group
        # Trace model index -> simulated model.
        self.trace_models = [self.by_name[name] for name in trace.models]
        self.shapes = {s.name: s for s in cfg.shapes}
        self.pools = {p.shape: p for p in cfg.pools}
        self.capacity = {p.shape: engine_capacity(self.shapes[p.shape]) for p in cfg.pools if p.pack}
        self.workers: dict[str, _Worker] = {}
        self.launched = 0
        # The policy's state: what decide() returned, and the models' states the
        # simulator has since moved on by bookkeeping alone (its own dict: a state
        # handed to decide() is never changed afterwards).
        self.state = PolicyState(epoch="sim")
        # Keep-alive histograms learnt before the trace (as a controller loads its own
        # after a restart): the models start from them instead of from nothing.
        # Every model is known from the start (as a controller's first tick sees its
        # config): the wait for its first request is its first idle interval.
        loaded = histograms or {}
        self.ms: dict[str, ModelState] = {m.name: ModelState(idle_histogram=loaded.get(m.name, IdleHistogram()),
                                                             seen_since=0.0) for m in cfg.models}
        # The keep-alive policy's pooled prior as this tick started (what decide() reads
        # too); kept up only when some model learns its keep-alive.
        self.learns = any(m.autoscaling.keep_alive == "histogram" for m in cfg.models)
        self.idle_pools = IdlePools()
        self.heap: list[tuple[float, int, int, Any, int]] = []
        self.seq = 0
        self.now = 0.0
        self.views_dirty = True
        self.views: tuple[WorkerView, ...] = ()
        self.pools_dirty = True
        self.dirty: set[_Model] = set()
        self.touched: set[_Model] = set()  # traffic changed since the last tick
        self.open_requests = 0
        self.pool_deadlines: set[float] = set()
        self.watch: set[_Model] = set()  # judged every tick until settled
        # At zero with requests waiting and no standby: judged again when a worker of
        # its shape changes or the pools are judged (which count what it waits for).
        self.waiting: set[_Model] = set()
        self.shapes_changed: set[str] = set()
        self.changed_now: set[str] = set()
        self.deadlines: list[tuple[float, int]] = []  # (when, model idx or -1: pools)
        self.kick_pending = False
        self.next_grid = 0
        self.decisions: list[tuple[float, Decision]] = []
        self.cold_records: list[ColdStart] = []
        self.ticks = 0
        self.judged = 0
        self.standby_s: dict[str, float] = {}
        self.standby_usd: dict[str, float] = {}
        self.instance_s = 0.0
        n = len(trace)
        self.req_state = bytearray(n)
        self.req_cold = bytearray(n)
        # The first tick judges every model (min_replicas, pre-warming).
        self.dirty.update(self.models)
        # Scheduled pre-warm: each window's opening and closing wakes its model. The
        # clock is the cron's: t = 0 is 1970-01-01 00:00 UTC, a Thursday.
        for sm in self.models:
            if sm.cfg.prewarm:
                self._schedule_edge(sm, -1.0)  # from the start: an edge at 0 too
        # Every pool starts at its standby floor, already standing by (a running fleet).
        for pool in cfg.pools:
            for _ in range(pool.standby_min):
                self._new_worker(pool.shape, "standby").started_at = -INF

    # -- bookkeeping --------------------------------------------------------------

    def _push(self, t: float, kind: int, obj: Any, arg: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, obj, arg))

    def _new_worker(self, shape: str, state: str) -> _Worker:
        self.launched += 1
        w = _Worker(f"{shape}-{self.launched:06d}", shape, self.shapes[shape].price_per_hour_usd, state, self.now,
                    cap=self.capacity.get(shape, 0))
        self.workers[w.id] = w
        self.views_dirty = self.pools_dirty = True
        self.shapes_changed.add(shape)
        return w

    def _account(self, w: _Worker, t: float) -> None:
        """Count an instance's time since its last change (call it before any change of
        it or of its packed engines). Each engine on it serving or asleep counts the time
        for its model and pays an equal share of the instance; an instance with none
        that boots, stands by or drains counts it as standby."""
        if w.inside is not None:
            w = w.inside  # a packed engine is no instance: its time is its worker's
        dt = t - w.entered
        w.entered = t
        if dt <= 0:
            return
        usd = dt * w.price / 3600.0
        live = [e for e in (w, *w.packed) if e.model is not None and (e.state in SERVING or e.state == "asleep")]
        for e in live:
            st = e.model.stats  # type: ignore[union-attr]
            if e.state == "asleep":
                st.asleep_s += dt
            else:
                st.replica_s += dt
            st.usd += usd / len(live)
        if not live and w.state in STANDBY_LIKE:
            self.standby_s[w.shape] = self.standby_s.get(w.shape, 0.0) + dt
            self.standby_usd[w.shape] = self.standby_usd.get(w.shape, 0.0) + usd
        if live or w.state in STANDBY_LIKE:
            self.instance_s += dt

    def _set(self, w: _Worker, state: str, t: float, *, model: _Model | None | bool = False,
             aid: str | None | bool = False, since: float | None | bool = False) -> None:
        self._account(w, t)
        old_model = w.model
        was_serving = w.state in SERVING
        w.state = state
        if model is not False:
            w.model = model  # type: ignore[assignment]
        if aid is not False:
            w.aid = aid  # type: ignore[assignment]
        if since is not False:
            w.since = since  # type: ignore[assignment]
        if w.adapters and (state != "ready" or w.model is not old_model):
            self._drop_adapters(w, t)
        w.epoch += 1
        w.view = w._view()
        self.views_dirty = self.pools_dirty = True
        self.shapes_changed.add(w.shape)
        serving = state in SERVING
        if old_model is not None and was_serving and (not serving or w.model is not old_model):
            old_model.serving -= 1
        if w.model is not None and serving and (not was_serving or w.model is not old_model):
            w.model.serving += 1
        for m in (old_model, w.model):
            if m is not None:
                m.band_for = None
                self.dirty.add(m)

    def _drop_adapters(self, w: _Worker, t: float) -> None:
        """``w``'s engine stops serving (released, put to sleep): its adapters go with it.
        Their requests in flight still finish there (the release waits for them)."""
        for a, rec in w.adapters.items():
            self._adapter_gone(a, rec, t)
        w.adapters.clear()

    def _adapter_gone(self, a: _Model, rec: _Loaded, t: float) -> None:
        """``rec`` leaves its engine (no longer a replica of ``a``, if it still was)."""
        if rec.state == "ready":
            a.ready.remove(rec.w)
        if rec.state in SERVING:
            a.serving -= 1
        a.stats.adapter_s += t - rec.since
        rec.state = "gone"
        rec.epoch += 1
        for m in a.group:
            m.band_for = None
            self.dirty.add(m)

    def _adapters_changed(self, w: _Worker) -> None:
        """``w``'s adapters changed, its state did not: a new view, and its base and that
        base's adapters judged again (an adapter's replicas, the free adapter slots)."""
        w.view = w._view()
        self.views_dirty = True
        assert w.model is not None
        for m in w.model.group:
            m.band_for = None
            self.dirty.add(m)

    def _engine_changed(self, w: _Worker) -> None:
        """``w``'s kept engine changed, its state did not: a new view (for placement and
        the pools' prebuild plan) and a new epoch (its next step is the build's end)."""
        w.epoch += 1
        w.view = w._view()
        self.views_dirty = self.pools_dirty = True
        self.shapes_changed.add(w.shape)

    def _after(self, w: _Worker, delay: float) -> None:
        """The worker's current step (boot, load, release) ends in ``delay`` seconds."""
        self._push(self.now + delay, _WORKER, w, w.epoch)

    # -- the data plane -----------------------------------------------------------

    def _pick(self, m: _Model) -> _Worker | None:
        best = None
        for w in m.ready:
            if w.inflight < m.max_conc and (best is None or w.inflight < best.inflight):
                best = w
        return best

    def _admit(self, m: _Model, w: _Worker, i: int, t: float) -> None:
        tr = self.trace
        self.req_state[i] = _ADMITTED
        w.inflight += 1
        m.in_flight += 1
        done: _Worker | _Loaded = w
        if m.base is not None:
            done = w.adapters[m]
            done.inflight += 1
        prefill = tr.input_tokens[i] / m.prefill_tps
        ttft = t - tr.t[i] + prefill
        st = m.stats
        st.ttfts.append(ttft)
        if ttft <= m.slo_s:
            st.slo_met += 1
        if not self.req_cold[i] and len(m.hot_ttfts) < MAX_TTFT_SAMPLES:
            m.hot_ttfts.append(ttft)
        self._push(t + prefill + tr.output_tokens[i] * m.tpot_s, _DONE, done)

    def _drain_queue(self, m: _Model, t: float) -> None:
        q = m.queue
        while q:
            i = q[0]
            if self.req_state[i] != _WAITING:
                q.popleft()
                continue
            w = self._pick(m)
            if w is None:
                return
            q.popleft()
            m.queued -= 1
            self._admit(m, w, i, t)

    def _head(self, m: _Model) -> int | None:
        """The request first in ``m``'s queue (ones timed out dropped), None: none."""
        q = m.queue
        while q and self.req_state[q[0]] != _WAITING:
            q.popleft()
        return q[0] if q else None

    def _free_slot(self, w: _Worker, t: float) -> None:
        """A slot of ready ``w`` freed: its model's queue takes it; an engine holding
        adapters gives it to the longest-waiting request of its base and adapters."""
        m = w.model
        assert m is not None
        if not w.adapters:
            if m.queued:
                self._drain_queue(m, t)
            return
        sharing = [m, *(a for a, rec in w.adapters.items() if rec.state == "ready")]
        while w.inflight < m.max_conc:
            first: tuple[int, _Model] | None = None
            for x in sharing:
                i = self._head(x) if x.queued else None
                if i is not None and (first is None or i < first[0]):
                    first = (i, x)
            if first is None:
                return
            i, x = first
            x.queue.popleft()
            x.queued -= 1
            self._admit(x, w, i, t)

    def _arrive(self, i: int, t: float) -> None:
        m = self.trace_models[self.trace.model[i]]
        m.stats.requests += 1
        m.arrivals += 1
        m.last_request_at = t
        self.touched.add(m)
        if not m.queued:
            w = self._pick(m)
            if w is not None:
                self.open_requests += 1
                self._admit(m, w, i, t)
                return
        if m.queued >= m.max_queue:
            self.req_state[i] = _REFUSED
            m.stats.queue_full += 1
            return
        m.queue.append(i)
        m.queued += 1
        self.open_requests += 1
        self._push(t + m.timeout_s, _TIMEOUT, m, i)
        if not m.ready:
            self.req_cold[i] = 1
            m.stats.cold_waiters += 1
            if not m.cold_open:
                m.cold_open, m.cold_since, m.cold_tier = True, t, None
                m.stats.cold_starts += 1
                # The activator's demand signal wakes the controller now.
                self.dirty.add(m)
                self.kick_pending = True

    def _done(self, of: _Worker | _Loaded, t: float) -> None:
        """A request answered, by a worker's engine or an adapter in it."""
        w = of.w if isinstance(of, _Loaded) else of
        m = of.m if isinstance(of, _Loaded) else of.model
        assert m is not None and w.model is not None
        if isinstance(of, _Loaded):
            of.inflight -= 1
            if of.state == "unloading" and of.inflight == 0:
                self._push(t + m.costs.adapter_unload_s, _ADAPTER, of, of.epoch)
        w.inflight -= 1
        m.in_flight -= 1
        m.last_request_at = t
        self.touched.add(m)
        if w.state == "ready":
            self._free_slot(w, t)
        elif w.releasing and w.inflight == 0:
            w.releasing = False
            self._after(w, w.model.costs.release_s)
        self.open_requests -= 1

    def _timeout(self, m: _Model, i: int) -> None:
        if self.req_state[i] == _WAITING:
            self.req_state[i] = _TIMED_OUT
            m.queued -= 1
            m.stats.activation_timeouts += 1
            self.open_requests -= 1
            if not m.queued and not m.ready:
                m.cold_open = False  # everyone waiting gave up: the next request starts anew
            self.touched.add(m)

    def _worker_event(self, w: _Worker, epoch: int, t: float) -> None:
        if w.epoch != epoch or w.id not in self.workers:
            return
        s = w.state
        if s == "loading":
            m = w.model
            assert m is not None
            if m.cls is not None:
                # Its engine (built now, or swapped into) can take another model of its class.
                w.keep_engine(m.cls, m)
            w.ready_at = t
            self._set(w, "ready", t)
            shape = self.shapes[w.shape]
            disk_gib = shape.cache.max_gib if shape.cache else 0.0
            if w.inside is not None:
                w.inside.hold(m, None, disk_gib)
            else:
                w.hold(m, shape.host_cache_gib, disk_gib)
            m.ready.append(w)
            if m.cold_open:
                self._cold_start_ends(m, m.cold_tier or w.tier, t)
            self._drain_queue(m, t)
        elif s in ("launching", "starting"):
            self._set(w, "standby", t)
        elif s == "draining":
            w.releasing = False
            if w.inside is not None:
                # A packed engine lives for one assignment: released, it is gone (its room
                # is free: the shape changed, so models waiting for room are judged again).
                del self.workers[w.id]
                self._set(w, "stopped", t, model=None, aid=None, since=None)
                w.inside.packed.remove(w)
                return
            if not w.park:
                w.keep_engine(None)
            w.park = False
            self._set(w, "standby", t, model=None, aid=None, since=None)
        elif s == "standby" and w.engine is not None and not w.built:
            # A prebuild is done: the engine is built (its view says ready).
            w.built = True
            self._engine_changed(w)

    def _adapter_event(self, rec: _Loaded, epoch: int, t: float) -> None:
        """An adapter's load or unload ends."""
        if rec.epoch != epoch:
            return
        w, a = rec.w, rec.m
        if rec.state == "loading":
            rec.state = "ready"
            a.ready.append(w)
            self._adapters_changed(w)
            if a.cold_open:
                self._cold_start_ends(a, self._adapter_tier(w, a.cold_since), t)
            self._drain_queue(a, t)
        elif rec.state == "unloading":
            del w.adapters[a]
            self._adapter_gone(a, rec, t)
            self._adapters_changed(w)

    def _cold_start_ends(self, m: _Model, tier: str, t: float) -> None:
        """A replica of ``m`` is ready for the requests waiting on its cold start."""
        m.cold_open = False
        m.stats.cold_start_s.append(t - m.cold_since)
        m.stats.tiers[tier] = m.stats.tiers.get(tier, 0) + 1
        self.cold_records.append(ColdStart(m.name, m.cold_since, t - m.cold_since, tier))

    @staticmethod
    def _adapter_tier(w: _Worker, since: float) -> str:
        """Where an adapter's cold start since ``since`` got its replica, as the activator
        says (``activator.routing.replicas.cold_start_tier``): "adapter" when the engine of its
        base was ready before, else where that engine came from."""
        if w.ready_at <= since:
            return "adapter"
        if w.tier == "asleep" or w.inside is not None:
            return w.tier  # a wake; a packed engine (its worker was up: no launch)
        # Launched (or started) for it: at the request's tick or after.
        return "launch" if w.started_at >= since else w.tier

    # -- the controller -------------------------------------------------------------

    def _activity(self, m: _Model) -> ModelActivity:
        return ModelActivity(m.queued, m.in_flight, m.last_request_at, m.arrivals, tuple(m.hot_ttfts))

    def _tracked_activity(self, m: _Model) -> ModelActivity:
        """``m``'s traffic as ``decide`` counts it: a base's with its adapters' added (in
        config order, as ``decide`` adds them)."""
        act = self._activity(m)
        for a in m.adapters:
            act = act.plus(self._activity(a))
        return act

    def _demand(self, m: _Model) -> int:
        """Requests queued and in flight for ``m``: a base's with its adapters'."""
        return sum(x.queued + x.in_flight for x in m.group) if m.adapters else m.queued + m.in_flight

    def _reported(self, m: _Model) -> None:
        m.arrivals = 0
        if m.hot_ttfts:
            m.hot_ttfts = []
        self.touched.discard(m)

    def _keep(self, m: _Model, ms: ModelState, t: float) -> tuple[bool, Any]:
        """The keep-alive policy's word for an idle model now, and its window (judged by
        ``track``: a model never tracked has none, and is not idle)."""
        window = ms.keep_alive
        if ms.idle_since is None or window is None:
            return False, window
        return keep_alive_decision(window, ms.idle_since, t).keep, window

    def _settled(self, m: _Model, ms: ModelState, t: float) -> bool:
        """True when judging ``m`` now cannot give a decision, nor a state the next
        judgement would differ on, until its traffic or a deadline changes that."""
        a = m.a
        sc = ms.scale
        if sc.up_since is not None or sc.down_since is not None or t < sc.panic_until:
            return False
        if m.cfg.prewarm and scheduled_replicas(m.cfg.prewarm, t) > a.min_replicas:
            return False  # a pre-warm window holds it up: judged as the controller would
        if ms.failures and t < ms.backoff_until:
            return False
        last = ms.last_scale
        current = m.serving
        demand = self._demand(m)
        if last is None:
            return False
        if last.target != current:
            # A request at zero found no standby: nothing changes for it until a worker
            # of its shape does (the pools count the launch it waits for meanwhile).
            return current == 0 and demand > 0 and m.cfg.shape not in self.changed_now
        keep, _ = self._keep(m, ms, t)
        if not (demand > 0 or keep):
            # Idle and let go: the target is min_replicas, whatever the windows say.
            return current == a.min_replicas
        if current < max(a.min_replicas, 1):
            return False
        if a.ttft_slo_s is not None and any(o.ttfts for o in sc.observations):
            return False
        # The raw count stays at the current one while every demand value the windows
        # can hold is in the autoscaler's steady band: no step up or down, no panic.
        lower, upper = steady_band(current, a)
        if not lower < demand <= upper:
            m.band_for = None
            return False
        if m.band_for != current:
            if not all(lower < o.demand <= upper for o in sc.observations):
                return False
            m.band_for = current
        return True

    def _keep_settled(self, m: _Model, ms: ModelState, t: float, tracked: bool) -> None:
        """Not judged this tick: keep the bookkeeping ``track`` did for it (``tracked``:
        it did some)."""
        self.watch.discard(m)
        self._note_waiting(m, ms)
        if tracked:
            self.ms[m.name] = ms
            self._reported(m)
            self._deadlines_for(m, ms, t)

    def _note_waiting(self, m: _Model, ms: ModelState) -> None:
        if ms.last_scale is not None and ms.last_scale.target > m.serving:
            self.waiting.add(m)
        else:
            self.waiting.discard(m)

    def _deadlines_for(self, m: _Model, ms: ModelState, t: float) -> None:
        """Wake the model when its keep-alive window opens or closes."""
        if ms.idle_since is None or self._demand(m):
            # Busy: the keep-alive window does not apply until it is idle again.
            m.deadline_key, m.deadline_times = None, ()
            return
        _, window = self._keep(m, ms, t)
        key = (ms.idle_since, window)
        if m.deadline_key == key:
            return
        m.deadline_key = key
        # (A window kept until the next request has no end to wake at.)
        due = tuple(ms.idle_since + after for after in (window.prewarm_after_s, window.keep_until_s)
                    if after is not None and math.isfinite(after) and ms.idle_since + after > t)
        m.deadline_times = due
        for when in due:
            heapq.heappush(self.deadlines, (when, m.idx))

    def _schedule_edge(self, m: _Model, after: float) -> None:
        """Wake ``m`` when its next pre-warm window opens or closes after ``after`` (the
        clock is the cron's: t = 0 is 1970-01-01 00:00 UTC)."""
        m.schedule_next = next_edge(m.cfg.prewarm, after)
        if m.schedule_next is not None:
            heapq.heappush(self.deadlines, (m.schedule_next, m.idx))

    def _pool_deadlines(self) -> None:
        """Wake the pools when a cold start leaves the sizer's window or a hold ends."""
        for pool in self.cfg.pools:
            ps = self.state.pools.get(pool.shape)
            if ps is None:
                continue
            due = [t + COLD_START_WINDOW_S for t in ps.cold_starts[:1]]
            # Each prebuilt class's share of the standbys changes as its cold starts leave.
            due += [ts[0] + COLD_START_WINDOW_S for ts in ps.class_cold_starts.values() if ts]
            if ps.sizer.below_since is not None:
                due.append(ps.sizer.below_since + pool.standby_hold_s)
            for t in due:
                if t not in self.pool_deadlines:
                    self.pool_deadlines.add(t)
                    heapq.heappush(self.deadlines, (t, -1))

    def _tick(self, t: float) -> None:
        self.ticks += 1
        while self.deadlines and self.deadlines[0][0] <= t:
            when, idx = heapq.heappop(self.deadlines)
            if idx < 0:
                self.pool_deadlines.discard(when)
                self.pools_dirty = True
            elif when in self.models[idx].deadline_times:
                self.dirty.add(self.models[idx])
            elif when == self.models[idx].schedule_next:
                self.dirty.add(self.models[idx])
                self._schedule_edge(self.models[idx], when)
        dirty, self.dirty = self.dirty, set()
        self.changed_now, self.shapes_changed = self.shapes_changed, set()
        if self.learns:
            self.idle_pools = idle_pools(self.ms, self.cfg, self.idle_pools, t)
        if self.exact:
            judge = self.models
        else:
            judge = []
            seen: set[int] = set()
            for m in sorted(dirty | self.watch | self.touched | self.waiting, key=lambda m: m.idx):
                # A base and its adapters as one: all judged when any one must be.
                group = m.group
                if len(group) > 1:
                    if group[0].idx in seen:
                        continue
                    seen.add(group[0].idx)
                if any(x in dirty for x in group):
                    judge.extend(group)
                    continue
                busy = any(x in self.touched for x in group)
                states = []
                for x in group:
                    # A base's traffic includes its adapters'.
                    tracked = x in self.touched or (busy and bool(x.adapters))
                    ms = self.ms.get(x.name) or ModelState()
                    if tracked:
                        # This tick's bookkeeping first: judged as it would leave the model.
                        ms = track(ms, self._tracked_activity(x), x.cfg, self.cfg, t, self.idle_pools)
                    states.append((x, ms, tracked))
                if not all(self._settled(x, ms, t) for x, ms, _ in states):
                    judge.extend(group)  # decide() does the bookkeeping itself
                    continue
                for x, ms, tracked in states:
                    self._keep_settled(x, ms, t, tracked)
            if seen:
                judge.sort(key=lambda m: m.idx)
        if judge or self.pools_dirty:
            self._judge(judge, t)

    def _judge(self, judge: list[_Model], t: float) -> None:
        if self.views_dirty:
            self.views = tuple(w.view for w in self.workers.values())
            self.views_dirty = False
        activity = {m.name: self._activity(m) for m in judge}
        snap = Snapshot(self.views, activity, model_classes=self.classes, engine_bytes=self.engine_bytes)
        only = None if self.exact else {m.name for m in judge}
        pools = True if self.exact else self.pools_dirty
        self.pools_dirty = False
        state = PolicyState(models=dict(self.ms), pools=self.state.pools, assignments=self.state.assignments,
                            epoch=self.state.epoch, idle_pools=self.idle_pools)
        decisions, self.state = decide(snap, state, self.cfg, t, only=only, pools=pools)
        self.ms = dict(self.state.models)
        self.idle_pools = self.state.idle_pools
        self.judged += len(judge)
        for m in judge:
            self._reported(m)
        for d in decisions:
            self._apply(d, t)
        for m in judge:
            if m.cold_open and m.cold_tier is None and not m.serving:
                # No standby took it: the cold start waits for an instance to boot.
                m.cold_tier = "launch"
            if self.exact:
                continue
            ms = self.ms.get(m.name) or ModelState()
            if self._settled(m, ms, t):
                self.watch.discard(m)
            else:
                self.watch.add(m)
            self._note_waiting(m, ms)
            self._deadlines_for(m, ms, t)
        if not self.exact:
            self._pool_deadlines()
            if decisions:
                # Their effects (assignments, releases) are inputs of the next tick.
                self.pools_dirty = True

    def _apply(self, d: Decision, t: float) -> None:
        if self.record:
            self.decisions.append((t, d))
        carry_out(d, self._effects, t)

    def _start(self, w: _Worker, m: _Model, t: float) -> float:
        """Seconds until ``w`` serves ``m`` from now; sets ``w.tier`` (where it came from)
        and drops an engine the start does not use."""
        if w.state == "asleep":
            w.tier = "asleep"
            return m.costs.load_s("asleep")
        tier = w.tier_for(m)
        kept, of = w.engine, w.engine_of
        # The worker waits for an engine still building before it swaps into it or stops it.
        wait = max(w.built_at - t, 0.0) if kept is not None and not w.built else 0.0
        if kept is not None and kept == m.cls:
            w.tier = "swap"
            return wait + m.costs.swap_load_s(tier)
        w.tier = tier
        if kept is None:
            return m.costs.load_s(tier)
        w.keep_engine(None)
        return wait + (of.costs.release_s if of is not None else 0.0) + m.costs.load_s(tier)

    # -- the run ----------------------------------------------------------------------

    def _next_tick(self) -> float:
        grid = self.next_grid * self.tick_s
        if self.exact:
            return grid
        if self.dirty or self.watch or self.pools_dirty or self.touched:
            at = math.ceil(self.now / self.tick_s - 1e-9) * self.tick_s
            # Never a tick before now (an event a hair past a grid point is the next
            # tick's, as the controller's ticks see it).
            return max(grid, at if at >= self.now else at + self.tick_s)
        if self.deadlines:
            return max(grid, math.ceil(self.deadlines[0][0] / self.tick_s - 1e-9) * self.tick_s)
        return INF

    def run(self) -> SimResult:
        tr = self.trace
        times, n, i = tr.t, len(tr), 0
        heap = self.heap
        while True:
            ta = times[i] if i < n else INF
            te = heap[0][0] if heap else INF
            if i >= n and not self.open_requests:
                break
            tt = self._next_tick()
            if te <= ta and te <= tt:
                t, kind, _, obj, arg = heapq.heappop(heap)
                self.now = t
                if kind == _DONE:
                    self._done(obj, t)
                elif kind == _WORKER:
                    self._worker_event(obj, arg, t)
                elif kind == _ADAPTER:
                    self._adapter_event(obj, arg, t)
                else:
                    self._timeout(obj, arg)
            elif ta <= tt:
                self.now = ta
                self._arrive(i, ta)
                i += 1
                if self.kick_pending:
                    self.kick_pending = False
                    self._tick(ta)
            else:
                if tt == INF:
                    break
                self.now = tt
                self.next_grid = round(tt / self.tick_s) + 1
                self._tick(tt)
        end = max(self.now, tr.duration_s)
        for w in self.workers.values():
            self._account(w, end)
            for a, rec in w.adapters.items():
                a.stats.adapter_s += end - rec.since
        return SimResult(self._summary(end), self.decisions, self.cold_records, self.ticks, self.judged, end,
                         {name: ms.idle_histogram for name, ms in self.ms.items() if ms.idle_histogram.total()})

    # -- the answer -----------------------------------------------------------------------

    def _summary(self, end: float) -> dict[str, Any]:
        per_model: dict[str, Any] = {}
        tot = _Stats()
        tiers: dict[str, int] = {}
        for m in self.models:
            st = m.stats
            if not st.requests and not st.replica_s and not st.asleep_s and not st.adapter_s:
                continue
            per_model[m.name] = _row(st) | {
                "queue_full": st.queue_full,
                "cold_start_s": percentiles(st.cold_start_s),
                "cold_starts_by_tier": dict(sorted(st.tiers.items())),
            }
            if m.base is not None:
                # No engine of its own: its base's engines served it (and their time and
                # cost are the base's); how long it was held in them.
                per_model[m.name] |= {"base": m.base.name, "adapter_seconds": round(st.adapter_s, 3)}
            tot.ttfts.extend(st.ttfts)
            for tier, n in st.tiers.items():
                tiers[tier] = tiers.get(tier, 0) + n
            for k in ("requests", "cold_starts", "cold_waiters", "slo_met", "activation_timeouts",
                      "queue_full", "replica_s", "asleep_s", "usd"):
                setattr(tot, k, getattr(tot, k) + getattr(st, k))
        row = _row(tot)
        out = {k: row[k] for k in ("requests", "cold_starts", "cold_start_share")}
        out["cold_starts_by_tier"] = dict(sorted(tiers.items()))
        out["replica_seconds"] = row["replica_seconds"]
        out["standby_seconds"] = round(sum(self.standby_s.values()), 3)
        out["asleep_seconds"] = row["asleep_seconds"]
        out["instance_seconds"] = round(self.instance_s, 3)
        out["usd"] = round(tot.usd + sum(self.standby_usd.values()), 6)
        for k in ("ttft_s", "slo_met_share", "activation_timeouts"):
            out[k] = row[k]
        out["per_model"] = per_model
        return out


def _row(st: _Stats) -> dict[str, Any]:
    n = st.requests
    return {
        "requests": n,
        "cold_starts": st.cold_starts,
        "cold_start_share": st.cold_waiters / n if n else 0.0,
        "replica_seconds": round(st.replica_s, 3),
        "asleep_seconds": round(st.asleep_s, 3),
        "usd": round(st.usd, 6),
        "ttft_s": percentiles(st.ttfts),
        "slo_met_share": st.slo_met / n if n else 0.0,
        "activation_timeouts": st.activation_timeouts,
    }


SUMMARY_KEYS = ("requests", "cold_starts", "cold_start_share", "cold_starts_by_tier", "replica_seconds",
                "standby_seconds", "asleep_seconds", "instance_seconds", "usd", "ttft_s", "slo_met_share",
                "activation_timeouts", "per_model")


class _Effects:
    """Each decision's effect on the simulated fleet at time ``t``: what the actuator's
    calls and the workers' answers would do (``warm_pool.policy.decisions.Executor``)."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    def assign(self, d: Assign, t: float) -> None:
        s = self.sim
        w = s.workers[d.worker_id]
        target = s.by_name[d.model]
        load_s = s._start(w, target, t)
        if target.cold_open and target.cold_tier is None:
            target.cold_tier = w.tier
        w.mem = s.engine_bytes.get(target.name, 0)
        s._set(w, "loading", t, model=target, aid=d.assignment_id, since=t)
        s._after(w, load_s)

    def pack(self, d: Pack, t: float) -> None:
        """Start a packed engine on ``d.worker_id``: a new replica, not an instance."""
        s = self.sim
        host = s.workers[d.worker_id]
        m = s.by_name[d.model]
        s._account(host, t)  # the worker's time so far, without the new engine
        e = _Worker(d.engine_id, host.shape, 0.0, "loading", t, inside=host)
        e.mem, e.tier = d.memory_bytes, "packed"
        host.packed.append(e)
        s.workers[e.id] = e
        if m.cold_open and m.cold_tier is None:
            m.cold_tier = "packed"
        s._set(e, "loading", t, model=m, aid=d.assignment_id, since=t)
        # A full start of the model (an engine built and loaded) on a worker already up: no
        # boot; the weights from the disk cache its engines share, else the store.
        s._after(e, m.costs.load_s("disk" if m.name in host.disk else "s3"))

    def release(self, d: Release, t: float) -> None:
        s = self.sim
        w = s.workers[d.worker_id]
        m = self._out_of_rotation(w)
        # Only a drained replica parks its engine (as the worker does); a loading or
        # asleep one stops it.
        w.park = w.state == "ready" and w.engine is not None
        s._set(w, "draining", t)
        if w.inflight == 0:
            s._after(w, m.costs.release_s if m else 0.0)
        else:
            w.releasing = True

    def sleep(self, d: Sleep, t: float) -> None:
        s = self.sim
        w = s.workers[d.worker_id]
        m = self._out_of_rotation(w)
        s._set(w, "asleep", t, since=t)
        if m is not None:
            # The policy releases it once past asleep_ttl_s.
            heapq.heappush(s.deadlines, (t + m.a.asleep_ttl_s, -1))

    @staticmethod
    def _out_of_rotation(w: _Worker) -> _Model | None:
        """Take a ready replica out of its model's rotation; its model."""
        m = w.model
        if w.state == "ready" and m is not None:
            m.ready.remove(w)
        return m

    def launch(self, d: Launch, t: float) -> None:
        s = self.sim
        w = s._new_worker(d.shape, "launching")
        s._after(w, s.shapes[d.shape].boot_s)

    def start(self, d: Start, t: float) -> None:
        s = self.sim
        w = s.workers[d.worker_id]
        w.started_at = t
        s._set(w, "starting", t)
        s._after(w, s.shapes[w.shape].boot_s)

    def stop(self, d: Stop, t: float) -> None:
        s = self.sim
        w = s.workers[d.worker_id]
        assert not w.packed, "the policy never stops a worker hosting packed engines"
        w.keep_engine(None)  # a stopped instance keeps no engine
        s._set(w, "stopped", t)

    def terminate(self, d: Terminate, t: float) -> None:
        s = self.sim
        w = s.workers.pop(d.worker_id)
        assert not w.packed, "the policy never terminates a worker hosting packed engines"
        s._set(w, "stopped", t)
        s.views_dirty = True

    def prebuild(self, d: Prebuild, t: float) -> None:
        s = self.sim
        w = s.workers[d.worker_id]
        m = s.by_name[d.model]
        # The worker starts the named model in an engine that serves nothing yet: a
        # full start of it, from wherever it would read the weights.
        build_s = m.costs.load_s(w.tier_for(m))
        w.keep_engine(d.engine_class, m, built=False, built_at=t + build_s)
        s._engine_changed(w)
        s._after(w, build_s)

    def load_adapter(self, d: LoadAdapter, t: float) -> None:
        """Load an adapter into ``d.worker_id``'s engine of its base: a replica of the
        adapter once loaded, in the engine's slots."""
        s = self.sim
        w = s.workers.get(d.worker_id)
        a = s.by_name[d.model]
        if w is None or w.state != "ready" or w.model is not a.base:
            # Released by a decision of the same tick: a draining engine takes no adapter
            # (the policy sees it gone on the next tick).
            return
        rec = w.adapters[a] = _Loaded(a, w, t)
        a.serving += 1
        s._adapters_changed(w)
        s._push(t + a.costs.adapter_load_s, _ADAPTER, rec, rec.epoch)

    def unload_adapter(self, d: UnloadAdapter, t: float) -> None:
        """Unload an adapter: no new request goes to it; it goes once those in flight
        are answered, ``adapter_unload_s`` after."""
        s = self.sim
        w = s.workers.get(d.worker_id)
        a = s.by_name[d.model]
        rec = w.adapters.get(a) if w is not None else None
        if w is None or rec is None:
            return  # gone with its engine, released by a decision of the same tick
        if rec.state == "ready":
            a.ready.remove(w)
        if rec.state in SERVING:
            a.serving -= 1
        rec.state = "unloading"
        rec.epoch += 1
        if rec.inflight == 0:
            s._push(t + a.costs.adapter_unload_s, _ADAPTER, rec, rec.epoch)
        s._adapters_changed(w)
