"""What operators change at run time through the controller: pool budgets (kept in the
state database, so a restart and the next leader keep them) and API keys
(``warm_pool.registry.keys``). Each change is recorded as an event naming who asked."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from thaw.config import Tenant, ThawConfig
from thaw.log import get_logger
from thaw.wire import (
    AdminKey,
    AdminKeys,
    BudgetChange,
    BudgetView,
    KeyTable,
    NewAdminKeyReply,
    NewKeyReply,
    RevokeReply,
)
from warm_pool.db import Db
from warm_pool.events import EventLog
from warm_pool.persist import (
    BudgetRefused,
    ControllerStore,
    apply_budget,
    budget_view,
    merge_budget_change,
)
from warm_pool.registry.keys import KEYS_FILE, KeyStore

log = get_logger()


class UnknownTenant(LookupError):
    """A key for a tenant that does not exist (404)."""


class UnknownKey(LookupError):
    """A revocation that matches no active key (404)."""


class BudgetAdmin:
    """The config in force (``cfg``): the config as written (``base_cfg``) with the
    operators' run-time budget changes (``overrides``) applied."""

    def __init__(self, cfg: ThawConfig, store: ControllerStore, events: EventLog, wake: Callable[[], None]) -> None:
        """``wake``: asks the loop to decide now (a budget changed)."""
        self.base_cfg = cfg
        self.cfg = cfg
        self.store = store
        self.events = events
        self._wake = wake
        self.overrides: dict[str, Any] = {}
        self._take(store.load_budget())

    def _take(self, overrides: dict[str, Any]) -> None:
        try:
            self.cfg, self.overrides = apply_budget(self.base_cfg, overrides), overrides
        except BudgetRefused as exc:  # e.g. the config file changed under them
            log.warning("budget_overrides_dropped", error=str(exc))
            self.cfg, self.overrides = self.base_cfg, {}

    async def reload(self) -> None:
        """Take the budgets in the state database again (another controller led)."""
        self._take(await asyncio.to_thread(self.store.load_budget))
        self._wake()

    def view(self) -> BudgetView:
        return budget_view(self.cfg, self.overrides)

    def rebase(self, cfg: ThawConfig) -> None:
        """The config the budgets apply to changed (the registry's models)."""
        self.base_cfg = cfg
        self.cfg = apply_budget(cfg, self.overrides)

    async def change(self, change: BudgetChange, who: str) -> BudgetView:
        """Apply an operator's budget change: validated, persisted, in force from the next
        tick, and recorded as an event naming who asked."""
        overrides = merge_budget_change(self.overrides, change, self.base_cfg)
        cfg = apply_budget(self.base_cfg, overrides)
        before = self.view()
        await asyncio.to_thread(self.store.save_budget, overrides)
        self.cfg, self.overrides = cfg, overrides
        after = self.view()
        self.events.record("budget", "operator", shape=change.shape, outcome="done",
                           inputs={"who": who, "change": change.model_dump(exclude_none=True),
                                   "before": before.model_dump(), "after": after.model_dump()})
        self._wake()
        return after


