"""Each decision's effect on the simulated fleet: what the actuator's calls and the
workers' answers would do (``warm_pool.policy.decisions.Executor``, as
``warm_pool.fleet.actuator`` is for the real one; one dispatch, ``carry_out``, that a type
checker proves covers every decision)."""

from __future__ import annotations

import heapq

from simulator.clock import ADAPTER, Clock
from simulator.fleet import Fleet, LoadedAdapter, SimWorker
from simulator.traffic import SimModel
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
from warm_pool.policy.states import SERVING


class Effects:
    """Carries out decisions at time ``t`` on ``fleet``. ``deadlines`` is the controller's
    heap of wake-ups ((when, model index or -1: the pools)): a sleep wakes the pools when
    the asleep replica's time to live ends."""

    def __init__(self, fleet: Fleet, by_name: dict[str, SimModel], engine_bytes: dict[str, int], clock: Clock,
                 deadlines: list[tuple[float, int]]) -> None:
        self.fleet, self.by_name, self.engine_bytes = fleet, by_name, engine_bytes
        self.clock, self.deadlines = clock, deadlines

    def carry_out(self, d: Decision, t: float) -> None:
        carry_out(d, self, t)

    def assign(self, d: Assign, t: float) -> None:
        f = self.fleet
        w = f.workers[d.worker_id]
        target = self.by_name[d.model]
        load_s = w.start_s(target, t)
        if target.cold_open and target.cold_tier is None:
            target.cold_tier = w.tier
        w.mem = self.engine_bytes.get(target.name, 0)
        f.set(w, "loading", t, model=target, aid=d.assignment_id, since=t)
        self.clock.after(w, load_s)

    def pack(self, d: Pack, t: float) -> None:
        """Start a packed engine on ``d.worker_id``: a new replica, not an instance."""
        f = self.fleet
        host = f.workers[d.worker_id]
        m = self.by_name[d.model]
        f.account(host, t)  # the worker's time so far, without the new engine
        e = SimWorker(d.engine_id, host.shape, 0.0, "loading", t, inside=host)
        e.mem, e.tier = d.memory_bytes, "packed"
        host.packed.append(e)
        f.workers[e.id] = e
        if m.cold_open and m.cold_tier is None:
            m.cold_tier = "packed"
        f.set(e, "loading", t, model=m, aid=d.assignment_id, since=t)
        # A full start of the model (an engine built and loaded) on a worker already up: no
        # boot; the weights from the disk cache its engines share, else the store.
        self.clock.after(e, m.costs.load_s("disk" if m.name in host.disk else "s3"))

    def release(self, d: Release, t: float) -> None:
        f = self.fleet
        w = f.workers[d.worker_id]
        m = self._out_of_rotation(w)
        if d.reason == "evicted" and m is not None:
            m.stats.evictions += 1  # idle, given up for a model waiting in its full pool
        # Only a drained replica parks its engine (as the worker does); a loading or
        # asleep one stops it.
        w.park = w.state == "ready" and w.engine is not None
        f.set(w, "draining", t)
        if w.inflight == 0:
            self.clock.after(w, m.costs.release_s if m else 0.0)
        else:
            w.releasing = True

    def sleep(self, d: Sleep, t: float) -> None:
        f = self.fleet
        w = f.workers[d.worker_id]
        m = self._out_of_rotation(w)
        f.set(w, "asleep", t, since=t)
        if m is not None:
            # The policy releases it once past asleep_ttl_s.
            heapq.heappush(self.deadlines, (t + m.a.asleep_ttl_s, -1))

    @staticmethod
    def _out_of_rotation(w: SimWorker) -> SimModel | None:
        """Take a ready replica out of its model's rotation; its model."""
        m = w.model
        if w.state == "ready" and m is not None:
            m.ready.remove(w)
            w.ready_seq = -1  # its entries in the model's slot heap are void
            if m.lane is not None:
                m.lane.leave(w)  # its requests in flight finish on the event heap
        return m

    def launch(self, d: Launch, t: float) -> None:
        f = self.fleet
        w = f.new_worker(d.shape, "launching")
        self.clock.after(w, f.shapes[d.shape].boot_s)

    def start(self, d: Start, t: float) -> None:
        f = self.fleet
        w = f.workers[d.worker_id]
        w.started_at = t
        f.set(w, "starting", t)
        self.clock.after(w, f.shapes[w.shape].boot_s)

    def stop(self, d: Stop, t: float) -> None:
        f = self.fleet
        w = f.workers[d.worker_id]
        assert not w.packed, "the policy never stops a worker hosting packed engines"
        w.keep_engine(None)  # a stopped instance keeps no engine
        f.set(w, "stopped", t)

    def terminate(self, d: Terminate, t: float) -> None:
        f = self.fleet
        w = f.workers.pop(d.worker_id)
        assert not w.packed, "the policy never terminates a worker hosting packed engines"
        f.set(w, "stopped", t)
        f.changes.views_dirty = True

    def prebuild(self, d: Prebuild, t: float) -> None:
        f = self.fleet
        w = f.workers[d.worker_id]
        m = self.by_name[d.model]
        # The worker starts the named model in an engine that serves nothing yet: a
        # full start of it, from wherever it would read the weights.
        build_s = m.costs.load_s(w.tier_for(m))
        w.keep_engine(d.engine_class, m, built=False, built_at=t + build_s)
        f.engine_changed(w)
        self.clock.after(w, build_s)

    def load_adapter(self, d: LoadAdapter, t: float) -> None:
        """Load an adapter into ``d.worker_id``'s engine of its base: a replica of the
        adapter once loaded, in the engine's slots."""
        f = self.fleet
        w = f.workers.get(d.worker_id)
        a = self.by_name[d.model]
        if w is None or w.state != "ready" or w.model is not a.base:
            # Released by a decision of the same tick: a draining engine takes no adapter
            # (the policy sees it gone on the next tick).
            return
        rec = w.adapters[a] = LoadedAdapter(a, w, t)
        a.serving += 1
        f.adapters_changed(w)
        self.clock.push(t + a.costs.adapter_load_s, ADAPTER, rec, rec.epoch)

    def unload_adapter(self, d: UnloadAdapter, t: float) -> None:
        """Unload an adapter: no new request goes to it; it goes once those in flight
        are answered, ``adapter_unload_s`` after."""
        f = self.fleet
        w = f.workers.get(d.worker_id)
        a = self.by_name[d.model]
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
            self.clock.push(t + a.costs.adapter_unload_s, ADAPTER, rec, rec.epoch)
        f.adapters_changed(w)
