"""The registry's rows: every revision of every model and which one is current, and the
tenants, in the controller's state database (``warm_pool.db``: ``registry.db`` beside
the controller's other files, or PostgreSQL).

A revision is written once and never changed. A change is one transaction that checks
the revision it was based on, so of two changes based on the same revision (two
controllers' too) one wins and the other is told (:class:`StaleRevision`). Every change
bumps the registry's ``version``, which the route table carries as the catalog's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from thaw.config import Tenant
from thaw.wire import ModelRecord, ModelRevision
from warm_pool.db import Db, Tx

REGISTRY_FILE = "registry.db"

MIGRATIONS = [
    """
CREATE TABLE IF NOT EXISTS model_revisions (
    model TEXT NOT NULL,
    revision INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (model, revision)
);
CREATE TABLE IF NOT EXISTS models (
    name TEXT PRIMARY KEY,
    revision INTEGER,
    removed_at DOUBLE PRECISION,
    removed_by TEXT
);
CREATE TABLE IF NOT EXISTS tenants (
    name TEXT PRIMARY KEY,
    body TEXT NOT NULL,
    changed_at DOUBLE PRECISION NOT NULL,
    who TEXT NOT NULL,
    removed_at DOUBLE PRECISION
);
CREATE TABLE IF NOT EXISTS registry_version (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
INSERT INTO registry_version VALUES (1, 0) ON CONFLICT DO NOTHING
""",
]
# model_revisions.body: the ModelRevision, JSON; models.revision: the current one (NULL
# once removed); tenants.body: the tenant as a config file declares one (thaw.config.Tenant).


class StaleRevision(Exception):
    """The change was based on a revision that is no longer the current one (409)."""

    def __init__(self, model: str, based_on: int | None, current: int | None) -> None:
        super().__init__(
            f"model {model!r} is at revision {current}, not {based_on}: it changed since you read it; "
            "read it again (`thaw models show`) and base the change on the current revision"
            if current is not None else f"model {model!r} is not deployed (removed or never deployed)")
        self.current = current


class TenantConflict(Exception):
    """A tenant created that exists (``exists``), or changed or removed that does not."""

    def __init__(self, name: str, exists: bool) -> None:
        super().__init__(f"tenant {name!r} exists" if exists else f"no tenant {name!r}")
        self.exists = exists


@dataclass(frozen=True)
class Batch:
    """Changes made together (``thaw apply``): new revisions (each with the revision it
    replaces), removed models (likewise), tenants created (True) or changed (False), and
    tenants removed; by ``who`` at ``at``."""

    at: float
    who: str
    revisions: list[tuple[ModelRevision, int | None]] = field(default_factory=list)
    removals: list[tuple[str, int]] = field(default_factory=list)
    tenants: list[tuple[Tenant, bool]] = field(default_factory=list)
    tenant_removals: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TenantRow:
    tenant: Tenant
    changed_at: float
    who: str
    removed_at: float | None


class RegistryStore:
    """Blocking; the registry calls it from threads."""

    def __init__(self, db: Db) -> None:
        self.db = db
        db.migrate("registry", MIGRATIONS)

    def close(self) -> None:
        self.db.close()

    def version(self) -> int:
        with self.db.read() as tx:
            return self._version(tx)

    @staticmethod
    def _version(tx: Tx) -> int:
        return tx.version("registry_version")

    def records(self) -> list[ModelRecord]:
        """Every model ever deployed (removed ones too), each with all its revisions."""
        with self.db.read() as tx:
            heads = tx.query("SELECT name, revision, removed_at, removed_by FROM models ORDER BY name")
            revs: dict[str, list[ModelRevision]] = {}
            for model, body in tx.query("SELECT model, body FROM model_revisions ORDER BY model, revision"):
                revs.setdefault(model, []).append(ModelRevision.model_validate_json(body))
        return [ModelRecord(name=n, revision=r, removed_at=at, removed_by=by, revisions=revs.get(n, []))
                for n, r, at, by in heads]

    def add(self, revision: ModelRevision, based_on: int | None) -> int:
        """Make ``revision`` the model's current one, if the current one is still
        ``based_on`` (None: the model is new or removed); the registry's new version."""
        with self.db.write() as tx:
            self._add(tx, revision, based_on)
            return self._bump(tx)

    @staticmethod
    def _add(tx: Tx, revision: ModelRevision, based_on: int | None) -> None:
        row = tx.one("SELECT revision FROM models WHERE name = ?", (revision.model,))
        current = row[0] if row else None
        if current != based_on:
            raise StaleRevision(revision.model, based_on, current)
        last = tx.one("SELECT max(revision) FROM model_revisions WHERE model = ?", (revision.model,))
        if revision.revision != ((last[0] if last else None) or 0) + 1:
            raise StaleRevision(revision.model, based_on, current)
        tx.execute("INSERT INTO model_revisions VALUES (?, ?, ?)",
                   (revision.model, revision.revision, revision.model_dump_json()))
        tx.execute("INSERT INTO models VALUES (?, ?, NULL, NULL) ON CONFLICT (name) DO UPDATE SET "
                   "revision = excluded.revision, removed_at = NULL, removed_by = NULL",
                   (revision.model, revision.revision))

    def remove(self, model: str, based_on: int, at: float, who: str) -> int:
        """Stop serving ``model`` (its revisions stay); the registry's new version."""
        with self.db.write() as tx:
            self._remove(tx, model, based_on, at, who)
            return self._bump(tx)

    @staticmethod
    def _remove(tx: Tx, model: str, based_on: int, at: float, who: str) -> None:
        row = tx.one("SELECT revision FROM models WHERE name = ?", (model,))
        current = row[0] if row else None
        if current != based_on:
            raise StaleRevision(model, based_on, current)
        tx.execute("UPDATE models SET revision = NULL, removed_at = ?, removed_by = ? WHERE name = ?",
                   (at, who, model))

    def change(self, batch: Batch) -> int:
        """Every change of ``batch`` in one transaction (all or none); the new version."""
        with self.db.write() as tx:
            for revision, based_on in batch.revisions:
                self._add(tx, revision, based_on)
            for model, based_on in batch.removals:
                self._remove(tx, model, based_on, batch.at, batch.who)
            for tenant, new in batch.tenants:
                self._put_tenant(tx, tenant, batch.at, batch.who, new=new)
            for name in batch.tenant_removals:
                self._remove_tenant(tx, name, batch.at, batch.who)
            return self._bump(tx)

    def seed(self, revisions: list[ModelRevision], tenants: list[Tenant], at: float) -> bool:
        """Import a new cluster's models and tenants (the config's), once: only while the
        registry has never changed. Whether it did."""
        with self.db.write() as tx:
            if self._version(tx) > 0:
                return False
            for r in revisions:
                tx.execute("INSERT INTO model_revisions VALUES (?, ?, ?)", (r.model, r.revision, r.model_dump_json()))
                tx.execute("INSERT INTO models VALUES (?, ?, NULL, NULL)", (r.model, r.revision))
            for t in tenants:
                tx.execute("INSERT INTO tenants VALUES (?, ?, ?, 'config', NULL)", (t.name, t.model_dump_json(), at))
            self._bump(tx)
            return True

    # -- tenants ------------------------------------------------------------------------
    def tenants(self) -> list[TenantRow]:
        """Every tenant ever made (removed ones too)."""
        with self.db.read() as tx:
            rows = tx.query("SELECT body, changed_at, who, removed_at FROM tenants ORDER BY name")
        return [TenantRow(Tenant.model_validate_json(b), at, who, removed) for b, at, who, removed in rows]

    def put_tenant(self, tenant: Tenant, at: float, who: str, *, new: bool) -> int:
        """Create (``new``: refused if one of that name is in force) or change a tenant;
        the registry's new version."""
        with self.db.write() as tx:
            self._put_tenant(tx, tenant, at, who, new=new)
            return self._bump(tx)

    @staticmethod
    def _put_tenant(tx: Tx, tenant: Tenant, at: float, who: str, *, new: bool) -> None:
        row = tx.one("SELECT removed_at FROM tenants WHERE name = ?", (tenant.name,))
        exists = row is not None and row[0] is None
        if exists == new:
            raise TenantConflict(tenant.name, exists)
        tx.execute("INSERT INTO tenants VALUES (?, ?, ?, ?, NULL) ON CONFLICT (name) DO UPDATE SET "
                   "body = excluded.body, changed_at = excluded.changed_at, who = excluded.who, "
                   "removed_at = NULL", (tenant.name, tenant.model_dump_json(), at, who))

    def remove_tenant(self, name: str, at: float, who: str) -> int:
        with self.db.write() as tx:
            self._remove_tenant(tx, name, at, who)
            return self._bump(tx)

    @staticmethod
    def _remove_tenant(tx: Tx, name: str, at: float, who: str) -> None:
        n = tx.execute("UPDATE tenants SET removed_at = ?, changed_at = ?, who = ? "
                       "WHERE name = ? AND removed_at IS NULL", (at, at, who, name))
        if not n:
            raise TenantConflict(name, False)

    def _bump(self, tx: Tx) -> int:
        return tx.bump("registry_version")
