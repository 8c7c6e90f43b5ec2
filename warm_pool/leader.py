"""One leader among several controllers: a lease row in the state database.

Several ``thaw controller`` processes may share one PostgreSQL. The one holding the
lease leads: it decides, launches, assigns and publishes routes. The others follow: they
answer every call with where the leader is (``thaw.controllers``) and try to take the
lease every ``lease_s / 6``.

The lease is a row (holder, its URL, a term, an expiry) changed only in a write
transaction, and its times are the database's clock, so controllers on machines whose
clocks disagree still agree on when it expired. A leader renews it every ``lease_s / 6``;
a follower takes it once its expiry has passed, with the next term. A leader counts its
own lease from before it asked (its monotonic clock), so it stops acting before the
database lets anyone else take over: if a renewal has not come back by then (the
database is away, the process stalled), it stops deciding at once and follows.

The term is the fencing token: every decision event names the term it was taken in, and
a term is held by one controller only. Each term is written down as it begins
(``controller_terms``), and the rest of the fencing rule is in ``warm_pool.fencing``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from thaw.log import get_logger
from warm_pool.db import Db, StateUnavailable
from warm_pool.fencing import LEASE, Lease, db_now, lease_row

log = get_logger()
# A leader's own count of its lease ends this much before the database's.
SAFETY = 0.1


def claim(current: Lease | None, me: str, url: str, now: float, lease_s: float) -> Lease | None:
    """The lease once ``me`` asks for it at ``now`` (the database's clock): renewed when
    ``me`` holds it and it has not expired, taken with the next term when it is free or
    expired, None while another holds it. Pure."""
    if current is None:
        return Lease(me, url, 1, now + lease_s)
    if current.expires_at > now:
        if current.holder != me:
            return None
        return Lease(me, url, current.term, now + lease_s)
    # Expired, whoever held it: a holder that let it lapse has stopped acting, so taking
    # it again starts a new term.
    return Lease(me, url, current.term + 1, now + lease_s)


class LeaseStore:
    """The lease row (blocking: called in threads)."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def claim(self, me: str, url: str, lease_s: float) -> tuple[Lease | None, bool]:
        """Ask for the lease: (the lease as it stands now, whether ``me`` holds it)."""
        with self.db.write(fenced=False) as tx:
            current = lease_row(tx)
            now = db_now(tx)
            lease = claim(current, me, url, now, lease_s)
            if lease is None:
                return current, False
            if current is None or lease.term != current.term:
                tx.execute("INSERT INTO controller_terms (term, holder, url, began_at) VALUES (?, ?, ?, ?) "
                           "ON CONFLICT (term) DO NOTHING", (lease.term, me, url, now))
            tx.execute("INSERT INTO controller_lease (name, holder, url, term, expires_at) VALUES (?, ?, ?, ?, ?) "
                       "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, url = excluded.url, "
                       "term = excluded.term, expires_at = excluded.expires_at",
                       (LEASE, lease.holder, lease.url, lease.term, lease.expires_at))
            return lease, True

    def release(self, me: str) -> None:
        """Give the lease up now (a clean shutdown): a follower takes it at once."""
        with self.db.write(fenced=False) as tx:
            tx.execute("UPDATE controller_lease SET expires_at = 0 WHERE name = ? AND holder = ?", (LEASE, me))

    def current(self) -> Lease | None:
        with self.db.read() as tx:
            return lease_row(tx)


class Leadership:
    """This controller's part in the election: it leads (``leading``) or follows
    (``leader``: the lease as last read, naming where the leader is).

    ``on_lead(term)`` runs when it takes the lease; ``on_follow()`` when it loses it.
    """

    def __init__(self, store: LeaseStore, me: str, url: str, lease_s: float, *,
                 on_lead: Callable[[int], Awaitable[None]], on_follow: Callable[[], Awaitable[None]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.me = me
        self.url = url
        self.lease_s = lease_s
        self.interval_s = lease_s / 6
        self._on_lead = on_lead
        self._on_follow = on_follow
        self.clock = clock
        self.leader: Lease | None = None
        self.term: int | None = None  # while leading
        self._valid_until = 0.0
        self._task: asyncio.Task[None] | None = None

    @property
    def leading(self) -> bool:
        """It holds the lease by its own count (the moment that ends, it acts no more)."""
        return self.term is not None and self.clock() < self._valid_until

    def lease_until(self) -> float:
        """When its lease ends by its own count, in epoch seconds (what its control calls
        say: a worker refuses one that arrives later). In the past when it does not lead."""
        if self.term is None:
            return time.time() - 1.0
        return time.time() + (self._valid_until - self.clock())

    @property
    def leader_url(self) -> str | None:
        """Where the leader is, as last read (None: nobody leads)."""
        if self.leading:
            return self.url
        return self.leader.url if self.leader is not None else None

    async def start(self) -> None:
        """Ask once now (a controller that finds the lease free leads before it serves),
        then keep asking (a first ask that failed is asked again, as any other)."""
        try:
            await self.step()
        except Exception:
            log.exception("leadership_step_failed")
        self._task = asyncio.create_task(self._run(), name="leadership")

    async def step(self) -> None:
        """Ask for the lease once (renew it, or take it if free), and act on the answer."""
        asked_at = self.clock()
        try:
            lease, mine = await asyncio.to_thread(self.store.claim, self.me, self.url, self.lease_s)
        except StateUnavailable as exc:
            log.warning("lease_unavailable", error=str(exc), leading=self.leading)
            if self.term is not None and not self.leading:
                await self._lose("the state database did not answer before the lease ran out")
            return
        self.leader = lease
        if mine:
            assert lease is not None
            if self.term is not None and (lease.term != self.term or asked_at >= self._valid_until):
                # It lapsed by this controller's count (a stall) even if nobody took it:
                # what it decided is over; it starts again as a new leader.
                await self._lose("the lease lapsed before it was renewed")
            self._valid_until = asked_at + self.lease_s * (1 - SAFETY)
            if self.term is None:
                self.term = lease.term
                log.info("leader_elected", controller=self.me, term=lease.term, url=self.url)
                try:
                    await self._on_lead(lease.term)
                except BaseException:
                    # It could not take over (the database went away mid-way): it does not
                    # lead, and the next step, still holding the lease, tries again.
                    self.term = None
                    raise
        elif self.term is not None:
            await self._lose(f"{lease.holder if lease else 'another controller'} holds the lease")

    async def _lose(self, why: str) -> None:
        log.warning("leadership_lost", controller=self.me, term=self.term, reason=why)
        self.term = None
        self._valid_until = 0.0
        await self._on_follow()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("leadership_step_failed")

    async def close(self, *, release: bool = True) -> None:
        """Stop asking; a leader gives the lease up so a follower takes over at once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if release and self.term is not None:
            self.term = None
            with contextlib.suppress(StateUnavailable):
                await asyncio.to_thread(self.store.release, self.me)
