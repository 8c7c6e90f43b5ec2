"""The route feed at a thousand models: an activator's feed (``ControllerFeed``) that
joins a running controller late gets the whole table at once, every model in it, and
from then on deltas naming only what changed keep its copy equal to the controller's
(the small version is test_feed.py; here the controller's real app and loop with the
simulated fleet of loadtests/sim_fleet.py)."""

from __future__ import annotations

from pathlib import Path

import httpx

from activator.routing.feed import ControllerFeed
from tests.warm_pool.at_scale import name, ready_replicas, scale_config, sim_fleet
from tests.warm_pool.in_process import TOKEN, FakeStoreReader, controller, states, until
from thaw.embedded_store import free_port
from thaw.wire import ActivityReport, RouteTable
from warm_pool.providers.static import StaticProvider

MODELS, WORKERS = 1000, 50
BEFORE, AFTER = 30, 15  # models given a replica before the feed joins, and after
REMOVED = [name(0), name(1), name(500)]  # two serving, one at zero


async def test_a_late_feed_gets_the_whole_table_and_deltas_keep_it_equal(tmp_path: Path) -> None:
    # Keep-alives of an hour: the replicas stay until the test changes them.
    cfg = scale_config(tmp_path, models=MODELS, workers=WORKERS, idle_grace_s=3600)
    async with controller(cfg, StaticProvider(), free_port(), adopt_grace_s=3.0, store_reader=FakeStoreReader()) as c, \
            sim_fleet(c.url, WORKERS, load_s=0.05):
        m = c.manager
        await until("every simulated worker adopted, standing by",
                    lambda: m.adopted and list(states(m).values()) == ["standby"] * WORKERS, m, timeout_s=60)
        for i in range(BEFORE):
            m.traffic.demand(name(i))
        await until(f"{BEFORE} replicas ready", lambda: len(ready_replicas(m.feed.table)) == BEFORE, m, timeout_s=60)

        seen: list[RouteTable] = []
        feed = ControllerFeed(c.url, "late", on_table=seen.append, token=TOKEN,
                              report=lambda: ActivityReport(activator_id="late", models={}))
        await feed.start()
        try:
            # Late: the whole table at once, every model in it, the ready replicas too.
            await until("the late feed's table equal to the controller's", lambda: feed.table == m.feed.table, m)
            assert seen[0].base_version is None and len(seen[0].models) == MODELS
            assert ready_replicas(feed.table) == ready_replicas(m.feed.table)
            joined = len(seen)

            # Then: replicas for more models (asked for through this feed), a model
            # deployed and three removed through the API.
            for i in range(BEFORE, BEFORE + AFTER):
                feed.signal_demand(name(i))
            auth = {"Authorization": f"Bearer {TOKEN}", "X-Thaw-Actor": "ops@test"}
            async with httpx.AsyncClient(base_url=c.url, headers=auth, timeout=30) as http:
                r = await http.post("/v1/admin/models", json={
                    "name": "newcomer", "spec": {"uri": "s3://thaw/models/newcomer", "shape": "cpu-local"}})
                assert r.status_code == 201, r.text
                for gone in REMOVED:
                    r = await http.delete(f"/v1/admin/models/{gone}")
                    assert r.status_code == 200, r.text
            serving = BEFORE + AFTER - 2  # the two removed ones' replicas released
            await until("every change in the late feed's table",
                        lambda: len(ready_replicas(m.feed.table)) == serving and feed.table == m.feed.table, m,
                        timeout_s=60)
        finally:
            await feed.close()

    table = feed.table
    assert table is not None and len(table.models) == MODELS - len(REMOVED) + 1
    assert "newcomer" in table.models and not set(REMOVED) & set(table.models)
    assert {r[0] for r in ready_replicas(table)} == {name(i) for i in range(2, BEFORE + AFTER)}
    # Each update since the first was a delta on the version before it, naming only the
    # models that changed (a thousand models' routes are not sent again for one change).
    deltas = seen[joined:]
    assert deltas and all(d.base_version is not None for d in deltas)
    assert max(len(d.models) for d in deltas) < MODELS // 10
    assert set(REMOVED) <= {n for d in deltas for n in d.removed}
