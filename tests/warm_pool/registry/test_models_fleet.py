"""The model registry over the controller's HTTP API, with worker agents that heartbeat
to it (fake engines) and route watchers as activators run them: a deployed model reaches
every watcher's catalog and gets a replica on demand; a removed one's replica is released."""

from __future__ import annotations

from pathlib import Path

import httpx

from activator.routing.router import Router
from tests.warm_pool.in_process import (
    TOKEN,
    FakeStoreReader,
    InProcessProvider,
    controller,
    fleet_config,
    states,
    until,
)
from thaw.wire import Catalog


async def test_deploy_reaches_every_activator_serves_on_demand_and_rm_releases(
    provider: InProcessProvider, tmp_path: Path,
) -> None:
    cfg = fleet_config()
    seen: dict[str, list[Catalog]] = {"a": [], "b": []}

    def watcher(name: str) -> Router:
        async def on_catalog(catalog: Catalog, answer: Catalog) -> None:
            seen[name].append(catalog)
            w.set_models(list(catalog.models))

        w = Router(cfg.models, provider.controller_url, f"act-{name}", token=TOKEN, on_catalog=on_catalog,
                         report_interval_s=0.1)
        return w

    def served(name: str, model: str) -> bool:
        return bool(seen[name]) and any(m.name == model for m in seen[name][-1].models)

    watchers = [watcher("a"), watcher("b")]
    for w in watchers:
        await w.start()
    auth = {"Authorization": f"Bearer {TOKEN}", "X-Thaw-Actor": "ops@test"}
    port = int(provider.controller_url.rsplit(":", 1)[1])
    try:
        async with controller(cfg, provider, port, state_dir=tmp_path / "ctl", store_reader=FakeStoreReader()) as c, \
                httpx.AsyncClient(base_url=c.url, headers=auth, timeout=5) as http:
            m = c.manager
            await until("both activators hold the seeded catalog",
                        lambda: all(served(n, "demo") for n in seen), m)
            body = {"name": "second", "spec": {"uri": "s3://thaw/models/second", "shape": "cpu-local",
                                               "served_name": "second-chat"}}
            r = await http.post("/v1/admin/models", json=body)
            assert r.status_code == 201, r.text
            assert r.json()["revision"] == 1 and r.json()["revisions"][0]["who"].startswith("ops@test")
            assert (await http.post("/v1/admin/models", json=body)).status_code == 409
            bad = await http.post("/v1/admin/models", json={"name": "third", "spec": {"uri": "s3://thaw/x",
                                                                                       "shape": "nope"}})
            assert bad.status_code == 422 and "shape 'nope' is not declared" in bad.json()["error"]
            await until("both activators serve it", lambda: all(served(n, "second") for n in seen), m)
            catalog = Catalog.model_validate_json((await http.get("/v1/catalog")).content)
            assert catalog.version == m.feed.table.catalog_version and "second" in {x.name for x in catalog.models}
            # On demand it is placed like any model, from its own weights.
            for w in watchers:
                assert "second" in w.model_names()
            m.traffic.demand("second")
            await until("a replica of second", lambda: bool(m.feed.table.models.get("second")
                                                            and m.feed.table.models["second"].replicas), m)
            replica = m.feed.table.models["second"].replicas[0]
            assert replica.served_model_name == "second-chat"
            # Removed: gone from the catalogs, its replica drained and released, its history kept.
            r = await http.delete("/v1/admin/models/second", params={"revision": 1})
            assert r.status_code == 200 and r.json()["revision"] is None
            await until("no activator serves it", lambda: not any(served(n, "second") for n in seen), m)
            await until("its worker is a standby again",
                        lambda: states(m).get(replica.worker_id) == "standby", m)
            assert "second" not in m.feed.table.models
            described = await http.get("/v1/admin/models/second")
            assert described.status_code == 200 and [x["change"] for x in described.json()["revisions"]] == ["deploy"]
            assert (await http.get("/v1/admin/models/never")).status_code == 404
            assert (await http.delete("/v1/admin/models/second")).status_code == 404
            assert [e.outcome for e in m.parts.event_log.events if e.kind == "model"] == ["deploy", "removed"]
    finally:
        for w in watchers:
            await w.close()
