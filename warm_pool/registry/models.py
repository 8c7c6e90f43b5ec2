"""The models the controller serves, deployed, changed, rolled back and removed at run
time (``thaw models ...``, ``/v1/admin/models``); their revisions are kept in
``warm_pool.registry.store``.

The config in force is the config as written with its ``models`` replaced by the
registry's current revisions (``compose``). A new cluster's registry is seeded once
from the config file's ``models``; after that the file's list is not read again (a
difference is logged at start).

A change is checked before anything is written, and a refused one changes nothing:
the config in force must stay valid with the change in it, as the config file is
checked (shape, base, tenant, ``object_store.allowed_prefixes``, served names), though
only the model changed and what it touches are checked again
(``warm_pool.registry.in_force``); the weights are checked in the store (a manifest
whose files are all there as it lists them), and the model must fit its shape. Of two
changes based on the same revision the second is refused (409).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from thaw.config import ConfigError, Model, Tenant, ThawConfig
from thaw.fit import ModelSize, fit_problem
from thaw.log import get_logger
from thaw.objstore import WeightsCheck, WeightsProblem
from thaw.wire import (
    Catalog,
    ModelDeploy,
    ModelRecord,
    ModelRecords,
    ModelRevision,
    ModelRollback,
    ModelUpdate,
    RevisionChange,
)
from warm_pool.events import EventLog
from warm_pool.registry import in_force
from warm_pool.registry.catalog import CatalogFeed
from warm_pool.registry.in_force import compose, current_spec
from warm_pool.registry.store import RegistryStore, StaleRevision, TenantRow

log = get_logger()

# An adapter's files, shape, context and engine are its base's: never part of its spec.
_ADAPTER_INHERITS = ("uri", "shape", "max_context_tokens", "engine")


class RegistryRefused(Exception):
    """A change that cannot be made; ``status``: the HTTP status that says why."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class StoreReader(Protocol):
    """What the registry reads from the object store (blocking; called in threads)."""

    def check_weights(self, uri: str) -> WeightsCheck: ...

    def read_config(self, uri: str) -> dict[str, Any] | None: ...


# -- pure -------------------------------------------------------------------------------


