"""What the providers say of their instances (exits, stops, instances gone), taken in as
facts: listed at start, then every ``refresh_interval_s``."""

from __future__ import annotations

from collections.abc import Callable

from thaw.log import get_logger
from warm_pool.fleet.facts import FleetFacts
from warm_pool.providers.provider import Instance, Provider

log = get_logger()


class InstanceWatch:
    def __init__(self, providers: dict[str, Provider], fleet: FleetFacts, *, clock: Callable[[], float],
                 refresh_interval_s: float | None = None) -> None:
        """``providers`` maps each pool's shape to the provider that runs it."""
        self.providers = providers
        self.fleet = fleet
        self.clock = clock
        # How often the providers are asked what exists: a local process list is cheap; a
        # DescribeInstances per second would spend the account's EC2 API budget.
        if refresh_interval_s is None:
            refresh_interval_s = 1.0 if all(p.kind in ("local", "static") for p in providers.values()) else 10.0
        self.refresh_interval_s = refresh_interval_s
        self._refreshed_at = 0.0

    def unique(self) -> list[Provider]:
        """Each provider once (one may run several pools)."""
        out: list[Provider] = []
        for p in self.providers.values():
            if all(p is not q for q in out):
                out.append(p)
        return out

    async def list_instances(self) -> list[Instance]:
        """Every provider's instances (a provider that fails to answer is logged, skipped)."""
        found: list[Instance] = []
        for p in self.unique():
            try:
                found.extend(await p.instances())
            except Exception:
                log.exception("provider_list_failed", provider=p.kind)
        return found

    def refresh_soon(self) -> None:
        """Ask the providers again on the next :meth:`refresh`."""
        self._refreshed_at = 0.0

    async def refresh(self) -> None:
        """What the providers say of the machines, when ``refresh_interval_s`` has passed."""
        now = self.clock()
        if now - self._refreshed_at < self.refresh_interval_s:
            return
        self._refreshed_at = now
        listed = {i.worker_id: i for i in await self.list_instances()}
        fleet = self.fleet
        for wid, f in list(fleet.facts.items()):
            inst = listed.get(wid)
            if inst is not None:
                if inst != f.instance:
                    fleet.observe(wid, f.shape, instance=inst)
            elif f.instance is not None and f.launch_requested_at is None and wid not in fleet.busy:
                # The provider no longer has it (terminated outside Thaw).
                log.warning("instance_vanished", worker_id=wid, instance_id=f.instance.instance_id)
                fleet.forget(wid)

    async def close(self) -> None:
        for p in self.unique():
            await p.close()
