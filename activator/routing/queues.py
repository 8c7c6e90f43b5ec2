"""The two lines a request for one model may wait in.

``ColdQueue``: the model has no usable replica; its requests wait in arrival order and
are all woken at once when one appears (each then picks its replica), or all failed at
once. ``FairQueue``: every replica is full; requests wait per tenant and are handed
freed slots round-robin across tenants, so one tenant's burst cannot starve another.

Bounds and deadlines are the caller's (``activator.routing.router``): these own only
their waiting futures.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from activator.routing.replicas import Replica


class ColdQueue:
    """Requests waiting for a model's first usable replica, in arrival order."""

    def __init__(self) -> None:
        self._waiters: deque[asyncio.Future[None]] = deque()

    def __len__(self) -> int:
        return len(self._waiters)

    async def wait(self, timeout_s: float) -> None:
        """Until ``release_all`` (or ``fail_all``: its exception); TimeoutError after
        ``timeout_s``. Leaves the queue either way."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(fut)

    def release_all(self) -> None:
        # In arrival order: each resumed waiter picks its replica in this order.
        self._settle(lambda fut: fut.set_result(None))

    def fail_all(self, exc: BaseException) -> None:
        self._settle(lambda fut: fut.set_exception(exc))

    def _settle(self, how: Callable[[asyncio.Future[None]], None]) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                how(fut)


class FairQueue:
    """Requests waiting for a slot on a model's full replicas, one line per tenant,
    served round-robin across tenants. Each waiter carries its prefix key, so the slot
    it is handed is on the replica its prefix prefers when that one has room."""

    def __init__(self) -> None:
        self._lines: dict[str, deque[tuple[asyncio.Future[Replica], str | None]]] = {}
        self._order: deque[str] = deque()

    def __len__(self) -> int:
        return sum(len(line) for line in self._lines.values())

    def join(self, tenant: str, key: str | None) -> asyncio.Future[Replica]:
        """A place at the back of ``tenant``'s line; the future is handed its slot."""
        fut: asyncio.Future[Replica] = asyncio.get_running_loop().create_future()
        self._lines.setdefault(tenant, deque()).append((fut, key))
        if tenant not in self._order:
            self._order.append(tenant)
        return fut

    def dispatch(self, reserve: Callable[[str | None], Replica | None]) -> None:
        """Hand slots to the waiting, a tenant at a time, while ``reserve`` (given the
        waiter's prefix key) finds one."""
        while self._order:
            tenant = self._order[0]
            line = self._lines.get(tenant)
            while line and line[0][0].done():
                line.popleft()  # timed out or cancelled
            if not line:
                self._order.popleft()
                self._lines.pop(tenant, None)
                continue
            rep = reserve(line[0][1])
            if rep is None:
                return  # still saturated
            fut, _ = line.popleft()
            # Round-robin: this tenant goes to the back of the line.
            self._order.rotate(-1)
            if not line:
                self._order.remove(tenant)
                self._lines.pop(tenant, None)
            fut.set_result(rep)

    def fail_all(self, exc: BaseException) -> None:
        for line in self._lines.values():
            for fut, _ in line:
                if not fut.done():
                    fut.set_exception(exc)
        self._lines.clear()
        self._order.clear()
