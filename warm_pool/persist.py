"""What the controller keeps across restarts, in ``<data_dir>/controller/``: the
operators' run-time budget changes (``budget.json``) and the models' idle-interval
histograms (``keepalive.json``). Plus the pure parts of a budget change: merging it,
applying it to the config (validated as the config file is), and viewing the result.

Files are written whole and renamed into place, so a crash leaves the old or the new.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from thaw.config import Pool, ThawConfig, format_errors
from thaw.log import get_logger
from thaw.wire import BudgetChange, BudgetView, PoolBudget
from warm_pool.keepalive import IdleHistogram

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


# -- files: blocking (the controller runs writes in a thread) -------------------------


class ControllerStore:
    """The controller's files; ``state_dir`` None keeps nothing (tests)."""

    def __init__(self, state_dir: Path | None) -> None:
        self.state_dir = state_dir

    def _read(self, name: str) -> Any:
        if self.state_dir is None or not (self.state_dir / name).exists():
            return None
        try:
            return json.loads((self.state_dir / name).read_text())
        except (OSError, ValueError) as exc:
            log.warning("controller_state_unreadable", file=name, error=str(exc))
            return None

    def _write(self, name: str, body: Any) -> None:
        if self.state_dir is None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / f"{name}.tmp"
        tmp.write_text(json.dumps(body))
        tmp.replace(self.state_dir / name)

    def load_budget(self) -> dict[str, Any]:
        data = self._read(BUDGET_FILE)
        return data if isinstance(data, dict) else {}

    def save_budget(self, overrides: dict[str, Any]) -> None:
        self._write(BUDGET_FILE, overrides)

    def load_histograms(self, cfg: ThawConfig) -> dict[str, IdleHistogram]:
        """The models' idle-interval histograms from the last run (the hybrid keep-alive
        policy would otherwise relearn every pattern after a restart)."""
        saved = self._read(KEEPALIVE_FILE)
        out: dict[str, IdleHistogram] = {}
        for m in cfg.models:
            entry = saved.get(m.name) if isinstance(saved, dict) else None
            hcfg = m.autoscaling.keep_alive_histogram
            # Counts kept with another bin width mean other intervals: start afresh.
            if not isinstance(entry, dict) or entry.get("bin_s") != hcfg.bin_s:
                continue
            try:
                out[m.name] = IdleHistogram.from_json(entry.get("histogram"), hcfg)
            except ValueError as exc:
                log.warning("keepalive_histogram_dropped", model=m.name, error=str(exc))
        return out

    def save_histograms(self, cfg: ThawConfig, histograms: dict[str, IdleHistogram]) -> None:
        self._write(KEEPALIVE_FILE, {
            m.name: {"bin_s": m.autoscaling.keep_alive_histogram.bin_s, "histogram": histograms[m.name].to_json()}
            for m in cfg.models if m.name in histograms})
