"""What the controller keeps beside the registry in the state database (warm_pool.persist):
budgets, keep-alive histograms and the decision log, on both backends; an older Thaw's
files taken in once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from tests.warm_pool.conftest import StateDb
from tests.warm_pool.in_process import EXAMPLE
from thaw.config import ThawConfig, parse_config
from thaw.wire import PoolEvent
from warm_pool.events import SavedEvent
from warm_pool.persist import ControllerStore
from warm_pool.policy.keepalive import IdleHistogram, record_idle


def test_budgets_and_events_are_shared_by_every_controller_on_the_database(state_db: StateDb) -> None:
    a, b = ControllerStore(state_db()), ControllerStore(state_db())
    a.save_budget({"total_usd_per_hour": 12.5})
    assert b.load_budget() == {"total_usd_per_hour": 12.5}
    now = time.time()
    events = [SavedEvent("a", 1, 1, PoolEvent(at=now - 10, kind="launch", reason="standby"), True),
              SavedEvent("b", 2, 1, PoolEvent(at=now, kind="assign", reason="demand", model="m"), True)]
    a.save_events(events[:1])
    b.save_events(events[1:])
    a.save_events(events[:1])  # saved again (a retried flush): kept once
    assert b.events() == events
    assert [e.controller for e in a.events(since=now - 5)] == ["b"]
    # Past retention (30 days) an event is dropped as new ones are saved.
    old = SavedEvent("c", 3, 1, PoolEvent(at=now - 31 * 86400, kind="launch", reason="standby"), True)
    ControllerStore(state_db()).save_events([old])
    assert "c" not in {e.controller for e in a.events()}


def test_an_older_thaws_files_are_taken_in_once(state_db: StateDb, tmp_path: Path) -> None:
    (tmp_path / "budget.json").write_text(json.dumps({"pools": {"gpu": {"standby_max": 3}}}))
    store = ControllerStore(state_db(), tmp_path)
    assert store.load_budget() == {"pools": {"gpu": {"standby_max": 3}}}
    assert not (tmp_path / "budget.json").exists() and (tmp_path / "budget.json.imported").exists()
    store.save_budget({})
    # A file that reappears does not overwrite what the database holds.
    (tmp_path / "budget.json").write_text(json.dumps({"total_usd_per_hour": 1}))
    assert ControllerStore(state_db(), tmp_path).load_budget() == {}


def _periodic(slots: int) -> ThawConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["models"][0]["autoscaling"].update(
        {"keep_alive": "histogram", "keep_alive_histogram": {"periodic": "day", "period_slots": slots}})
    return parse_config(data)


def test_keep_alive_histograms_keep_their_slots_while_the_period_is_the_same(state_db: StateDb) -> None:
    cfg = _periodic(24)
    m = cfg.models[0]
    h = record_idle(IdleHistogram(), 900.0, m.autoscaling.keep_alive_histogram, began_at=5 * 3600.0)
    ControllerStore(state_db()).save_histograms(cfg, {m.name: h})
    assert ControllerStore(state_db()).load_histograms(cfg) == {m.name: h}
    # Other slots (12 of 2 h) mean other intervals: those start afresh, the histogram stays.
    again = ControllerStore(state_db()).load_histograms(_periodic(12))[m.name]
    assert again.total() == 1 and again.by_slot == ()
