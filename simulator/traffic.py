"""The data plane as the activators see it: each model's requests, its queue and its
ready replicas' slots, admission, timeouts and the cold starts requests wait on."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from simulator.changes import Changes
from simulator.clock import ADAPTER, DONE, INF, TIMEOUT, Clock
from simulator.costs import CostModel, ModelCosts
from simulator.fleet import LoadedAdapter, SimWorker
from simulator.lanes import LANE_MIN_ARRIVALS, Lane
from simulator.report import ColdStart, ModelStats
from simulator.stream import Columns
from thaw.config import Model, ThawConfig
from thaw.wire import MAX_TTFT_SAMPLES

# A waiting request's states.
WAITING, ADMITTED, TIMED_OUT, REFUSED = 0, 1, 2, 3


class Waiting:
    """A request that found no free slot and waits in its model's queue: what it needs
    once the trace has moved on (a streamed trace keeps only the chunk it is reading)."""

    __slots__ = ("i", "t", "input_tokens", "output_tokens", "m", "state", "cold")

    def __init__(self, i: int, t: float, input_tokens: int, output_tokens: int, m: SimModel, cold: bool) -> None:
        self.i, self.t, self.input_tokens, self.output_tokens, self.m = i, t, input_tokens, output_tokens, m
        self.state = WAITING
        self.cold = cold  # it found no ready replica: it waits on a cold start


class SimModel:
    """A configured model (or adapter) as the simulation tracks it: its replicas, queue,
    traffic since the last tick, the cold start it may have open, its counters."""

    __slots__ = ("idx", "name", "cfg", "a", "costs", "cls", "ready", "serving", "queue", "queued", "in_flight",
                 "arrivals", "hot_ttfts", "last_request_at", "cold_open", "cold_since", "cold_tier",
                 "slo_s", "prefill_tps", "tpot_s", "max_conc", "max_queue", "timeout_s",
                 "band_for", "deadline_key", "deadline_times", "schedule_next", "stats", "base", "adapters",
                 "group", "at_capacity", "slots", "lane")

    def __init__(self, idx: int, m: Model, costs: ModelCosts, slo_s: float, cls: str | None = None) -> None:
        self.idx, self.name, self.cfg, self.a, self.costs = idx, m.name, m, m.autoscaling, costs
        self.cls = cls  # its engine class if its engine is kept (policy.kept_classes), else None
        # An adapter: its base (its ready and serving are the base's engines holding it
        # ready, and loading or ready: its replicas); a base: its adapters; either: the
        # models judged together with it (the base first, then its adapters).
        self.base: SimModel | None = None
        self.adapters: list[SimModel] = []
        self.group: tuple[SimModel, ...] = (self,)
        self.ready: list[SimWorker] = []
        # A model's own ready replicas by (requests in flight, place in ready), lazily:
        # (inflight, ready_seq, worker) pushed on every change, stale ones dropped when
        # they come to the top (Traffic.pick). Unused for an adapter (its ready are its
        # base's engines holding it).
        self.slots: list[tuple[int, int, SimWorker]] = []
        self.serving = 0  # loading + ready workers
        self.queue: deque[Waiting] = deque()
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
        # Its pool can give it no instance (the policy's ModelState.at_capacity, as of the
        # last tick that judged it): a request that finds no ready replica is refused.
        self.at_capacity = False
        self.stats = ModelStats()
        self.lane: Lane | None = None  # its hot requests in bulk (simulator.lanes), while it has one

    @property
    def plain(self) -> bool:
        """Neither an adapter nor a base of adapters: its replicas' slots are its own."""
        return self.base is None and not self.adapters