class KeyAdmin:
    """The API key table (``keys``) and its version, which the route table carries."""

    def __init__(self, cfg: ThawConfig, state_dir: Path | None, events: EventLog,
                 on_change: Callable[[], Awaitable[None]], tenants: Callable[[], list[Tenant]],
                 db: Db | None = None) -> None:
        """``cfg``: the config as written; ``tenants``: the tenants in force (their keys
        from the config file too); ``on_change``: called after each change of the table
        (to publish its new version); ``db``: the shared state database (PostgreSQL)."""
        self.cfg = cfg
        self._tenants = tenants
        self.events = events
        self._on_change = on_change
        # PostgreSQL (``db``), else a SQLite file of its own in the state directory.
        self.keys = KeyStore(db if db is not None else state_dir / KEYS_FILE if state_dir is not None else None)
        if state_dir is not None:
            # An older Thaw kept run-time keys beside its one ledger: take them in once.
            legacy = cfg.data_dir / "usage.db"
            if (n := self.keys.import_legacy(legacy)):
                log.info("keys_imported", count=n, source=str(legacy))
        self.version = self.keys.version
        # Active admin keys by hash (checked on every /v1/admin/ call, so held here).
        self.admins = self._active(self.keys.admin_keys())

    @staticmethod
    def _active(rows: list[AdminKey]) -> dict[str, AdminKey]:
        return {r.hash: r for r in rows if r.revoked_at is None}

    def admin(self, authorization: bytes) -> AdminKey | None:
        """The active admin key an ``Authorization: Bearer`` header carries, if any."""
        if not authorization.startswith(b"Bearer "):
            return None
        return self.admins.get(hashlib.sha256(authorization[7:].strip()).hexdigest())

    async def add_admin(self, label: str | None, who: str) -> NewAdminKeyReply:
        key, row = await asyncio.to_thread(self.keys.add_admin, label)
        self.admins[row.hash] = row
        self.events.record("admin_key", "operator", outcome="added",
                           inputs={"who": who, "prefix": row.prefix, "label": label})
        return NewAdminKeyReply(key=key, row=row)

    async def revoke_admin(self, key: str, who: str) -> RevokeReply:
        n = await asyncio.to_thread(self.keys.revoke_admin, key)
        if n == 0:
            raise UnknownKey("no such active admin key (give the key, its sha256, or the prefix "
                             "`thaw admin-keys ls` shows)")
        self.admins = self._active(await asyncio.to_thread(self.keys.admin_keys))
        self.events.record("admin_key", "operator", outcome="revoked", inputs={"who": who, "count": n})
        return RevokeReply(revoked=n, version=self.version)

    async def admin_keys(self) -> AdminKeys:
        return AdminKeys(keys=await asyncio.to_thread(self.keys.admin_keys))

    async def add(self, tenant: str, label: str | None, who: str) -> NewKeyReply:
        """A new key for a tenant of the config; every activator takes it within a second."""
        tenants = sorted(t.name for t in self._tenants())
        if tenant not in tenants:
            raise UnknownTenant(f"no tenant {tenant!r} (create it with `thaw tenants create`); tenants: {tenants}")
        key, row = await asyncio.to_thread(self.keys.add, tenant, label)
        self.events.record("key", "operator", outcome="added",
                           inputs={"who": who, "tenant": tenant, "prefix": row.prefix, "label": label})
        await self._changed()
        return NewKeyReply(key=key, row=row)

    async def revoke(self, key: str, who: str) -> RevokeReply:
        """Revoke a key (the key, its hash, or its listed prefix), a config file's keys too."""
        config_keys = {h.removeprefix("sha256:"): t.name for t in self._tenants() for h in t.api_key_hashes}
        n = await asyncio.to_thread(self.keys.revoke, key, config_keys=config_keys)
        if n == 0:
            raise UnknownKey("no such active key (give the key, its sha256, or the prefix `thaw tenants ls` shows)")
        self.events.record("key", "operator", outcome="revoked", inputs={"who": who, "count": n})
        await self._changed()
        return RevokeReply(revoked=n, version=self.version)

    async def revoke_tenant(self, tenant: str, who: str) -> int:
        """Revoke every run-time key of a removed tenant (its config keys went with it)."""
        n = await asyncio.to_thread(self.keys.revoke_tenant, tenant)
        if n:
            self.events.record("key", "operator", outcome="revoked",
                               inputs={"who": who, "count": n, "tenant": tenant, "reason": "tenant removed"})
            await self._changed()
        return n

    async def refresh(self) -> None:
        """The table's version and the admin keys in the state database (another
        controller led)."""
        self.version = await asyncio.to_thread(lambda: self.keys.version)
        self.admins = self._active(await asyncio.to_thread(self.keys.admin_keys))

    async def table(self) -> KeyTable:
        return await asyncio.to_thread(self.keys.table)

    async def _changed(self) -> None:
        self.version = await asyncio.to_thread(lambda: self.keys.version)
        await self._on_change()
