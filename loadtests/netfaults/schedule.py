"""The faults a run injects into a fleet across hosts (``loadtests.netfaults.fleet``),
each held for a while under load and then healed, and the run itself: start the load,
wait for the first answer, inject each fault in turn, wait for the fleet to be whole
again, then gather the history for the checker.

A fault is a name, what it does, how long it holds and how it heals. The short schedule
(:data:`SHORT`, the test's) covers the leader cut from PostgreSQL, the leader paused
for three leases and an activator cut from the controllers; the full one (:data:`FULL`,
``thaw bench netfaults``) adds the leader cut from the workers, a worker cut from the
controllers while it streams, a one-way partition, loss and delay spikes on the store's
link and a flapping link."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from loadtests.netfaults.checker import Fault, History
from loadtests.netfaults.client import Load
from loadtests.netfaults.fleet import COLD_MODEL, KEY, MODEL, FleetError, NetFleet, wait_for
from loadtests.netfaults.history import read_fencing, read_ledgers, read_worker_log

# The fleet is whole once every request sent over this long completed (and one leads).
WHOLE_FOR_S = 3.0
WHOLE_WITHIN_S = 60.0


@dataclass
class Ctx:
    """What a fault may add to the run: loads of its own (their requests are checked too)."""

    log: Path
    loads: list[Load] = field(default_factory=list)


@dataclass
class Step:
    """One fault: ``inject(fleet, ctx)`` returns how to heal it; it holds ``hold_s`` (a
    multiple of the lease when ``leases`` is set)."""

    name: str
    inject: Callable[[NetFleet, Ctx], Callable[[], None]]
    hold_s: float = 6.0
    leases: float | None = None

    def hold(self, fleet: NetFleet) -> float:
        return self.leases * fleet.opts.lease_s if self.leases is not None else self.hold_s


def _leader(fleet: NetFleet) -> str:
    leader = wait_for("a leader", fleet.leader, 30)
    assert isinstance(leader, str)
    return leader


def leader_cut_from_postgres(fleet: NetFleet, ctx: Ctx) -> Callable[[], None]:
    leader = _leader(fleet)
    fleet.net.cut(leader, "pg")
    return lambda: fleet.net.heal(leader, "pg")


def leader_paused(fleet: NetFleet, ctx: Ctx) -> Callable[[], None]:
    leader = _leader(fleet)
    fleet.pause(leader)
    return lambda: fleet.resume(leader)


def _heal(fleet: NetFleet, links: list[tuple[str, str]]) -> None:
    for a, b in links:
        fleet.net.heal(a, b)


def activator_cut_from_controllers(fleet: NetFleet, ctx: Ctx) -> Callable[[], None]:
    for c in ("c1", "c2"):
        fleet.net.cut("a1", c)
    return lambda: _heal(fleet, [("a1", c) for c in ("c1", "c2")])


def leader_cut_from_workers(fleet: NetFleet, ctx: Ctx) -> Callable[[], None]:
    leader = _leader(fleet)
    for w in fleet.workers:
        fleet.net.cut(leader, w)
    return lambda: _heal(fleet, [(leader, w) for w in fleet.workers])


def worker_cut_from_controllers(fleet: NetFleet, ctx: Ctx) -> Callable[[], None]:
    serving = [w["id"] for w in fleet.state()["workers"] if w["state"] == "ready"] or fleet.workers
    w = serving[0]
    for c in ("c1", "c2"):
        fleet.net.cut(w, c)
    return lambda: _heal(fleet, [(w, c) for c in ("c1", "c2")])


def leader_to_postgres_one_way(fleet: NetFleet, ctx: Ctx) -> Callable[[], None]:
    leader = _leader(fleet)
    fleet.net.cut(leader, "pg", one_way=True)  # what it sends is lost; what it is sent arrives
    return lambda: fleet.net.heal(leader, "pg")


def store_loss_and_delay(fleet: NetFleet, ctx: Ctx) -> Callable[[], None]:
    """5 % of what the store receives dropped, and 200 ms spikes on the workers' link to
    it, while a model at zero cold-starts (its own load: held requests until it serves)."""
    fleet.net.loss("store", 5)
    cold = Load({"a1": fleet.activator_url("a1")}, KEY, COLD_MODEL, ctx.log, pace_s=1.0)
    ctx.loads.append(cold.__enter__())
    stop = threading.Event()

    def spikes() -> None:
        while not stop.is_set():
            fleet.store_delay(0.2)
            stop.wait(1.0)
            fleet.store_delay(0.001)
            stop.wait(1.0)

    t = threading.Thread(target=spikes, daemon=True)
    t.start()

    def heal() -> None:
        stop.set()
        t.join()
        fleet.store_delay(0.0)
        fleet.net.loss("store", 0)
        cold.__exit__(None)  # its requests held for the cold start end first

    return heal


def flapping_link(fleet: NetFleet, ctx: Ctx) -> Callable[[], None]:
    stop = threading.Event()

    def flap() -> None:
        while not stop.is_set():
            fleet.net.cut("a2", "c1")
            fleet.net.cut("a2", "c2")
            stop.wait(1.0)
            fleet.net.heal("a2", "c1")
            fleet.net.heal("a2", "c2")
            stop.wait(1.0)

    t = threading.Thread(target=flap, daemon=True)
    t.start()

    def heal() -> None:
        stop.set()
        t.join()
        fleet.net.heal("a2", "c1")
        fleet.net.heal("a2", "c2")

    return heal


SHORT = [
    Step("leader cut from postgres", leader_cut_from_postgres, leases=3),
    Step("leader paused (SIGSTOP)", leader_paused, leases=3),
    Step("activator cut from ctrls", activator_cut_from_controllers, hold_s=6),
]
FULL = [
    *SHORT,
    Step("leader cut from workers", leader_cut_from_workers, hold_s=6),
    # Past the workers' timeout: the controller replaces it, and takes it back after.
    Step("worker cut from ctrls 16s", worker_cut_from_controllers, hold_s=16),
    Step("leader->postgres one way", leader_to_postgres_one_way, leases=3),
    Step("store 5% loss, 200ms spikes", store_loss_and_delay, hold_s=10),
    Step("flapping activator link", flapping_link, hold_s=8),
]


@dataclass
class Run:
    history: History
    end_at: float
    first_answer_s: float  # from the load's start to its first complete answer
    notes: list[str] = field(default_factory=list)


def whole(fleet: NetFleet, load: Load, since: float) -> bool:
    """Every request sent in the last ``WHOLE_FOR_S`` (after ``since``) completed, and a
    controller leads."""
    now = time.time()
    if now - since < WHOLE_FOR_S or fleet.leader() is None:
        return False
    recent = [s for s in load.since(now - WHOLE_FOR_S - 1.0) if s.sent_at >= since]
    return bool(recent) and all(s.outcome == "complete" for s in recent)


def run(fleet: NetFleet, steps: list[Step], log: Path, *, pace_s: float = 0.25) -> Run:
    """The load through both activators, each step in turn, then the history (read
    before the fleet stops: the state database is on its host)."""
    faults: list[Fault] = []
    notes: list[str] = []
    ctx = Ctx(log)
    t0 = time.time()
    with Load({a: fleet.activator_url(a) for a in ("a1", "a2")}, KEY, MODEL, log, pace_s=pace_s) as load:
        wait_for("the first answer", lambda: any(s.outcome == "complete" for s in load.sent), 300, 0.5)
        first = min(s.ended_at or 0.0 for s in load.sent if s.outcome == "complete") - t0
        wait_for("the fleet whole before the faults", lambda: whole(fleet, load, t0), WHOLE_WITHIN_S, 0.5)
        for step in steps:
            began = time.time()
            heal = step.inject(fleet, ctx)
            time.sleep(step.hold(fleet))  # the fault holds this long, under load
            heal()
            healed = time.time()
            faults.append(Fault(step.name, began, healed))
            try:
                wait_for(f"the fleet whole after {step.name}", partial(whole, fleet, load, healed), WHOLE_WITHIN_S, 0.5)
            except FleetError as exc:
                notes.append(str(exc))
            if gone := fleet.exited():
                raise FleetError(f"services exited during {step.name}: {gone}")
        end_at = time.time()
    terms, actions = read_fencing(fleet.state_url)
    instances = fleet.instances()
    sent = list(load.sent) + [x for extra in ctx.loads for x in extra.sent]
    return Run(History(sent=sent, ledger=read_ledgers([]), terms=terms, actions=actions, faults=faults,
                       instances=instances),
               end_at, first, notes)


def finish(fleet: NetFleet, r: Run) -> None:
    """After :meth:`NetFleet.close` (the activators' ledgers whole, the workers' logs
    written): the ledgers and the workers' records into ``r.history``."""
    r.history.ledger = read_ledgers(fleet.ledgers)
    for w, path in fleet.worker_logs().items():
        accepted, held = read_worker_log(path, w)
        r.history.accepted += accepted
        r.history.held += held