def build_models(cfg: ThawConfig, costs: CostModel, ttft_slo_s: float,
                 kept: dict[str, str]) -> tuple[list[SimModel], dict[str, SimModel]]:
    """The config's models in its order, and each by name (and served name); an adapter
    linked to its base, whose speed and slots it takes, and each judged with its group."""
    models = [SimModel(i, m, costs.models[m.name], m.autoscaling.ttft_slo_s or ttft_slo_s, kept.get(m.name))
              for i, m in enumerate(cfg.models)]
    by_name = {m.name: m for m in models}
    for i, m in enumerate(cfg.models):
        if m.served_name:
            by_name.setdefault(m.served_name, models[i])
    for a in models:
        if a.cfg.base is not None:
            # Served by its base's engine: at its speed, in its slots.
            base = a.base = by_name[a.cfg.base]
            base.adapters.append(a)
            a.prefill_tps, a.tpot_s, a.max_conc = base.prefill_tps, base.tpot_s, base.max_conc
    for b in models:
        if b.adapters:
            b.group = (b, *b.adapters)
            for a in b.adapters:
                a.group = b.group
    return models, by_name


def _rebuild_slots(m: SimModel) -> None:
    """``m``'s slot heap from its ready replicas as they are now (stale entries dropped)."""
    m.slots[:] = [(w.inflight, w.ready_seq, w) for w in m.ready]
    heapq.heapify(m.slots)


def least_loaded(m: SimModel) -> SimWorker | None:
    """The rule a pick follows, by a scan of ``m.ready``: the replica with the fewest
    requests in flight, the first of those; None when every one is full."""
    best = None
    for w in m.ready:
        if w.inflight < m.max_conc and (best is None or w.inflight < best.inflight):
            best = w
    return best


