"""The ``static`` provider: workers started outside Thaw (by hand, by systemd, by another
scheduler) on hosts it does not own. Each registers itself with its first heartbeat,
as a local pool admits a worker no provider launched; the controller assigns,
releases and fences them like any other, but launches, stops, starts and terminates
nothing: a pool of this provider has the workers that registered, and no more.
"""

from __future__ import annotations

from warm_pool.providers.provider import CapacityError, Instance


class StaticProvider:
    kind = "static"

    async def launch(self, shape: str, worker_id: str, *, term: int | None = None) -> Instance:
        raise CapacityError(shape, f"pool {shape!r} is static: its workers register themselves, "
                                   "and every one that has is in use")

    async def instances(self) -> list[Instance]:
        return []  # none launched: every worker is known by its heartbeats alone

    async def terminate(self, instance_id: str) -> None:
        return None  # not this controller's to end: the worker is forgotten when silent

    async def stop(self, instance_id: str) -> None:
        raise CapacityError("", "a static pool's hosts are not stopped or started by Thaw")

    async def start(self, instance_id: str) -> None:
        raise CapacityError("", "a static pool's hosts are not stopped or started by Thaw")

    async def close(self) -> None:
        return None