def merge(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``change`` applied; nested settings merge field by field."""
    out = dict(base)
    for k, v in change.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# What a replica's engine does not depend on: a change of only these rolls nothing.
_NOT_ENGINE = ("autoscaling", "tenant", "pricing", "prewarm")


def outdated_revisions(record: ModelRecord) -> frozenset[int]:
    """The revisions of ``record`` whose replicas a roll replaces: those whose weights
    (where both are known) or engine settings differ from the current revision's."""
    if record.revision is None:
        return frozenset()
    now = next(r for r in record.revisions if r.revision == record.revision)

    def engine(spec: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in spec.items() if k not in _NOT_ENGINE}

    return frozenset(r.revision for r in record.revisions if r.revision != now.revision and (
        engine(r.spec) != engine(now.spec)
        or (r.weights_sha256 is not None and now.weights_sha256 is not None
            and r.weights_sha256 != now.weights_sha256)))


def eager_on_cpu(spec: dict[str, Any], cfg: ThawConfig, current: dict[str, Any] | None = None) -> dict[str, Any]:
    """``spec`` of a model being deployed, ``engine.enforce_eager`` filled in where it
    leaves it out: as ``current`` has it (the spec in force of the model, for ``thaw apply``
    of a file that leaves it out), else ``true`` on a CPU shape (``gpu_count`` 0 in
    ``cfg``). A compiled engine on a CPU started in about 110 s (256 MiB), near the
    default ``activation_timeout_s`` of 120 s; an eager one has nothing to compile. Set
    in the revision, so it shows and a roll does not change it. An adapter (its engine is
    its base's), a GPU shape, or a spec that says: unchanged. The config file's models
    are not deployed through here: its ``engine.enforce_eager`` keeps its default."""
    engine = spec.get("engine") or {}
    if spec.get("base") is not None or "enforce_eager" in engine:
        return spec
    if current is not None:
        held = (current.get("engine") or {}).get("enforce_eager")
        return spec if held is None else {**spec, "engine": {**engine, "enforce_eager": held}}
    shape = cfg.shape(spec["shape"]) if isinstance(spec.get("shape"), str) else None
    if shape is None or shape.gpu_count > 0:
        return spec
    return {**spec, "engine": {**engine, "enforce_eager": True}}


def config_entry(m: Model) -> dict[str, Any]:
    """A model of the config as a spec: what differs from the defaults, an adapter without
    what it takes from its base."""
    entry = m.model_dump(mode="json", exclude_defaults=True)
    entry.pop("name", None)
    entry.pop("demo_if_missing", None)
    if m.base is not None:
        for key in _ADAPTER_INHERITS:
            entry.pop(key, None)
    return entry


def field_problems(problems: list[str], name: str) -> str:
    """The config's messages about the new entry (at index 0), naming the model."""
    def one(p: str) -> str:
        p = p.removeprefix("(top level): ").replace(f"models[0] ({name})", f"model {name!r}")
        return f"model {name!r}: " + p.removeprefix("models[0].") if p.startswith("models[0].") else p

    return "; ".join(one(p) for p in problems)


@dataclass(frozen=True)
class Candidate:
    spec: dict[str, Any]
    cfg: ThawConfig
    weights: WeightsCheck


# -- the registry -----------------------------------------------------------------------


class ModelRegistry:
    """The registry in force: ``cfg`` (the config serving the current revisions),
    ``version`` (moves on every change), and the changes themselves."""

    def __init__(self, base: ThawConfig, store: RegistryStore, reader: StoreReader | None, events: EventLog,
                 *, on_change: Callable[[ThawConfig], Awaitable[None]], clock: Callable[[], float]) -> None:
        """``base``: the config as written (its budgets applied or not: only its models
        are replaced); ``reader``: None when the controller cannot reach the store (every
        deploy is then refused, 503); ``on_change``: given the new config in force."""
        self.written = base
        self.store = store
        self.reader = reader
        self.events = events
        self._on_change = on_change
        self._clock = clock
        # Changes one at a time (the tenants' too: warm_pool.registry.tenants).
        self.lock = asyncio.Lock()
        seeded = store.seed([ModelRevision(model=m.name, revision=1, spec=config_entry(m),
                                           created_at=clock(), who="config", change="import")
                             for m in base.models], list(base.tenants), clock())
        self._take(*self._read())
        # What activators fetch; read anew, no change before this version is known.
        self.catalogs = CatalogFeed(self.version, self.cfg)
        if seeded:
            log.info("registry_seeded", models=[m.name for m in base.models])
        else:
            file_only = sorted({m.name for m in base.models} - {m.name for m in self.cfg.models})
            if file_only:
                log.warning("config_models_not_deployed", models=file_only,
                            hint="the registry, not the config file, says what is served after the first "
                                 "start: deploy them with `thaw models deploy` or `thaw apply -f`")

    def _read(self) -> tuple[list[ModelRecord], int, list[TenantRow]]:
        """The store's rows (blocking)."""
        return self.store.records(), self.store.version(), self.store.tenants()

    def _hold(self, records: builtins.list[ModelRecord]) -> None:
        """Hold ``records``, and the revisions each one's roll replaces (read every turn of
        the controller's loop: kept here, not recomputed over every model each time)."""
        self.records = {r.name: r for r in records}
        self._outdated = {r.name: o for r in records if (o := outdated_revisions(r))}

    def _hold_one(self, record: ModelRecord) -> None:
        """Hold ``record``, one model's changed (the dict :meth:`outdated` gave is not changed)."""
        self.records[record.name] = record
        self._outdated = {n: o for n, o in self._outdated.items() if n != record.name}
        if o := outdated_revisions(record):
            self._outdated[record.name] = o

    def _take(self, records: list[ModelRecord], version: int, tenants: list[TenantRow]) -> None:
        self._hold(records)
        self.version = version
        # The config as written serving the registry's tenants (and, in cfg, its models).
        self.base = self.written.model_copy(update={"tenants": [r.tenant for r in tenants if r.removed_at is None]})
        self.cfg, problems = compose(self.base, list(self.records.values()))
        for p in problems:
            log.error("registry_model_not_in_force", problem=p)

    async def refresh(self) -> None:
        """Take in everything the store holds now (a controller that starts leading: the
        one before it may have changed models and tenants since this one read them)."""
        async with self.lock:
            self._take(*await asyncio.to_thread(self._read))
            self.catalogs.restart(self.version, self.cfg)
            await self._on_change(self.cfg)

    # -- reading ----------------------------------------------------------------------
    def list(self) -> ModelRecords:
        return ModelRecords(version=self.version, models=sorted(self.records.values(), key=lambda r: r.name))

    def catalog(self) -> Catalog:
        """The models and tenants activators serve (the whole of ``GET /v1/catalog``)."""
        return self.catalogs.catalog()

    def revision(self, name: str) -> int | None:
        """The current revision of model ``name`` (None: not deployed)."""
        record = self.records.get(name)
        return record.revision if record is not None else None

    def outdated(self) -> dict[str, frozenset[int]]:
        """Per model served, the revisions a roll replaces (``outdated_revisions``); the
        caller does not change it."""
        return self._outdated

    def describe(self, name: str) -> ModelRecord:
        record = self.records.get(name)
        if record is None:
            raise RegistryRefused(f"no model {name!r} was ever deployed", 404)
        return record

    # -- changing ---------------------------------------------------------------------
    async def deploy(self, body: ModelDeploy, who: str) -> ModelRecord:
        async with self.lock:
            record = self.records.get(body.name)
            if record is not None and record.revision is not None:
                raise RegistryRefused(f"model {body.name!r} exists (revision {record.revision}): change it with "
                                      "`thaw models update`, or remove it first", 409)
            # (No model of that name is in force: the record says so.)
            other = self.cfg.model(body.name)
            if other is not None:
                raise RegistryRefused(f"{body.name!r} is the served name of model {other.name!r}", 409)
            candidate = await self._checked(body.name, eager_on_cpu(body.spec.fields(), self.cfg))
            return await self._commit(body.name, candidate, "deploy", who, based_on=None, note=body.note)

    async def update(self, name: str, body: ModelUpdate, who: str) -> ModelRecord:
        async with self.lock:
            record = self._current(name)
            self._based_on(record, body.revision)
            change = body.spec.fields()
            if not change:
                raise RegistryRefused("nothing to change: give at least one setting")
            spec = current_spec(record)
            assert spec is not None
            candidate = await self._checked(name, merge(spec, change))
            now = next(r for r in record.revisions if r.revision == record.revision)
            if candidate.spec == spec and candidate.weights.manifest_sha256 == now.weights_sha256:
                raise RegistryRefused(f"model {name!r} already has these settings and these weights "
                                      f"(revision {record.revision})")
            return await self._commit(name, candidate, "update", who, based_on=body.revision, note=body.note)

    async def rollback(self, name: str, body: ModelRollback, who: str) -> ModelRecord:
        async with self.lock:
            record = self._current(name)
            if body.revision is not None:
                self._based_on(record, body.revision)
            assert record.revision is not None
            to = body.to if body.to is not None else record.revision - 1
            target = next((r for r in record.revisions if r.revision == to), None)
            if target is None or to == record.revision:
                raise RegistryRefused(
                    f"model {name!r} has no revision {to} to roll back to (it has "
                    f"{[r.revision for r in record.revisions]}, current {record.revision})"
                    if to != record.revision else f"revision {to} is the current one", 409 if target else 404)
            candidate = await self._checked(name, target.spec)
            return await self._commit(name, candidate, "rollback", who, based_on=record.revision, note=body.note,
                                      from_revision=to)

    async def remove(self, name: str, who: str, revision: int | None = None) -> ModelRecord:
        async with self.lock:
            record = self._current(name)
            if revision is not None:
                self._based_on(record, revision)
            users = [m.name for m in self.cfg.adapters_of(name)]
            if users:
                raise RegistryRefused(f"model {name!r} is the base of adapters {users}: remove them first", 409)
            try:
                cfg = in_force.with_change(self.cfg, self.base, self._spec, name, None)
            except ConfigError as exc:
                raise RegistryRefused(f"removing {name!r} leaves the config invalid: "
                                      + "; ".join(exc.problems), 409) from None
            assert record.revision is not None
            try:
                self.version = await asyncio.to_thread(self.store.remove, name, record.revision, self._clock(), who)
            except StaleRevision as exc:
                raise RegistryRefused(str(exc), 409) from None
            self._hold_one(record.model_copy(update={"revision": None, "removed_at": self._clock(),
                                                     "removed_by": who}))
            self.cfg = cfg
            self.catalogs.changed(self.version, cfg)
            self.events.record("model", "operator", model=name, outcome="removed",
                               inputs={"who": who, "revision": record.revision})
            await self._on_change(cfg)
            return self.records[name]

    def with_tenants(self, tenants: builtins.list[Tenant]) -> ThawConfig:
        """The config in force were ``tenants`` the tenants (raises ``ConfigError``)."""
        return in_force.with_tenants(self.cfg, tenants)

    async def tenants_changed(self, tenants: builtins.list[Tenant], cfg: ThawConfig, version: int, *,
                              anew: bool = False) -> None:
        """The tenants changed (``warm_pool.registry.tenants``, holding :attr:`lock`): ``cfg`` is
        :meth:`with_tenants`'s answer for them, ``version`` the registry's; ``anew``: every
        model of ``cfg`` was read anew too (``thaw apply``), so the catalog's history starts over."""
        self.base = self.written.model_copy(update={"tenants": tenants})
        self.cfg, self.version = cfg, version
        if anew:
            self.catalogs.restart(version, cfg)
        else:
            self.catalogs.changed(version, cfg)
        await self._on_change(cfg)

    def _spec(self, name: str) -> dict[str, Any]:
        """The spec in force of model ``name`` (one of ``cfg``'s)."""
        spec = current_spec(self.records[name])
        assert spec is not None
        return spec

    # -- parts ------------------------------------------------------------------------
    def _current(self, name: str) -> ModelRecord:
        record = self.records.get(name)
        if record is None or record.revision is None:
            raise RegistryRefused(f"no model {name!r} is deployed" + (
                f" (removed by {record.removed_by})" if record is not None else ""), 404)
        return record

    @staticmethod
    def _based_on(record: ModelRecord, revision: int) -> None:
        if revision != record.revision:
            raise RegistryRefused(str(StaleRevision(record.name, revision, record.revision)), 409)

    async def _checked(self, name: str, spec: dict[str, Any]) -> Candidate:
        """The config in force with ``name`` at ``spec``, once every check passed."""
        spec = {k: v for k, v in spec.items() if k != "name"}
        try:
            cfg = in_force.with_change(self.cfg, self.base, self._spec, name, spec)
        except ConfigError as exc:
            raise RegistryRefused(field_problems(exc.problems, name)) from None
        model = cfg.models[0]  # with_change puts the model changed first
        return Candidate(spec=spec, cfg=cfg, weights=await self.check_store(model, cfg))

    async def check_store(self, model: Model, cfg: ThawConfig) -> WeightsCheck:
        """The weights of ``model`` as the store holds them, once they are complete and
        fit its shape in ``cfg`` (raises :class:`RegistryRefused`)."""
        if self.reader is None:
            raise RegistryRefused("the controller cannot reach the object store, so it cannot check the weights; "
                                  "see its log (object_store settings and credentials)", 503)
        try:
            weights = await asyncio.to_thread(self.reader.check_weights, model.uri)
        except WeightsProblem as exc:
            raise RegistryRefused(f"{'adapter_uri' if model.is_adapter else 'uri'}: {exc}") from None
        except Exception as exc:  # the store: unreachable, refused
            raise RegistryRefused(f"cannot read {model.uri} from the store: {type(exc).__name__}: {exc}",
                                  503) from None
        if not model.is_adapter:
            try:
                hf_config = await asyncio.to_thread(self.reader.read_config, model.uri)
            except Exception as exc:
                raise RegistryRefused(f"cannot read {model.uri}/config.json: {type(exc).__name__}: {exc}",
                                      503) from None
            problem = fit_problem(None, model, cfg, ModelSize(weights.total_bytes, "manifest", hf_config))
            if problem:
                raise RegistryRefused(problem)
        return weights

    async def reload(self, version: int) -> None:
        """Take the store's rows again after a change made there directly (``warm_pool.registry.apply``)."""
        self._hold(await asyncio.to_thread(self.store.records))
        self.version = version

    async def _commit(self, name: str, candidate: Candidate, change: RevisionChange, who: str, *,
                      based_on: int | None, note: str | None, from_revision: int | None = None) -> ModelRecord:
        spec, weights = candidate.spec, candidate.weights
        record = self.records.get(name)
        revision = ModelRevision(
            model=name, revision=max((r.revision for r in record.revisions), default=0) + 1 if record else 1,
            spec=spec, weights_sha256=weights.manifest_sha256, weights_bytes=weights.total_bytes,
            created_at=self._clock(), who=who, change=change, from_revision=from_revision, note=note)
        try:
            self.version = await asyncio.to_thread(self.store.add, revision, based_on)
        except StaleRevision as exc:
            raise RegistryRefused(str(exc), 409) from None
        self._hold_one(ModelRecord(name=name, revision=revision.revision,
                                   revisions=[*(record.revisions if record else []), revision]))
        self.cfg = candidate.cfg
        self.catalogs.changed(self.version, candidate.cfg)
        self.events.record("model", "operator", model=name, outcome=change,
                           inputs={"who": who, "revision": revision.revision, "based_on": based_on,
                                   "from_revision": from_revision, "weights_sha256": weights.manifest_sha256})
        await self._on_change(candidate.cfg)
        return self.records[name]
