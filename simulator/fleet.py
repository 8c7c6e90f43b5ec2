"""The simulated fleet: instances, the engines they run (their own, packed ones, the
adapters in them), what each one holds and is on its way to, and what its time costs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.changes import Changes
from simulator.clock import INF, Clock
from simulator.costs import CostModel
from thaw.config import ThawConfig
from thaw.engine_class import engine_class_of
from thaw.fit import engine_capacity, engine_memory
from thaw.units import GiB
from thaw.wire import CachedWeights, WorkerState
from warm_pool.policy.decide import WorkerView
from warm_pool.policy.states import SERVING, STANDBY_LIKE

if TYPE_CHECKING:
    from simulator.traffic import SimModel


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


class SimWorker:
    """An instance, or an engine packed into one (``inside``): its state, the model it
    serves, the weights and engine it keeps, and its view as the controller reads it."""

    __slots__ = ("id", "shape", "price", "state", "model", "aid", "since", "entered", "inflight", "ready_seq",
                 "epoch", "tier", "view", "releasing", "host", "disk", "cached", "engine", "engine_of",
                 "built", "built_at", "park", "inside", "packed", "mem", "cap", "adapters", "started_at",
                 "ready_at")

    def __init__(self, wid: str, shape: str, price: float, state: str, now: float, *, cap: int = 0,
                 inside: SimWorker | None = None) -> None:
        self.id, self.shape, self.price, self.state = wid, shape, price, state
        # Packing: the worker a packed engine runs in (None: an instance), the packed
        # engines an instance runs, the memory its engine holds while assigned, and what
        # its engines may hold together (0: it does not pack).
        self.inside = inside
        self.packed: list[SimWorker] = []
        self.mem = 0
        self.cap = cap
        self.model: SimModel | None = None
        self.aid: str | None = None
        self.since: float | None = None
        self.entered = now
        self.inflight = 0
        # Its place in its model's ready replicas (simulator.traffic's slot heap); -1: none.
        self.ready_seq = -1
        self.epoch = 0  # bumps on every change: a scheduled transition of an older epoch is void
        self.tier = "s3"
        # When the instance was last launched or started, and when its engine last became
        # ready (an adapter's cold start is of tier "adapter" when that was before it).
        self.started_at = now
        self.ready_at = INF
        # The adapters in its engine, in the order they were loaded.
        self.adapters: dict[SimModel, LoadedAdapter] = {}
        self.releasing = False
        # Models whose weights it holds (name -> GiB), least recently loaded first, and
        # what its status says of them (rebuilt only when they change).
        self.host: dict[str, SimModel] = {}
        self.disk: dict[str, SimModel] = {}
        self.cached: tuple[CachedWeights, ...] = ()
        # The engine it keeps across assignments: its class (None: none), the model it
        # was built for (a teardown costs that model's release_s), whether it is built,
        # and when its build ends (a swap into one still building waits until then).
        self.engine: str | None = None
        self.engine_of: SimModel | None = None
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

    def keep_engine(self, cls: str | None, of: SimModel | None = None, *, built: bool = True,
                    built_at: float = 0.0) -> None:
        """Keep an engine of class ``cls`` (None: drop the one kept), built for ``of``."""
        self.engine, self.engine_of = cls, of
        self.built, self.built_at = cls is not None and built, built_at

    def hold(self, m: SimModel, host_gib: float | None, disk_gib: float) -> None:
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

    def tier_for(self, m: SimModel) -> str:
        """Where this worker would read ``m`` from."""
        return "host" if m.name in self.host else "disk" if m.name in self.disk else "s3"

    def start_s(self, m: SimModel, t: float) -> float:
        """Seconds until this worker serves ``m`` from ``t``; sets its ``tier`` (where it
        came from) and drops an engine the start does not use."""
        if self.state == "asleep":
            self.tier = "asleep"
            return m.costs.load_s("asleep")
        tier = self.tier_for(m)
        kept, of = self.engine, self.engine_of
        # The worker waits for an engine still building before it swaps into it or stops it.
        wait = max(self.built_at - t, 0.0) if kept is not None and not self.built else 0.0
        if kept is not None and kept == m.cls:
            self.tier = "swap"
            return wait + m.costs.swap_load_s(tier)
        self.tier = tier
        if kept is None:
            return m.costs.load_s(tier)
        self.keep_engine(None)
        return wait + (of.costs.release_s if of is not None else 0.0) + m.costs.load_s(tier)


class LoadedAdapter:
    """An adapter in a worker's engine: loading, ready or unloading (then gone), and its
    requests in flight there (an unload waits for them)."""

    __slots__ = ("m", "w", "state", "inflight", "epoch", "since")

    def __init__(self, m: SimModel, w: SimWorker, now: float) -> None:
        self.m, self.w, self.state, self.since = m, w, "loading", now
        self.inflight = 0
        self.epoch = 0  # bumps on every change: a scheduled transition of an older epoch is void


class Fleet:
    """The workers by id, their changes of state, and the time and cost they count.
    Every change goes through here, so that the views, the models' replica counts and
    the accounts stay in step with it (and :class:`~simulator.changes.Changes` hears)."""

    def __init__(self, cfg: ThawConfig, clock: Clock, changes: Changes) -> None:
        self.clock, self.changes = clock, changes
        self.shapes = {s.name: s for s in cfg.shapes}
        self.capacity = {p.shape: engine_capacity(self.shapes[p.shape]) for p in cfg.pools if p.pack}
        self.workers: dict[str, SimWorker] = {}
        self.launched = 0
        self.views: tuple[WorkerView, ...] = ()
        # Time and cost counted so far outside any model: standbys' by shape, and all
        # instances' time.
        self.standby_s: dict[str, float] = {}
        self.standby_usd: dict[str, float] = {}
        self.instance_s = 0.0

    def new_worker(self, shape: str, state: str) -> SimWorker:
        self.launched += 1
        w = SimWorker(f"{shape}-{self.launched:06d}", shape, self.shapes[shape].price_per_hour_usd, state,
                      self.clock.now, cap=self.capacity.get(shape, 0))
        self.workers[w.id] = w
        self.changes.worker_changed(shape)
        return w

    def current_views(self) -> tuple[WorkerView, ...]:
        """Every worker's view, as the next snapshot gives them (rebuilt when one changed)."""
        if self.changes.views_dirty:
            self.views = tuple(w.view for w in self.workers.values())
            self.changes.views_dirty = False
        return self.views

    def account(self, w: SimWorker, t: float) -> None:
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

    def set(self, w: SimWorker, state: str, t: float, *, model: SimModel | None | bool = False,
            aid: str | None | bool = False, since: float | None | bool = False) -> None:
        """Move ``w`` to ``state`` at ``t`` (and to ``model``, ``aid``, ``since`` where
        given): its time counted first, its models' replica counts kept up."""
        self.account(w, t)
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
            self.drop_adapters(w, t)
        w.epoch += 1
        w.view = w._view()
        self.changes.worker_changed(w.shape)
        serving = state in SERVING
        if old_model is not None and was_serving and (not serving or w.model is not old_model):
            old_model.serving -= 1
        if w.model is not None and serving and (not was_serving or w.model is not old_model):
            w.model.serving += 1
        self.changes.rejudge(m for m in (old_model, w.model) if m is not None)

    def drop_adapters(self, w: SimWorker, t: float) -> None:
        """``w``'s engine stops serving (released, put to sleep): its adapters go with it.
        Their requests in flight still finish there (the release waits for them)."""
        for a, rec in w.adapters.items():
            self.adapter_gone(a, rec, t)
        w.adapters.clear()

    def adapter_gone(self, a: SimModel, rec: LoadedAdapter, t: float) -> None:
        """``rec`` leaves its engine (no longer a replica of ``a``, if it still was)."""
        if rec.state == "ready":
            a.ready.remove(rec.w)
        if rec.state in SERVING:
            a.serving -= 1
        a.stats.adapter_s += t - rec.since
        rec.state = "gone"
        rec.epoch += 1
        self.changes.rejudge(a.group)

    def adapters_changed(self, w: SimWorker) -> None:
        """``w``'s adapters changed, its state did not: a new view, and its base and that
        base's adapters judged again (an adapter's replicas, the free adapter slots)."""
        w.view = w._view()
        self.changes.views_dirty = True
        assert w.model is not None
        self.changes.rejudge(w.model.group)

    def engine_changed(self, w: SimWorker) -> None:
        """``w``'s kept engine changed, its state did not: a new view (for placement and
        the pools' prebuild plan) and a new epoch (its next step is the build's end)."""
        w.epoch += 1
        w.view = w._view()
        self.changes.worker_changed(w.shape)

    def close(self, end: float) -> None:
        """The run ends at ``end``: every instance's time and every adapter's counted."""
        for w in self.workers.values():
            self.account(w, end)
            for a, rec in w.adapters.items():
                a.stats.adapter_s += end - rec.since