class Traffic:
    """The trace's requests as they arrive, wait, are admitted and answered; the cold
    starts they open and see closed. Requests arrive from one chunk of the trace at a
    time (:meth:`read`; ``i`` is a request's index in the whole trace); one that waits
    carries what it needs (:class:`Waiting`). ``on_admit`` hears each request's TTFT as
    it is admitted, and then :attr:`cold_requests` lists the requests that found no
    ready replica (a calibration compares both with a live run's)."""

    def __init__(self, trace_models: list[SimModel], clock: Clock, changes: Changes,
                 on_admit: Callable[[int, float], None] | None = None, *, lanes: bool = False) -> None:
        """``lanes``: a busy model's hot requests go by a lane (``simulator.lanes``; never
        with ``on_admit``, which hears each request)."""
        self.trace_models = trace_models
        self.clock, self.changes = clock, changes
        self.on_admit = on_admit
        self.cold_requests: list[int] = []
        self._ready_seq = 0  # places in models' rotations, in the order replicas became ready
        self.open_requests = 0
        self.cold_records: list[ColdStart] = []
        self.lanes_on = lanes and on_admit is None
        self.laned = 0  # requests admitted by lanes
        self.lanes: list[Lane] = []
        self.lanes_at = INF  # the first moment a lane must be brought up to date
        self._stopped: list[np.ndarray] = []  # rows of lanes stopped since the stream was last built
        self._trace_idx: dict[SimModel, list[int]] = {}
        for k, m in enumerate(trace_models):
            self._trace_idx.setdefault(m, []).append(k)
        self.read(None, 0)

    # -- the chunk being read: one request at a time, or by lanes -------------------------

    def read(self, chunk: Columns | None, first: int) -> None:
        """Requests now arrive from ``chunk``, whose first request is the trace's ``first``:
        a busy model's by its lane, the others one at a time (:attr:`times`,
        :meth:`arrive`)."""
        self.first = first
        n = len(chunk) if chunk is not None else 0
        self.chunk_end = INF
        if chunk is None or not n:
            none = np.empty(0, dtype=np.int64)
            self._cols = (np.empty(0), none, none, none)
            for lane in self.lanes:
                lane.take(none, *self._cols[:1], none, none)
            self._build_stream(none)
            return
        t, model = chunk.t, chunk.model
        self._cols = (t, model, chunk.input_tokens, chunk.output_tokens)
        self.chunk_end = float(t[-1])
        if not self.lanes_on:
            self._build_stream(np.arange(n))
            return
        self._start_lanes(np.bincount(model, minlength=len(self.trace_models)))
        laned = np.zeros(len(self.trace_models), dtype=bool)
        for lane in self.lanes:
            idx = self._trace_idx[lane.m]
            laned[idx] = True
            rows = np.flatnonzero(model == idx[0]) if len(idx) == 1 else np.flatnonzero(np.isin(model, idx))
            lane.take(rows, t[rows], self._cols[2][rows], self._cols[3][rows])
        self._build_stream(np.flatnonzero(~laned[model]) if self.lanes else np.arange(n))

    def _build_stream(self, rows: np.ndarray) -> None:
        """The requests that arrive one at a time: these rows of the chunk, in order."""
        t, model, inp, out = self._cols
        self._rows = rows
        self.times: list[float] = t[rows].tolist()
        self.model: list[int] = model[rows].tolist()
        self.input_tokens: list[int] = inp[rows].tolist()
        self.output_tokens: list[int] = out[rows].tolist()
        self.index: list[int] = (rows + self.first).tolist()

    def _start_lanes(self, counts: np.ndarray) -> None:
        """Models busy in the chunk, with a ready replica and no queue, take a lane; the
        requests they have in flight on ready replicas leave the event heap for it."""
        new: dict[SimModel, Lane] = {}
        for k in np.flatnonzero(counts >= LANE_MIN_ARRIVALS).tolist():
            m = self.trace_models[k]
            if m.lane is None and m not in new and m.plain and m.ready and not m.queued:
                new[m] = Lane(m, self)
        if not new:
            return
        heap, kept = self.clock.heap, []
        adopted: dict[SimModel, tuple[list[float], list[SimWorker]]] = {m: ([], []) for m in new}
        for e in heap:
            w = e[3]
            if e[1] == DONE and isinstance(w, SimWorker) and w.model in new and w.ready_seq >= 0:
                done, ws = adopted[w.model]
                done.append(e[0])
                ws.append(w)
            else:
                kept.append(e)
        heap[:] = kept
        heapq.heapify(heap)
        for m, lane in new.items():
            lane.adopt(*adopted[m])
            m.lane = lane
            self.lanes.append(lane)

    def stopped(self, lane: Lane) -> None:
        """``lane`` stopped: its model's later requests arrive one at a time."""
        self.lanes.remove(lane)
        lane.m.lane = None
        self._stopped.append(lane.stop())
        _rebuild_slots(lane.m)  # the lane kept its replicas' counts: picks start from them

    def restream(self, i: int) -> bool:
        """Rebuild the stream when lanes stopped: the requests from its ``i``-th on and the
        stopped lanes' rows, in order (True: rebuilt, it starts again at 0)."""
        if not self._stopped:
            return False
        rows = np.union1d(self._rows[i:], np.concatenate(self._stopped))
        self._stopped.clear()
        self._build_stream(rows)
        return True

    @property
    def consumed(self) -> bool:
        """Every lane has handled its arrivals of the chunk."""
        return all(lane.consumed for lane in self.lanes)

    def replan(self, tick_due: Callable[[float], float]) -> None:
        """Each lane's next moment to be brought up to date (``tick_due``: the tick that
        would see something happening at a time)."""
        at = INF
        for lane in self.lanes:
            if not lane.planned:
                lane.plan(tick_due, self.chunk_end)
            at = min(at, lane.at)
        self.lanes_at = at

    def catch_up(self, t: float) -> None:
        """Every lane brought up to ``t`` (something reads or changes them then)."""
        for lane in self.lanes:
            lane.catch_up(t)

    def barrier(self, t: float) -> float:
        """The lanes due at ``t``: brought up to it, those whose next arrival finds every
        slot full stopped just before it; the last of their requests' events."""
        last = -INF
        for lane in [x for x in self.lanes if x.at <= t]:
            if lane.full:
                last = max(last, lane.catch_up(t, arrivals_at_t=False))
                self.stopped(lane)
            else:
                last = max(last, lane.catch_up(t))
        return last

    def became_ready(self, m: SimModel, w: SimWorker) -> None:
        """``w``'s engine is ready for ``m`` (its own model): last in its rotation."""
        self._ready_seq += 1
        w.ready_seq = self._ready_seq
        m.ready.append(w)
        if m.lane is not None:
            m.lane.join(w)
        else:
            heapq.heappush(m.slots, (w.inflight, w.ready_seq, w))

    def pick(self, m: SimModel) -> SimWorker | None:
        """:func:`least_loaded`'s replica. For a model of its own, from its slot heap (a
        scan of hundreds of replicas per request was most of a busy model's cost); for an
        adapter, by the scan of its base's engines holding it."""
        if m.base is not None:
            return least_loaded(m)
        h = m.slots
        if len(h) > 4 * len(m.ready) + 64:  # mostly stale: rebuilt from the replicas
            _rebuild_slots(m)
        while h:
            inflight, seq, w = h[0]
            if w.ready_seq != seq or w.inflight != inflight:
                heapq.heappop(h)
                continue
            return w if inflight < m.max_conc else None
        return None

    @staticmethod
    def _load_changed(w: SimWorker) -> None:
        """``w``'s requests in flight changed: its entry in its model's slot heap."""
        if w.ready_seq >= 0 and w.model is not None:
            heapq.heappush(w.model.slots, (w.inflight, w.ready_seq, w))

    def admit(self, m: SimModel, w: SimWorker, i: int, arrived: float, input_tokens: int, output_tokens: int,
              cold: bool, t: float) -> None:
        """Request ``i`` (arrived at ``arrived``) is sent to ``w`` at ``t``."""
        w.inflight += 1
        self._load_changed(w)
        m.in_flight += 1
        done: SimWorker | LoadedAdapter = w
        if m.base is not None:
            done = w.adapters[m]
            done.inflight += 1
        prefill = input_tokens / m.prefill_tps
        ttft = t - arrived + prefill
        st = m.stats
        st.ttfts.append(ttft)
        if ttft <= m.slo_s:
            st.slo_met += 1
        if not cold and len(m.hot_ttfts) < MAX_TTFT_SAMPLES:
            m.hot_ttfts.append(ttft)
        self.clock.push(t + prefill + output_tokens * m.tpot_s, DONE, done)
        if self.on_admit is not None:
            self.on_admit(i, ttft)

    def _admit_waiting(self, m: SimModel, w: SimWorker, r: Waiting, t: float) -> None:
        r.state = ADMITTED
        self.admit(m, w, r.i, r.t, r.input_tokens, r.output_tokens, r.cold, t)

    def drain_queue(self, m: SimModel, t: float) -> None:
        q = m.queue
        while q:
            r = q[0]
            if r.state != WAITING:
                q.popleft()
                continue
            w = self.pick(m)
            if w is None:
                return
            q.popleft()
            m.queued -= 1
            self._admit_waiting(m, w, r, t)

    def _head(self, m: SimModel) -> Waiting | None:
        """The request first in ``m``'s queue (ones timed out dropped), None: none."""
        q = m.queue
        while q and q[0].state != WAITING:
            q.popleft()
        return q[0] if q else None

    def _free_slot(self, w: SimWorker, t: float) -> None:
        """A slot of ready ``w`` freed: its model's queue takes it; an engine holding
        adapters gives it to the longest-waiting request of its base and adapters."""
        m = w.model
        assert m is not None
        if not w.adapters:
            if m.queued:
                self.drain_queue(m, t)
            return
        sharing = [m, *(a for a, rec in w.adapters.items() if rec.state == "ready")]
        while w.inflight < m.max_conc:
            first: Waiting | None = None
            for x in sharing:
                r = self._head(x) if x.queued else None
                if r is not None and (first is None or r.i < first.i):
                    first = r
            if first is None:
                return
            x = first.m
            x.queue.popleft()
            x.queued -= 1
            self._admit_waiting(x, w, first, t)

    def arrive(self, k: int, t: float) -> None:
        """Request ``k`` of the stream (:attr:`times`) arrives at ``t``."""
        m = self.trace_models[self.model[k]]
        m.stats.requests += 1
        m.arrivals += 1
        m.last_request_at = t
        self.changes.touched.add(m)
        if not m.queued:
            w = self.pick(m)
            if w is not None:
                self.open_requests += 1
                self.admit(m, w, self.index[k], t, self.input_tokens[k], self.output_tokens[k], False, t)
                return
        if m.at_capacity and not m.ready:
            # Its pool is full and nothing can be evicted: 503 at once, as the activators answer.
            m.stats.capacity_refusals += 1
            return
        if m.queued >= m.max_queue:
            m.stats.queue_full += 1
            return
        cold = not m.ready
        r = Waiting(self.index[k], t, self.input_tokens[k], self.output_tokens[k], m, cold)
        m.queue.append(r)
        m.queued += 1
        self.open_requests += 1
        self.clock.push(t + m.timeout_s, TIMEOUT, r)
        if cold:
            if self.on_admit is not None:
                self.cold_requests.append(r.i)
            m.stats.cold_waiters += 1
            if not m.cold_open:
                m.cold_open, m.cold_since, m.cold_tier = True, t, None
                m.stats.cold_starts += 1
                # The activator's demand signal wakes the controller now.
                self.changes.dirty.add(m)
                self.changes.kick_pending = True

    def done(self, of: SimWorker | LoadedAdapter, t: float) -> None:
        """A request answered, by a worker's engine or an adapter in it."""
        w = of.w if isinstance(of, LoadedAdapter) else of
        m = of.m if isinstance(of, LoadedAdapter) else of.model
        assert m is not None and w.model is not None
        if isinstance(of, LoadedAdapter):
            of.inflight -= 1
            if of.state == "unloading" and of.inflight == 0:
                self.clock.push(t + m.costs.adapter_unload_s, ADAPTER, of, of.epoch)
        w.inflight -= 1
        self._load_changed(w)
        m.in_flight -= 1
        m.last_request_at = t
        self.changes.touched.add(m)
        if w.state == "ready":
            self._free_slot(w, t)
        elif w.releasing and w.inflight == 0:
            w.releasing = False
            self.clock.after(w, w.model.costs.release_s)
        self.open_requests -= 1

    def timeout(self, r: Waiting) -> None:
        if r.state == WAITING:
            m = r.m
            r.state = TIMED_OUT
            m.queued -= 1
            m.stats.activation_timeouts += 1
            self.open_requests -= 1
            if not m.queued and not m.ready:
                m.cold_open = False  # everyone waiting gave up: the next request starts anew
            self.changes.touched.add(m)

    def refuse_waiting(self, m: SimModel) -> None:
        """``m``'s pool can give it no instance: every request waiting for it is answered
        503 at once (the activators' answer to the failure kind "capacity")."""
        for r in m.queue:
            if r.state == WAITING:
                r.state = REFUSED
                m.stats.capacity_refusals += 1
                self.open_requests -= 1
        m.queue.clear()
        m.queued = 0
        if not m.ready:
            m.cold_open = False  # the next request starts anew
        self.changes.touched.add(m)

    def cold_start_ends(self, m: SimModel, tier: str, t: float) -> None:
        """A replica of ``m`` is ready for the requests waiting on its cold start."""
        m.cold_open = False
        m.stats.cold_start_s.append(t - m.cold_since)
        m.stats.tiers[tier] = m.stats.tiers.get(tier, 0) + 1
        self.cold_records.append(ColdStart(m.name, m.cold_since, t - m.cold_since, tier))
