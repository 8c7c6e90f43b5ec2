"""The data plane as the activators see it: each model's requests, its queue and its
ready replicas' slots, admission, timeouts and the cold starts requests wait on."""

from __future__ import annotations

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

# Request states.
WAITING, ADMITTED, TIMED_OUT, REFUSED = 0, 1, 2, 3


class SimModel:
    """A configured model (or adapter) as the simulation tracks it: its replicas, queue,
    traffic since the last tick, the cold start it may have open, its counters."""

    __slots__ = ("idx", "name", "cfg", "a", "costs", "cls", "ready", "serving", "queue", "queued", "in_flight",
                 "arrivals", "hot_ttfts", "last_request_at", "cold_open", "cold_since", "cold_tier",
                 "slo_s", "prefill_tps", "tpot_s", "max_conc", "max_queue", "timeout_s",
                 "band_for", "deadline_key", "deadline_times", "schedule_next", "stats", "base", "adapters",
                 "group", "at_capacity")

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


class Traffic:
    """The trace's requests as they arrive, wait, are admitted and answered; the cold
    starts they open and see closed. ``on_admit`` hears each request's TTFT as it is
    admitted (a calibration compares them with a live run's)."""

    def __init__(self, trace: Trace, trace_models: list[SimModel], clock: Clock, changes: Changes,
                 on_admit: Callable[[int, float], None] | None = None) -> None:
        self.trace, self.trace_models = trace, trace_models
        self.clock, self.changes = clock, changes
        self.on_admit = on_admit
        n = len(trace)
        self.req_state = bytearray(n)
        self.req_cold = bytearray(n)
        self.open_requests = 0
        self.cold_records: list[ColdStart] = []

    def pick(self, m: SimModel) -> SimWorker | None:
        best = None
        for w in m.ready:
            if w.inflight < m.max_conc and (best is None or w.inflight < best.inflight):
                best = w
        return best

    def admit(self, m: SimModel, w: SimWorker, i: int, t: float) -> None:
        tr = self.trace
        self.req_state[i] = ADMITTED
        w.inflight += 1
        m.in_flight += 1
        done: SimWorker | LoadedAdapter = w
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
        self.clock.push(t + prefill + tr.output_tokens[i] * m.tpot_s, DONE, done)
        if self.on_admit is not None:
            self.on_admit(i, ttft)

    def drain_queue(self, m: SimModel, t: float) -> None:
        q = m.queue
        while q:
            i = q[0]
            if self.req_state[i] != WAITING:
                q.popleft()
                continue
            w = self.pick(m)
            if w is None:
                return
            q.popleft()
            m.queued -= 1
            self.admit(m, w, i, t)

    def _head(self, m: SimModel) -> int | None:
        """The request first in ``m``'s queue (ones timed out dropped), None: none."""
        q = m.queue
        while q and self.req_state[q[0]] != WAITING:
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
            first: tuple[int, SimModel] | None = None
            for x in sharing:
                i = self._head(x) if x.queued else None
                if i is not None and (first is None or i < first[0]):
                    first = (i, x)
            if first is None:
                return
            i, x = first
            x.queue.popleft()
            x.queued -= 1
            self.admit(x, w, i, t)

    def arrive(self, i: int, t: float) -> None:
        m = self.trace_models[self.trace.model[i]]
        m.stats.requests += 1
        m.arrivals += 1
        m.last_request_at = t
        self.changes.touched.add(m)
        if not m.queued:
            w = self.pick(m)
            if w is not None:
                self.open_requests += 1
                self.admit(m, w, i, t)
                return
        if m.at_capacity and not m.ready:
            # Its pool is full and nothing can be evicted: 503 at once, as the activators answer.
            self.req_state[i] = REFUSED
            m.stats.capacity_refusals += 1
            return
        if m.queued >= m.max_queue:
            self.req_state[i] = REFUSED
            m.stats.queue_full += 1
            return
        m.queue.append(i)
        m.queued += 1
        self.open_requests += 1
        self.clock.push(t + m.timeout_s, TIMEOUT, m, i)
        if not m.ready:
            self.req_cold[i] = 1
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
        m.in_flight -= 1
        m.last_request_at = t
        self.changes.touched.add(m)
        if w.state == "ready":
            self._free_slot(w, t)
        elif w.releasing and w.inflight == 0:
            w.releasing = False
            self.clock.after(w, w.model.costs.release_s)
        self.open_requests -= 1

    def timeout(self, m: SimModel, i: int) -> None:
        if self.req_state[i] == WAITING:
            self.req_state[i] = TIMED_OUT
            m.queued -= 1
            m.stats.activation_timeouts += 1
            self.open_requests -= 1
            if not m.queued and not m.ready:
                m.cold_open = False  # everyone waiting gave up: the next request starts anew
            self.changes.touched.add(m)

    def refuse_waiting(self, m: SimModel) -> None:
        """``m``'s pool can give it no instance: every request waiting for it is answered
        503 at once (the activators' answer to the failure kind "capacity")."""
        for i in m.queue:
            if self.req_state[i] == WAITING:
                self.req_state[i] = REFUSED
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
