"""The tenants the controller serves, created, changed and removed at run time
(``thaw tenants create|rm|ls``, ``thaw tenants limits set``, ``thaw tenants models set``;
``/v1/admin/tenants``). Their rows live beside the models' (``warm_pool.registry.store``)
and a change moves the same catalog version, so activators take it within a second.

A new cluster's tenants are the config file's, imported once. Keys stay in the key
table (``warm_pool.registry.keys``): ``thaw tenants keys add`` gives a tenant one. Removing a tenant
revokes its keys and is refused while it owns private models.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Awaitable, Callable
from typing import Any

from thaw.config import ConfigError, RateLimits, Tenant
from thaw.wire import TenantChange, TenantCreate, TenantRecord, TenantRecords
from warm_pool.events import EventLog
from warm_pool.registry.models import ModelRegistry, RegistryRefused
from warm_pool.registry.store import TenantConflict, TenantRow


def record_of(row: TenantRow) -> TenantRecord:
    t = row.tenant
    return TenantRecord(name=t.name, allowed_models=t.allowed_models, limits=t.limits,
                        config_key_hashes=list(t.api_key_hashes), changed_at=row.changed_at, who=row.who,
                        removed_at=row.removed_at)


class TenantAdmin:
    def __init__(self, registry: ModelRegistry, events: EventLog, *, clock: Callable[[], float],
                 on_removed: Callable[[str, str], Awaitable[int]]) -> None:
        """``on_removed(tenant, who)``: revokes a removed tenant's keys (how many)."""
        self.registry = registry
        self.store = registry.store
        self.events = events
        self._clock = clock
        self._on_removed = on_removed

    async def list(self) -> TenantRecords:
        rows = await asyncio.to_thread(self.store.tenants)
        return TenantRecords(version=self.registry.version, tenants=[record_of(r) for r in rows])

    async def _record(self, name: str) -> TenantRecord:
        """The stored row of tenant ``name`` (read in a thread: the database may be remote)."""
        rows = await asyncio.to_thread(self.store.tenants)
        return next(record_of(r) for r in rows if r.tenant.name == name)

    def _tenant(self, name: str) -> Tenant:
        tenant = next((t for t in self._in_force() if t.name == name), None)
        if tenant is None:
            raise RegistryRefused(f"no tenant {name!r} (`thaw tenants ls` lists them)", 404)
        return tenant

    def _in_force(self) -> builtins.list[Tenant]:
        """The tenants in force, as the registry holds them (no read of the database)."""
        return list(self.registry.base.tenants)

    async def create(self, body: TenantCreate, who: str) -> TenantRecord:
        tenant = Tenant(name=body.name, allowed_models=list(body.allowed_models), limits=body.limits)
        async with self.registry.lock:
            if any(t.name == body.name for t in self._in_force()):
                raise RegistryRefused(f"tenant {body.name!r} exists: change it with `thaw tenants limits set` "
                                      "or `thaw tenants models set`", 409)
            return await self._commit([*self._in_force(), tenant], tenant, who, new=True, outcome="created")

    async def change(self, name: str, body: TenantChange, who: str) -> TenantRecord:
        async with self.registry.lock:
            old = self._tenant(name)
            update: dict[str, object] = {}
            if body.allowed_models is not None:
                update["allowed_models"] = list(body.allowed_models)
            if body.limits is not None:
                # 0 lifts a limit.
                limits: dict[str, Any] = {**old.limits.model_dump(),
                                          **{k: v or None for k, v in body.limits.items()}}
                update["limits"] = RateLimits.model_validate(limits)
            if not update:
                raise RegistryRefused("nothing to change: give allowed_models or limits")
            tenant = old.model_copy(update=update)
            if tenant == old:
                raise RegistryRefused(f"tenant {name!r} already has these settings")
            tenants = [tenant if t.name == name else t for t in self._in_force()]
            return await self._commit(tenants, tenant, who, new=False, outcome="changed")

    async def remove(self, name: str, who: str) -> TenantRecord:
        async with self.registry.lock:
            self._tenant(name)
            owned = sorted(m.name for m in self.registry.cfg.models if m.tenant == name)
            if owned:
                raise RegistryRefused(f"tenant {name!r} owns models {owned}: remove them first", 409)
            tenants = [t for t in self._in_force() if t.name != name]
            try:
                cfg = self.registry.with_tenants(tenants)
            except ConfigError as exc:
                raise RegistryRefused(f"removing {name!r} leaves the config invalid: "
                                      + "; ".join(exc.problems), 409) from None
            try:
                version = await asyncio.to_thread(self.store.remove_tenant, name, self._clock(), who)
            except TenantConflict as exc:
                raise RegistryRefused(str(exc), 404) from None
            await self.registry.tenants_changed(tenants, cfg, version)
            revoked = await self._on_removed(name, who)
            self.events.record("tenant", "operator", outcome="removed",
                               inputs={"who": who, "tenant": name, "keys_revoked": revoked})
            return await self._record(name)

    async def revoke_keys(self, name: str, who: str) -> int:
        """Revoke a removed tenant's keys (``thaw apply`` removed it)."""
        revoked = await self._on_removed(name, who)
        self.events.record("tenant", "operator", outcome="removed",
                           inputs={"who": who, "tenant": name, "keys_revoked": revoked})
        return revoked

    async def _commit(self, tenants: builtins.list[Tenant], tenant: Tenant, who: str, *, new: bool,
                      outcome: str) -> TenantRecord:
        names = {m.name for m in self.registry.cfg.models}
        unknown = [a for a in tenant.allowed_models if a != "*" and a not in names]
        if unknown:
            raise RegistryRefused(f"allowed_models: no models {unknown} are deployed (`thaw models ls`)")
        try:
            cfg = self.registry.with_tenants(tenants)
        except ConfigError as exc:
            raise RegistryRefused("; ".join(exc.problems)) from None
        try:
            version = await asyncio.to_thread(self.store.put_tenant, tenant, self._clock(), who, new=new)
        except TenantConflict as exc:
            raise RegistryRefused(str(exc), 409 if exc.exists else 404) from None
        await self.registry.tenants_changed(tenants, cfg, version)
        self.events.record("tenant", "operator", outcome=outcome,
                           inputs={"who": who, "tenant": tenant.name, "allowed_models": tenant.allowed_models,
                                   "limits": tenant.limits.model_dump(exclude_none=True)})
        return await self._record(tenant.name)
