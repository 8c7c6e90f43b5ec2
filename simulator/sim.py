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
its base's engines): all of them when any one's decision can change. The default mode
also takes a busy model's hot requests a window at a time (``simulator.lanes``): the same
admissions and TTFTs, only which replica serves which request differs, which can move
the end of a released replica's drain. The two modes make the same decisions
(tests/simulator/test_sim.py; with lanes, tests/simulator/test_lanes.py: all but when a
drained instance is stopped or ended), the default one many times faster.

The parts, each owning its state: ``simulator.clock`` (time and the events ahead),
``simulator.fleet`` (workers and engines, their changes of state, their time and cost),
``simulator.traffic`` (requests, queues, cold starts), ``simulator.lanes`` (a busy
model's hot requests in bulk), ``simulator.changes`` (what changed
since the last tick), ``simulator.controller`` (the ticks: whom to judge, ``decide``, the
wake-ups), ``simulator.effects`` (each decision's effect), ``simulator.report`` (the
answer). :class:`Simulator` wires them and runs the event loop; a worker's or an
adapter's step ending is handled here, where the fleet and the traffic meet. The rules
are not here (``warm_pool.policy.decide``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping

from simulator.changes import Changes
from simulator.clock import ADAPTER, DONE, INF, WORKER, Clock
from simulator.controller import Controller
from simulator.costs import CostModel
from simulator.effects import Effects
from simulator.fleet import Fleet, LoadedAdapter, SimWorker, engine_classes, engine_sizes
from simulator.report import (
    SUMMARY_KEYS,
    TIERS,
    SimResult,
    summary,
    tier_order,
)
from simulator.stream import Columns, TraceStream, chunked
from simulator.traces import Trace
from simulator.traffic import Traffic, build_models
from thaw.config import ThawConfig
from warm_pool.policy.decide import kept_classes
from warm_pool.policy.keepalive import IdleHistogram

# A whole trace is read this many requests at a time.
CHUNK_ROWS = 4096

# What callers import from here (defined beside the part they belong to).
__all__ = ["SUMMARY_KEYS", "TIERS", "SimResult", "Simulator", "engine_classes", "engine_sizes", "tier_order"]


class Simulator:
    """One run: ``Simulator(cfg, costs, trace).run()``. Deterministic: the trace and
    the config decide everything (the seed only matters to traces drawn at random).
    ``on_admit`` hears each request's index and TTFT as it is admitted."""

    def __init__(self, cfg: ThawConfig, costs: CostModel, trace: Trace | TraceStream, *, tick_s: float = 1.0,
                 exact: bool = False, ttft_slo_s: float = 5.0, record_decisions: bool = False,
                 histograms: Mapping[str, IdleHistogram] | None = None,
                 on_admit: Callable[[int, float], None] | None = None) -> None:
        missing = [name for name in trace.models if cfg.model(name) is None]
        if missing:
            raise ValueError(f"trace models not in the config: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        self.trace = trace
        # A trace is read a chunk at a time (a busy model may take a lane as each starts).
        self._chunks: Callable[[], Iterator[Columns]] = (chunked(trace, CHUNK_ROWS).arrays
                                                         if isinstance(trace, Trace) else trace.arrays)
        self.requests = 0  # how many arrived (a stream's length is known at its end)
        self.last_arrival_s = 0.0
        self._first = 0  # the trace's index of the next chunk's first request
        self._ended = False
        classes = engine_classes(cfg, costs)
        engine_bytes = engine_sizes(cfg, costs)
        # Only models of a class their pool pre-builds keep their engine (as on the controller).
        self.models, by_name = build_models(cfg, costs, ttft_slo_s, kept_classes(cfg, classes))
        self.clock = Clock()
        self.changes = Changes()
        self.fleet = Fleet(cfg, self.clock, self.changes)
        # Trace model index -> simulated model.
        self.traffic = Traffic([by_name[name] for name in trace.models], self.clock, self.changes, on_admit,
                               lanes=not exact)
        effects = Effects(self.fleet, by_name, engine_bytes, self.clock, [])
        self.controller = Controller(cfg, self.models, self.fleet, self.changes, effects, tick_s=tick_s,
                                     exact=exact, classes=classes, engine_bytes=engine_bytes,
                                     record=record_decisions, histograms=histograms,
                                     refuse=self.traffic.refuse_waiting)
        # Every pool starts at its standby floor, already standing by (a running fleet).
        for pool in cfg.pools:
            for _ in range(pool.standby_min):
                self.fleet.new_worker(pool.shape, "standby").started_at = -INF

    def run(self) -> SimResult:
        clock, traffic, controller, changes = self.clock, self.traffic, self.controller, self.changes
        chunks = self._chunks()
        times, n = self._next_chunk(chunks)
        i = 0
        heap = clock.heap
        while True:
            ta = times[i] if i < n else INF
            te = heap[0][0] if heap else INF
            tl = traffic.lanes_at
            if i >= n and self._ended and not traffic.open_requests:
                break
            tt = controller.next_tick(clock.now)
            if te <= ta and te <= tt and te <= tl:
                t, kind, _, obj, arg = heapq.heappop(heap)
                clock.now = t
                if kind == DONE:
                    traffic.done(obj, t)
                    continue
                if kind == WORKER:
                    self._worker_event(obj, arg, t)
                elif kind == ADAPTER:
                    self._adapter_event(obj, arg, t)
                else:
                    traffic.timeout(obj)
                    continue
            elif tl <= ta and tl <= tt:
                # A lane's window ends: brought up to date (or stopped before an arrival
                # that finds every slot full).
                clock.now = max(clock.now, traffic.barrier(tl))
            elif ta <= tt:
                clock.now = ta
                traffic.arrive(i, ta)
                i += 1
                if i >= n and traffic.consumed:  # the chunk is read: the next (the trace's end: none)
                    times, n = self._next_chunk(chunks)
                    i = 0
                # Requests of one instant arrive together: the controller, woken by
                # their demand, sees them all (not the first alone).
                if not (changes.kick_pending and (i >= n or times[i] > ta)):
                    continue
                changes.kick_pending = False
                traffic.catch_up(ta)
                controller.tick(ta)
            else:
                if tt == INF:
                    break
                clock.now = tt
                traffic.catch_up(tt)
                controller.grid_tick(tt)
            # Lanes may have stopped, or their models' replicas changed.
            if traffic.restream(i):
                times, n, i = traffic.times, len(traffic.times), 0
            if i >= n and traffic.consumed and not self._ended:
                times, n = self._next_chunk(chunks)
                i = 0
            traffic.replan(controller.tick_due)
        self.requests = self._first
        end = max(clock.now, self.last_arrival_s)
        self.fleet.close(end)
        f = self.fleet
        return SimResult(summary(self.models, f.standby_s, f.standby_usd, f.instance_s), controller.decisions,
                         traffic.cold_records, controller.ticks, controller.judged, end,
                         {name: ms.idle_histogram for name, ms in controller.ms.items() if ms.idle_histogram.total()},
                         self.last_arrival_s)

    def _next_chunk(self, chunks: Iterator[Columns]) -> tuple[list[float], int]:
        """Read the next chunk with requests (none: the trace's end); the times of those
        of its requests that arrive one at a time, and how many."""
        traffic = self.traffic
        if traffic.chunk_end != INF:
            self.last_arrival_s = traffic.chunk_end
        for chunk in chunks:
            if len(chunk):
                traffic.read(chunk, self._first)
                self._first += len(chunk)
                traffic.replan(self.controller.tick_due)
                return traffic.times, len(traffic.times)
        traffic.read(None, self._first)
        self._ended = True
        return [], 0

    def _worker_event(self, w: SimWorker, epoch: int, t: float) -> None:
        """A worker's step (boot, load, release, build) ends, unless it changed since."""
        fleet = self.fleet
        if w.epoch != epoch or w.id not in fleet.workers:
            return
        s = w.state
        if s == "loading":
            m = w.model
            assert m is not None
            if m.cls is not None:
                # Its engine (built now, or swapped into) can take another model of its class.
                w.keep_engine(m.cls, m)
            if m.lane is not None:
                m.lane.catch_up(t, arrivals_at_t=False)  # before it joins the rotation
            w.ready_at = t
            fleet.set(w, "ready", t)
            shape = fleet.shapes[w.shape]
            disk_gib = shape.cache.max_gib if shape.cache else 0.0
            if w.inside is not None:
                w.inside.hold(m, None, disk_gib)
            else:
                w.hold(m, shape.host_cache_gib, disk_gib)
            self.traffic.became_ready(m, w)
            if m.cold_open:
                self.traffic.cold_start_ends(m, m.cold_tier or w.tier, t)
            self.traffic.drain_queue(m, t)
        elif s in ("launching", "starting"):
            fleet.set(w, "standby", t)
        elif s == "draining":
            w.releasing = False
            if w.inside is not None:
                # A packed engine lives for one assignment: released, it is gone (its room
                # is free: the shape changed, so models waiting for room are judged again).
                del fleet.workers[w.id]
                fleet.set(w, "stopped", t, model=None, aid=None, since=None)
                w.inside.packed.remove(w)
                return
            if not w.park:
                w.keep_engine(None)
            w.park = False
            fleet.set(w, "standby", t, model=None, aid=None, since=None)
        elif s == "standby" and w.engine is not None and not w.built:
            # A prebuild is done: the engine is built (its view says ready).
            w.built = True
            fleet.engine_changed(w)

    def _adapter_event(self, rec: LoadedAdapter, epoch: int, t: float) -> None:
        """An adapter's load or unload ends."""
        if rec.epoch != epoch:
            return
        w, a = rec.w, rec.m
        if rec.state == "loading":
            rec.state = "ready"
            a.ready.append(w)
            self.fleet.adapters_changed(w)
            if a.cold_open:
                self.traffic.cold_start_ends(a, _adapter_tier(w, a.cold_since), t)
            self.traffic.drain_queue(a, t)
        elif rec.state == "unloading":
            del w.adapters[a]
            self.fleet.adapter_gone(a, rec, t)
            self.fleet.adapters_changed(w)


def _adapter_tier(w: SimWorker, since: float) -> str:
    """Where an adapter's cold start since ``since`` got its replica, as the activator
    says (``activator.routing.replicas.cold_start_tier``): "adapter" when the engine of its
    base was ready before, else where that engine came from."""
    if w.ready_at <= since:
        return "adapter"
    if w.tier == "asleep" or w.inside is not None:
        return w.tier  # a wake; a packed engine (its worker was up: no launch)
    # Launched (or started) for it: at the request's tick or after.
    return "launch" if w.started_at >= since else w.tier
