"""Fencing: nothing a deposed controller does takes effect.

Several controllers share one PostgreSQL and one of them leads (``warm_pool.leader``).
A leader that has lost its lease without noticing yet (cut off from the database, or
paused for longer than the lease) may still be running, and may still act. The rule:
every action that changes the world carries the term it was decided in, and whoever
carries it out refuses a term older than the newest it knows of.

- **The state database** (registry, tenants, keys, budgets, batch leases, stored
  responses and their purge): every write transaction checks first, under the write
  lock, that the lease row names this controller with its term and has not expired by
  the database's clock (:class:`LeaseFence`, installed as ``Db.fence``). A deposed
  controller's change raises :class:`Deposed` and changes nothing; its API answers as a
  follower does, with where the leader is.
- **The providers** (launch, stop, start, terminate): the action is written to
  ``controller_actions`` under its term, fenced as above, before the provider is called
  (:class:`ActionLog`); a refused write means no call. The term also goes to the
  provider (EC2: the ``thaw:term`` tag and the launch's idempotency token).
- **The workers** (assign, pack, release, sleep, prebuild, adapters): each control call
  carries its term and when its sender's lease ends by its own count, and a worker
  refuses one older than it has heard of, or one arriving after that (``worker.fence``).

What stays open: a controller that passes the check and then stalls before its
provider call makes that call late. The lease bounds this only as far as the call
follows the check at once; the action row names its term and time, so the new leader
(which adopts instances by their tags) and a history checker see it.

Not fenced: the decision log (``controller_events``) and the ends of actions, which
record what happened, a deposed controller's acts included.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from warm_pool.db import Db, StateUnavailable, Tx

LEASE = "controller"
# Provider actions older than this are deleted as new ones are written (as the decision
# log's events are).
ACTIONS_RETAINED_S = 30 * 86400.0


class Deposed(StateUnavailable):
    """This controller does not hold the lease with the term it acts in (another took
    it, or it ran out): nothing was changed. ``leader_url``: where the leader is, when
    the lease names one."""

    def __init__(self, message: str, leader_url: str | None = None) -> None:
        super().__init__(message)
        self.leader_url = leader_url


@dataclass(frozen=True)
class Lease:
    holder: str
    url: str
    term: int
    expires_at: float  # the database's clock


def lease_row(tx: Tx) -> Lease | None:
    """The lease as the database holds it now (None: never claimed)."""
    row = tx.one("SELECT holder, url, term, expires_at FROM controller_lease WHERE name = ?", (LEASE,))
    return Lease(str(row[0]), str(row[1]), int(row[2]), float(row[3])) if row else None


def db_now(tx: Tx) -> float:
    """The database's clock (PostgreSQL: the same for every controller), in epoch seconds."""
    if tx.dialect == "postgres":
        row = tx.one("SELECT EXTRACT(EPOCH FROM clock_timestamp())")
        assert row is not None
        return float(row[0])
    return time.time()  # SQLite: one machine, one clock


class LeaseFence:
    """The check a fenced write runs inside its transaction (``Db.fence``): the lease row
    names ``me`` with the term it acts in, and has not expired by the database's clock.
    ``term()``: the term this controller leads in now (None: it does not lead)."""

    def __init__(self, me: str, term: Callable[[], int | None]) -> None:
        self.me = me
        self._term = term

    def check(self, tx: Tx, term: int | None = None) -> None:
        """Raise :class:`Deposed` unless ``me`` holds the lease in ``term`` (None: the
        term it leads in now)."""
        term = self._term() if term is None else term
        lease = lease_row(tx)
        if term is None:
            raise Deposed("this controller does not lead", lease.url if lease else None)
        if lease is None or lease.holder != self.me or lease.term != term:
            raise Deposed(f"term {term} is over: " + (f"{lease.holder} leads in term {lease.term}" if lease
                                                      else "no lease"),
                          lease.url if lease and lease.holder != self.me else None)
        if lease.expires_at <= db_now(tx):
            raise Deposed(f"term {term}'s lease ran out before it was renewed")


@dataclass(frozen=True)
class Action:
    """One provider action as written before the call (``outcome`` None: it never ended,
    e.g. the controller died during the call)."""

    id: str
    controller: str
    term: int | None
    at: float  # the database's clock
    kind: str  # launch | stop | start | terminate
    worker_id: str | None
    instance_id: str | None
    shape: str | None
    outcome: str | None  # done | failed: <why>
    ended_at: float | None


@dataclass(frozen=True)
class Term:
    term: int
    holder: str
    url: str
    began_at: float  # the database's clock


class ActionLog:
    """The provider actions, each written under its term before the provider is called
    (blocking: called in threads). ``fence``: None where one controller leads alone."""

    def __init__(self, db: Db, controller: str, fence: LeaseFence | None) -> None:
        self.db = db
        self.controller = controller
        self.fence = fence
        self._pruned_at = 0.0

    def begin(self, term: int | None, kind: str, *, worker_id: str | None = None,
              instance_id: str | None = None, shape: str | None = None) -> str:
        """Write the action (its id), refused with :class:`Deposed` unless ``term``
        still leads: the caller makes the provider call only after this returned."""
        action_id = uuid.uuid4().hex
        with self.db.write(fenced=False) as tx:
            if self.fence is not None:
                self.fence.check(tx, term)
            now = db_now(tx)
            tx.execute("INSERT INTO controller_actions (id, controller, term, at, kind, worker_id, instance_id, "
                       "shape) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (action_id, self.controller, term, now, kind, worker_id, instance_id, shape))
            if now - self._pruned_at > 3600:
                tx.execute("DELETE FROM controller_actions WHERE at < ?", (now - ACTIONS_RETAINED_S,))
                self._pruned_at = now
        return action_id

    def end(self, action_id: str, outcome: str, instance_id: str | None = None) -> None:
        """How the provider call ended, and a launch's instance (history: not fenced)."""
        with self.db.write(fenced=False) as tx:
            tx.execute("UPDATE controller_actions SET outcome = ?, ended_at = ?, "
                       "instance_id = COALESCE(?, instance_id) WHERE id = ?",
                       (outcome, db_now(tx), instance_id, action_id))

    def actions(self, since: float = 0.0) -> list[Action]:
        with self.db.read() as tx:
            rows = tx.query("SELECT id, controller, term, at, kind, worker_id, instance_id, shape, outcome, ended_at "
                            "FROM controller_actions WHERE at >= ? ORDER BY at", (since,))
        return [Action(str(r[0]), str(r[1]), None if r[2] is None else int(r[2]), float(r[3]), str(r[4]),
                       r[5], r[6], r[7], r[8], None if r[9] is None else float(r[9])) for r in rows]

    def terms(self) -> list[Term]:
        """Every term of leading, oldest first (``warm_pool.leader`` writes each as it
        begins)."""
        with self.db.read() as tx:
            rows = tx.query("SELECT term, holder, url, began_at FROM controller_terms ORDER BY term")
        return [Term(int(r[0]), str(r[1]), str(r[2]), float(r[3])) for r in rows]
