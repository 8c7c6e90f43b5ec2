"""The controller's object graph (warm_pool.assembly): the parts the API calls and the
manager's loop are one graph, and the parts' calls into the loop reach it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.warm_pool.in_process import TOKEN, FakeStoreReader, registry_config
from thaw.wire import ModelDeploy, ModelSpec
from warm_pool.assembly import LoopCalls, build_pool
from warm_pool.db import Db
from warm_pool.fleet.control import HttpWorkerControl
from warm_pool.leader import LeaseStore


def test_the_parts_share_one_event_log_clock_and_controller(tmp_path: Path) -> None:
    m = build_pool(registry_config(), {}, HttpWorkerControl(TOKEN), state_dir=tmp_path, controller_id="c-1",
                   clock=lambda: 1000.0, epoch="e1")
    p = m.parts
    assert m.epoch == "e1" and p.controller_id == "c-1" and p.event_log.controller == "c-1"
    assert m.clock is p.clock and p.clock() == 1000.0
    assert m.parts.leadership is None and m.leading and m.term is None
    # The config in force is the budgets', over the registry's models.
    assert m.cfg is p.budgets.cfg and [x.name for x in m.cfg.models] == [x.name for x in p.model_admin.cfg.models]
    # heartbeat_interval_s 1.5 + 0.5: one interval and a margin, when not given.
    assert m.adopt_grace_s == registry_config().cluster.heartbeat_interval_s * 1.5 + 0.5


async def test_a_registry_change_reaches_the_loop(tmp_path: Path) -> None:
    m = build_pool(registry_config(), {}, HttpWorkerControl(TOKEN), state_dir=tmp_path,
                   store_reader=FakeStoreReader())
    m.parts.wake.clear()
    await m.parts.model_admin.deploy(ModelDeploy(name="second", spec=ModelSpec.model_validate(
        {"uri": "s3://thaw/models/second", "shape": "cpu-local"}), note=None), "ops")
    # models_changed: the budgets rebased on the new config, the loop woken.
    assert "second" in {x.name for x in m.cfg.models} and m.parts.wake.is_set()


async def test_the_lease_goes_through_the_loop(tmp_path: Path) -> None:
    # The lease row in the state database (its own connection, as `thaw controller` has).
    m = build_pool(registry_config(), {}, HttpWorkerControl(TOKEN), state_dir=tmp_path,
                   state_db=Db.sqlite(tmp_path / "state.db"), lease=LeaseStore(Db.sqlite(tmp_path / "state.db")),
                   url="http://me", controller_id="me")
    assert m.parts.leadership is not None and not m.leading  # it follows until it holds the lease
    await m.start(loop=False)
    try:
        assert m.leading and m.term == 1 and m.adopt_until is not None  # lead(): the fleet is being adopted
        assert [(e.reason, e.outcome) for e in m.parts.event_log.events if e.kind == "leader"] == [("elected", "leading")]
    finally:
        await m.close()


async def test_a_call_before_the_loop_is_built_says_so() -> None:
    with pytest.raises(AssertionError, match="before it was built"):
        await LoopCalls().keys_changed()
