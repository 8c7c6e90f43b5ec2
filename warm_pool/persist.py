"""What the controller keeps across restarts and hands to the next leader, in the state
database (``warm_pool.db``: SQLite under ``<data_dir>/controller/`` or PostgreSQL): the
operators' run-time budget changes, the models' idle-interval histograms, the decision
events and the leader's lease. Plus the pure parts of a budget change: merging it,
applying it to the config (validated as the config file is), and viewing the result.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from thaw.config import Pool, ThawConfig, format_errors
from thaw.log import get_logger
from thaw.wire import BudgetChange, BudgetView, PoolBudget, PoolEvent
from warm_pool.db import Db
from warm_pool.events import SavedEvent
from warm_pool.policy.keepalive import IdleHistogram, histograms_from_json, histograms_to_json

log = get_logger()

KEEPALIVE_FILE = "keepalive.json"
BUDGET_FILE = "budget.json"


class BudgetRefused(ValueError):
    """A budget change that cannot apply (unknown shape, min above max, ...)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


# -- budgets: pure --------------------------------------------------------------------


def merge_budget_change(overrides: dict[str, Any], change: BudgetChange, base: ThawConfig) -> dict[str, Any]:
    """The overrides with ``change`` merged in (a new dict; raises :class:`BudgetRefused`)."""
    out = json.loads(json.dumps(overrides))  # a deep copy
    pool_fields = {k: v for k, v in (("standby_min", change.standby_min), ("standby_max", change.standby_max),
                                     ("budget_usd_per_hour", change.usd_per_hour)) if v is not None}
    if pool_fields:
        if change.shape is None:
            raise BudgetRefused("standby_min, standby_max and usd_per_hour need a shape")
        if base.pool(change.shape) is None:
            raise BudgetRefused(f"no pool for shape {change.shape!r}; pools: "
                                f"{sorted(p.shape for p in base.pools)}", 404)
        out.setdefault("pools", {}).setdefault(change.shape, {}).update(pool_fields)
    if change.total_usd_per_hour is not None:
        out["total_usd_per_hour"] = change.total_usd_per_hour
    if not pool_fields and change.total_usd_per_hour is None:
        raise BudgetRefused("nothing to change: give standby_min, standby_max, usd_per_hour or total_usd_per_hour")
    return out  # type: ignore[no-any-return]


def apply_budget(base: ThawConfig, overrides: dict[str, Any]) -> ThawConfig:
    """``base`` with ``overrides`` applied, each changed pool validated as in the file."""
    pools = []
    for p in base.pools:
        change = overrides.get("pools", {}).get(p.shape)
        if change:
            try:
                p = Pool.model_validate({**p.model_dump(), **change})
            except ValidationError as exc:
                raise BudgetRefused(f"pool {p.shape!r}: " + "; ".join(format_errors(exc))) from None
        pools.append(p)
    update: dict[str, Any] = {"pools": pools}
    if "total_usd_per_hour" in overrides:
        update["budget_usd_per_hour"] = overrides["total_usd_per_hour"]
    return base.model_copy(update=update)


def budget_view(cfg: ThawConfig, overrides: dict[str, Any]) -> BudgetView:
    changed = overrides.get("pools", {})
    return BudgetView(
        total_usd_per_hour=cfg.budget_usd_per_hour,
        total_source="run time" if "total_usd_per_hour" in overrides else "config",
        pools=[PoolBudget(shape=p.shape, standby_min=p.standby_min, standby_max=p.standby_max,
                          max_instances=p.max_instances, usd_per_hour=p.budget_usd_per_hour,
                          source="run time" if p.shape in changed else "config") for p in cfg.pools],
    )


# -- the state database: blocking (the controller calls it from threads) ---------------

