"""One leader among controllers sharing a state database: the lease rule (pure), the
lease row on both backends, and the election as a controller runs it (an injected
monotonic clock for its own count, the database's clock for the lease)."""

from __future__ import annotations

import pytest

from tests.waiting import until
from tests.warm_pool.conftest import StateDb
from warm_pool.db import Db
from warm_pool.leader import Leadership, Lease, LeaseStore, claim
from warm_pool.persist import ControllerStore

# -- the rule --------------------------------------------------------------------------


def test_a_free_lease_is_taken_with_term_one() -> None:
    assert claim(None, "a", "http://a", 100.0, 3.0) == Lease("a", "http://a", 1, 103.0)


def test_the_holder_renews_in_the_same_term() -> None:
    held = Lease("a", "http://a", 4, 103.0)
    assert claim(held, "a", "http://a", 102.0, 3.0) == Lease("a", "http://a", 4, 105.0)


def test_nobody_else_takes_a_lease_before_it_expires() -> None:
    held = Lease("a", "http://a", 4, 103.0)
    assert claim(held, "b", "http://b", 102.999, 3.0) is None


def test_an_expired_lease_goes_to_whoever_asks_with_the_next_term() -> None:
    held = Lease("a", "http://a", 4, 103.0)
    assert claim(held, "b", "http://b", 103.0, 3.0) == Lease("b", "http://b", 5, 106.0)
    # The holder itself, once it let the lease lapse, starts a new term too: what it
    # decided in the old one is over.
    assert claim(held, "a", "http://a", 104.0, 3.0) == Lease("a", "http://a", 5, 107.0)


# -- the row ---------------------------------------------------------------------------


def test_the_lease_row_on_both_backends(state_db: StateDb) -> None:
    db = state_db()
    ControllerStore(db)  # its migrations make the table
    a, b = LeaseStore(db), LeaseStore(state_db())
    lease, mine = a.claim("a", "http://a", 30.0)
    assert mine and lease is not None and (lease.holder, lease.term) == ("a", 1)
    held, mine = b.claim("b", "http://b", 30.0)
    assert not mine and held == lease
    again, mine = a.claim("a", "http://a", 30.0)
    assert mine and again is not None and again.term == 1 and again.expires_at >= lease.expires_at
    a.release("a")
    taken, mine = b.claim("b", "http://b", 30.0)
    assert mine and taken is not None and (taken.holder, taken.url, taken.term) == ("b", "http://b", 2)
    assert a.current() == taken


def test_the_lease_uses_the_database_clock(postgres_url: str) -> None:
    # (PostgreSQL only: SQLite is one machine, whose clock is the process's.)
    db = Db.postgres(postgres_url)
    ControllerStore(db)
    lease, _ = LeaseStore(db).claim("a", "http://a", 10.0)
    with db.read() as tx:
        row = tx.one("SELECT EXTRACT(EPOCH FROM clock_timestamp())")
    assert row is not None and lease is not None
    assert 0 < lease.expires_at - float(row[0]) <= 10.0


# -- the election ----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def candidate(db_of: StateDb, me: str, clock: Clock, log: list[str], lease_s: float) -> Leadership:
    async def on_lead(term: int) -> None:
        log.append(f"{me} leads {term}")

    async def on_follow() -> None:
        log.append(f"{me} follows")

    return Leadership(LeaseStore(db_of()), me, f"http://{me}", lease_s, on_lead=on_lead, on_follow=on_follow,
                      clock=clock)


async def test_one_leads_the_other_follows_and_takes_over_when_the_leader_stops(state_db: StateDb) -> None:
    ControllerStore(state_db())
    clock, log = Clock(), []
    a = candidate(state_db, "a", clock, log, lease_s=0.5)
    b = candidate(state_db, "b", clock, log, lease_s=0.5)
    await a.step()
    await b.step()
    assert a.leading and not b.leading
    assert b.leader_url == "http://a" and a.leader_url == "http://a"
    assert log == ["a leads 1"]
    # a renews while it lives; b keeps following.
    await a.step()
    await b.step()
    assert log == ["a leads 1"]
    # a stops renewing (it died): once the lease expires by the database's clock, b
    # takes it with the next term.
    async def b_leads() -> bool:
        await b.step()
        return b.leading

    await until("b to take the lease", b_leads, 10, interval_s=0.05)
    assert b.term == 2 and log == ["a leads 1", "b leads 2"]
    # a comes back: by its own count its lease ran out long ago (it stopped acting), and
    # the lease is b's: it follows.
    clock.t += 10
    assert not a.leading
    await a.step()
    assert not a.leading and a.leader_url == "http://b" and log[-1] == "a follows"


async def test_a_leader_stops_acting_when_its_own_count_runs_out(state_db: StateDb) -> None:
    ControllerStore(state_db())
    clock, log = Clock(), []
    a = candidate(state_db, "a", clock, log, lease_s=30.0)
    await a.step()
    assert a.leading
    # No renewal came back in time (a stall): it stops at once by its own clock, before
    # the database's expiry, without waiting for an answer.
    clock.t += 30.0 * 0.9
    assert not a.leading
    # The renewal that finally comes back finds the lease still its own but lapsed by
    # its count: it leads again, as a new leader (it adopts the fleet afresh).
    await a.step()
    assert a.leading and log == ["a leads 1", "a follows", "a leads 1"]


async def test_a_clean_shutdown_hands_the_lease_on_at_once(state_db: StateDb) -> None:
    ControllerStore(state_db())
    clock, log = Clock(), []
    a = candidate(state_db, "a", clock, log, lease_s=60.0)
    b = candidate(state_db, "b", clock, log, lease_s=60.0)
    await a.step()
    await a.close()
    await b.step()
    assert b.leading and b.term == 2


async def test_a_takeover_that_fails_midway_is_tried_again(state_db: StateDb) -> None:
    ControllerStore(state_db())
    clock, log, fail = Clock(), [], [False, True]  # popped from the end: fails once

    async def on_lead(term: int) -> None:
        if fail.pop():
            raise RuntimeError("the database went away while the registry was read")
        log.append(f"leads {term}")

    async def on_follow() -> None:
        log.append("follows")

    a = Leadership(LeaseStore(state_db()), "a", "http://a", 30.0, on_lead=on_lead, on_follow=on_follow, clock=clock)
    with pytest.raises(RuntimeError):
        await a.step()
    assert not a.leading and a.term is None
    await a.step()  # still its lease: it takes over now
    assert a.leading and log == ["leads 1"]
