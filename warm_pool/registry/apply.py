"""``thaw apply -f FILE`` (``POST /v1/admin/apply``): make the registry hold exactly the
models and tenants a file declares, all at once or not at all.

The plan is the difference between what is in force and the file: models to deploy,
update (their settings differ) or remove; tenants to create, change or remove. A section
the file leaves out is not touched. Every check a single change gets is made first, on
the whole result: the config stays valid with every change in it, every model deployed
or changed has complete weights in the store that fit its shape, tenants name deployed
models. Only then is the whole plan written, in one transaction. A dry run stops after
the checks and answers the plan.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Literal

from thaw.config import ConfigError, Model, Tenant, ThawConfig
from thaw.objstore import WeightsCheck
from thaw.wire import ApplyReply, ApplyRequest, ModelRevision, PlannedChange
from warm_pool.events import EventLog
from warm_pool.registry.in_force import current_spec, with_models
from warm_pool.registry.models import ModelRegistry, RegistryRefused, eager_on_cpu
from warm_pool.registry.store import Batch, StaleRevision, TenantConflict
from warm_pool.registry.tenants import TenantAdmin

# Store checks of one apply made at once (each a few round trips to the store, in a thread).
STORE_CHECKS = 16


def differences(now: dict[str, Any], then: dict[str, Any]) -> dict[str, list[Any]]:
    """field -> [now, then] for each top-level field that differs."""
    return {k: [now.get(k), then.get(k)] for k in sorted(set(now) | set(then)) if now.get(k) != then.get(k)}


def _resolved(m: Model) -> dict[str, Any]:
    return m.model_dump(mode="json", exclude={"demo_if_missing"})


class Applier:
    def __init__(self, registry: ModelRegistry, tenants: TenantAdmin, events: EventLog, *,
                 clock: Callable[[], float]) -> None:
        self.registry = registry
        self.tenants = tenants
        self.events = events
        self._clock = clock

    async def apply(self, req: ApplyRequest, who: str) -> ApplyReply:
        reg = self.registry
        async with reg.lock:
            now_cfg = reg.cfg
            in_force = {t.name: t for t in reg.base.tenants}
            tenants = list(in_force.values()) if req.tenants is None else list(req.tenants)
            if req.models is None:
                entries = [{"name": m.name, **spec} for m in now_cfg.models
                           if (spec := current_spec(reg.records[m.name])) is not None]
            else:
                # A model new to the registry on a CPU shape runs eager unless its entry says;
                # one in force keeps its mode (eager_on_cpu): applying a file twice changes nothing.
                entries = [eager_on_cpu(e.fields(), now_cfg,
                                        current_spec(r) if (r := reg.records.get(e.name)) else None)
                           for e in req.models]
                names = [e["name"] for e in entries]
                if len(set(names)) != len(names):
                    raise RegistryRefused(f"models: a name appears twice: {sorted({n for n in names if names.count(n) > 1})}")
            try:
                cfg = with_models(reg.written.model_copy(update={"tenants": tenants}), entries)
            except ConfigError as exc:
                raise RegistryRefused("; ".join(exc.problems)) from None
            deployed = {m.name for m in cfg.models}
            for t in tenants:
                unknown = [a for a in t.allowed_models if a != "*" and a not in deployed]
                if unknown:
                    raise RegistryRefused(f"tenants ({t.name}): allowed_models names models that would not be "
                                          f"deployed: {unknown}")

            changes: list[PlannedChange] = []
            batch = Batch(at=self._clock(), who=who)
            if req.models is not None:
                await self._plan_models(entries, cfg, now_cfg, changes, batch, req.note, req.dry_run)
            if req.tenants is not None:
                self._plan_tenants(tenants, in_force, changes, batch)
            if req.dry_run or not changes:
                return ApplyReply(changes=changes, applied=False, version=reg.version)
            try:
                version = await asyncio.to_thread(reg.store.change, batch)
            except (StaleRevision, TenantConflict) as exc:
                raise RegistryRefused(f"the registry changed while this was checked ({exc}); apply again", 409) \
                    from None
            await reg.reload(version)
            await reg.tenants_changed(tenants, cfg, version, anew=True)
        for name in batch.tenant_removals:
            await self.tenants.revoke_keys(name, who)
        self.events.record("apply", "operator", outcome="done",
                           inputs={"who": who, "changes": [c.model_dump(exclude={"fields"}) for c in changes]})
        return ApplyReply(changes=changes, applied=True, version=version)

    async def _plan_models(self, entries: list[dict[str, Any]], cfg: ThawConfig, now_cfg: ThawConfig,
                           changes: list[PlannedChange], batch: Batch, note: str | None, dry_run: bool) -> None:
        reg = self.registry
        wanted = {e["name"]: e for e in entries}
        checked = await self._check_stores([m for name in wanted if (m := cfg.model(name)) is not None], cfg)
        for name, entry in wanted.items():
            model = cfg.model(name)
            assert model is not None
            record = reg.records.get(name)
            current = now_cfg.model(name) if record is not None and record.revision is not None else None
            weights = checked[name]
            fields = differences(_resolved(current) if current else {}, _resolved(model))
            if current is not None and record is not None:
                held = next(r.weights_sha256 for r in record.revisions if r.revision == record.revision)
                # (None: a revision seeded from the config file, never hashed: not known to differ.)
                if held is not None and held != weights.manifest_sha256:
                    fields["weights_sha256"] = [held, weights.manifest_sha256]
                if not fields:
                    continue
            spec = {k: v for k, v in entry.items() if k != "name"}
            number = max((r.revision for r in record.revisions), default=0) + 1 if record else 1
            action: Literal["deploy", "update"] = "deploy" if current is None else "update"
            changes.append(PlannedChange(
                kind="model", name=name, action=action, revision=None if dry_run else number, fields=fields))
            batch.revisions.append((ModelRevision(
                model=name, revision=number, spec=spec, weights_sha256=weights.manifest_sha256,
                weights_bytes=weights.total_bytes, created_at=batch.at, who=batch.who,
                change="deploy" if current is None else "update", note=note),
                record.revision if record is not None else None))
        for m in now_cfg.models:
            if m.name not in wanted:
                record = reg.records[m.name]
                assert record.revision is not None
                changes.append(PlannedChange(kind="model", name=m.name, action="remove"))
                batch.removals.append((m.name, record.revision))

    async def _check_stores(self, models: list[Model], cfg: ThawConfig) -> dict[str, WeightsCheck]:
        """Every model's weights as the store holds them, ``STORE_CHECKS`` at a time (one
        by one, a file of 10,000 models took minutes of round trips). Every model's are
        checked: the same settings over weights pushed again to the same URI are a change
        too (the manifest's hash differs). A refusal names the first model refused in the
        file's order, as one by one would."""
        gate = asyncio.Semaphore(STORE_CHECKS)

        async def one(model: Model) -> WeightsCheck:
            async with gate:
                return await self.registry.check_store(model, cfg)

        found = await asyncio.gather(*(one(m) for m in models), return_exceptions=True)
        for got in found:
            if isinstance(got, BaseException):
                raise got
        return {m.name: w for m, w in zip(models, found, strict=True)}  # type: ignore[misc]

    @staticmethod
    def _plan_tenants(tenants: list[Tenant], in_force: dict[str, Tenant], changes: list[PlannedChange],
                      batch: Batch) -> None:
        wanted = {t.name: t for t in tenants}
        for name, t in wanted.items():
            old = in_force.get(name)
            if old == t:
                continue
            then = t.model_dump(mode="json")
            changes.append(PlannedChange(kind="tenant", name=name, action="create" if old is None else "change",
                                         fields=differences(old.model_dump(mode="json") if old else {}, then)))
            batch.tenants.append((t, old is None))
        for name in in_force:
            if name not in wanted:
                changes.append(PlannedChange(kind="tenant", name=name, action="remove"))
                batch.tenant_removals.append(name)