MIGRATIONS = [
    """
    CREATE TABLE controller_state (
        name TEXT PRIMARY KEY,
        body TEXT NOT NULL,
        changed_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE controller_events (
        controller TEXT NOT NULL,
        term INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        kind TEXT NOT NULL,
        decision INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (controller, term, seq)
    );
    CREATE INDEX controller_events_at ON controller_events (at);
    CREATE TABLE controller_lease (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        url TEXT NOT NULL,
        term INTEGER NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL
    )
    """,
    # The terms of leading (``warm_pool.leader``) and the actions taken under them
    # (``warm_pool.fencing``): what a history checker reads to prove no deposed term acted.
    """
    CREATE TABLE controller_terms (
        term INTEGER PRIMARY KEY,
        holder TEXT NOT NULL,
        url TEXT NOT NULL,
        began_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE controller_actions (
        id TEXT PRIMARY KEY,
        controller TEXT NOT NULL,
        term INTEGER,
        at DOUBLE PRECISION NOT NULL,
        kind TEXT NOT NULL,
        worker_id TEXT,
        instance_id TEXT,
        shape TEXT,
        outcome TEXT,
        ended_at DOUBLE PRECISION
    );
    CREATE INDEX controller_actions_at ON controller_actions (at)
    """,
]
# Decision events older than this are deleted as new ones are saved.
EVENTS_RETAINED_S = 30 * 86400.0


class ControllerStore:
    """What the controller keeps beside the registry in the state database: the
    run-time budgets, the keep-alive histograms, the decision events and the leader's
    lease (``warm_pool.leader``). ``state_dir``: where an older Thaw kept the first two
    as files, taken in once."""

    def __init__(self, db: Db, state_dir: Path | None = None) -> None:
        self.db = db
        self.state_dir = state_dir
        db.migrate("controller", MIGRATIONS)
        self._pruned_at = 0.0
        for name in (BUDGET_FILE, KEEPALIVE_FILE):
            self._import_file(name)

    def _import_file(self, name: str) -> None:
        path = self.state_dir / name if self.state_dir is not None else None
        if path is None or not path.exists():
            return
        try:
            body = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("controller_state_unreadable", file=str(path), error=str(exc))
            return
        with self.db.write(fenced=False) as tx:  # at start, before any lease: taken in once
            tx.execute("INSERT INTO controller_state VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING",
                       (name, json.dumps(body), time.time()))
        with contextlib.suppress(FileNotFoundError):  # another controller on this machine took it in
            path.rename(path.with_suffix(".json.imported"))
        log.info("controller_state_imported", file=str(path))

    def _read(self, name: str) -> Any:
        with self.db.read() as tx:
            row = tx.one("SELECT body FROM controller_state WHERE name = ?", (name,))
        return json.loads(row[0]) if row else None

    def _write(self, name: str, body: Any) -> None:
        with self.db.write() as tx:
            tx.execute("INSERT INTO controller_state VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                       "body = excluded.body, changed_at = excluded.changed_at", (name, json.dumps(body), time.time()))

    def load_budget(self) -> dict[str, Any]:
        data = self._read(BUDGET_FILE)
        return data if isinstance(data, dict) else {}

    def save_budget(self, overrides: dict[str, Any]) -> None:
        self._write(BUDGET_FILE, overrides)

    def load_histograms(self, cfg: ThawConfig) -> dict[str, IdleHistogram]:
        """The models' idle-interval histograms from the last run (the hybrid keep-alive
        policy would otherwise relearn every pattern after a restart)."""
        out, dropped = histograms_from_json(cfg, self._read(KEEPALIVE_FILE))
        for name, why in dropped.items():
            log.warning("keepalive_histogram_dropped", model=name, error=why)
        return out

    def save_histograms(self, cfg: ThawConfig, histograms: dict[str, IdleHistogram]) -> None:
        self._write(KEEPALIVE_FILE, histograms_to_json(cfg, histograms))

    def save_events(self, events: list[SavedEvent]) -> None:
        """Append events (a batch, in one transaction); drop those past retention. Not
        fenced: a deposed controller's events are what it did, kept as history."""
        with self.db.write(fenced=False) as tx:
            for e in events:
                tx.execute("INSERT INTO controller_events VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                           (e.controller, e.term, e.seq, e.event.at, e.event.kind, int(e.decision),
                            e.event.model_dump_json(exclude_none=True)))
            now = time.time()
            if now - self._pruned_at > 3600:
                tx.execute("DELETE FROM controller_events WHERE at < ?", (now - EVENTS_RETAINED_S,))
                self._pruned_at = now

    def events(self, since: float = 0.0) -> list[SavedEvent]:
        """The events saved since ``since``, oldest first (every controller's)."""
        with self.db.read() as tx:
            rows = tx.query("SELECT controller, term, seq, decision, body FROM controller_events WHERE at >= ? "
                            "ORDER BY at, controller, term, seq", (since,))
        return [SavedEvent(str(c), int(t), int(q), PoolEvent.model_validate_json(b), bool(d))
                for c, t, q, d, b in rows]
