"""The data plane as the activators see it: each model's requests, its queue and its
ready replicas' slots, admission, timeouts and the cold starts requests wait on."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Any

from simulator.changes import Changes
from simulator.clock import ADAPTER, DONE, TIMEOUT, Clock
from simulator.costs import CostModel, ModelCosts
from simulator.fleet import LoadedAdapter, SimWorker
from simulator.report import ColdStart, ModelStats
from simulator.traces import Trace
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
                 "group", "at_capacity", "slots")

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
                 on_admit: Callable[[int, float], None] | None = None) -> None:
        self.trace_models = trace_models
        self.clock, self.changes = clock, changes
        self.on_admit = on_admit
        self.cold_requests: list[int] = []
        self._ready_seq = 0  # places in models' rotations, in the order replicas became ready
        self.open_requests = 0
        self.cold_records: list[ColdStart] = []
        self.read(None, 0)

    def read(self, chunk: Trace | None, first: int) -> None:
        """Requests now arrive from ``chunk``, whose first request is the trace's ``first``."""
        self.first = first
        self.model = chunk.model if chunk else []
        self.input_tokens = chunk.input_tokens if chunk else []
        self.output_tokens = chunk.output_tokens if chunk else []

    def became_ready(self, m: SimModel, w: SimWorker) -> None:
        """``w``'s engine is ready for ``m`` (its own model): last in its rotation."""
        self._ready_seq += 1
        w.ready_seq = self._ready_seq
        m.ready.append(w)
        heapq.heappush(m.slots, (w.inflight, w.ready_seq, w))

    def pick(self, m: SimModel) -> SimWorker | None:
        """:func:`least_loaded`'s replica. For a model of its own, from its slot heap (a
        scan of hundreds of replicas per request was most of a busy model's cost); for an
        adapter, by the scan of its base's engines holding it."""
        if m.base is not None:
            return least_loaded(m)
        h = m.slots
        if len(h) > 4 * len(m.ready) + 64:  # mostly stale: rebuilt from the replicas
            h[:] = [(w.inflight, w.ready_seq, w) for w in m.ready]
            heapq.heapify(h)
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
        """Request ``k`` of the chunk being read arrives at ``t``."""
        m = self.trace_models[self.model[k]]
        m.stats.requests += 1
        m.arrivals += 1
        m.last_request_at = t
        self.changes.touched.add(m)
        if not m.queued:
            w = self.pick(m)
            if w is not None:
                self.open_requests += 1
                self.admit(m, w, self.first + k, t, self.input_tokens[k], self.output_tokens[k], False, t)
                return
        if m.at_capacity and not m.ready:
            # Its pool is full and nothing can be evicted: 503 at once, as the activators answer.
            m.stats.capacity_refusals += 1
            return
        if m.queued >= m.max_queue:
            m.stats.queue_full += 1
            return
        cold = not m.ready
        r = Waiting(self.first + k, t, self.input_tokens[k], self.output_tokens[k], m, cold)
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
