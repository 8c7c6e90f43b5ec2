"""Two controllers on one PostgreSQL, each with its HTTP API, worker agents heartbeating
to whichever leads (fake engines), and an activator's route watcher given both URLs.

One leads; the other answers with where the leader is, and every client follows. When
the leader dies without a word (its lease left to expire), the other takes the lease
with the next term, takes in what the dead one changed (a model deployed through it),
adopts the fleet, and serves a cold request that arrived during the takeover. The
decision log in the database shows one controller per term and no overlap."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import httpx
import pytest

from activator.routing.router import Router
from tests.warm_pool.in_process import (
    TOKEN,
    InProcessProvider,
    fleet_config,
    on_postgres,
    until,
)
from thaw.controllers import LEADER_HEADER, Controllers
from thaw.embedded_store import free_port
from thaw.wire import Catalog, ReleaseRequest
from warm_pool.db import Db
from warm_pool.fleet.control import ControlError, HttpWorkerControl
from warm_pool.persist import ControllerStore

# Long enough that a loaded machine (CI runs two lanes on two cores) does not stall a
# renewal past it: a lease lost and taken back would start a third term mid-test.
LEASE_S = 3.0


async def test_the_follower_takes_over_a_dead_leader_and_serves_a_cold_request(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = postgres_url
    ports = free_port(), free_port()
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    provider = InProcessProvider(tmp_path / "workers", ",".join(urls))
    # demo stays warm across the failover (the test's idle grace would release it).
    cfg = fleet_config(idle_grace_s=120)

    one = on_postgres(cfg, provider, url, LEASE_S)

    catalogs: list[Catalog] = []

    async def on_catalog(catalog: Catalog, answer: Catalog) -> None:
        catalogs.append(catalog)
        watcher.set_models(list(catalog.models))

    # The watcher is told the follower's URL first: it must find the leader itself.
    watcher = Router(cfg.models, f"{urls[1]},{urls[0]}", "act", token=TOKEN, on_catalog=on_catalog,
                           report_interval_s=0.1)
    auth = {"Authorization": f"Bearer {TOKEN}", "X-Thaw-Actor": "ops@test"}
    stack = contextlib.AsyncExitStack()
    try:
        a = await stack.enter_async_context(one("a", ports[0]))
        await until("a leads", lambda: a.manager.leading, a.manager)
        b = await stack.enter_async_context(one("b", ports[1]))
        assert not b.manager.leading and b.manager.leader_url == urls[0]
        async with httpx.AsyncClient(headers=auth, timeout=5) as http:
            # The follower refuses with where the leader is; the client follows.
            r = await http.get(f"{urls[1]}/v1/state")
            assert r.status_code == 503 and r.headers[LEADER_HEADER] == urls[0]
            assert r.json()["leader"] == urls[0]
            assert (await http.get(f"{urls[1]}/healthz")).json()["role"] == "follower"
            assert (await http.get(f"{urls[1]}/v1/leader")).json()["leader_url"] == urls[0]
            follow = Controllers([urls[1], urls[0]])
            body = {"name": "second", "spec": {"uri": "s3://thaw/models/second", "shape": "cpu-local"}}
            r = await follow.request(http, "POST", "/v1/admin/models", json=body)
            assert r.status_code == 201, r.text
            assert follow.url == urls[0]

        await watcher.start()
        m = a.manager
        await until("the activator follows the leader's catalog",
                    lambda: bool(catalogs) and "second" in {x.name for x in catalogs[-1].models}, m)
        m.traffic.demand("demo")
        await until("demo is served", lambda: bool(watcher.replicas("demo").listed), m)
        served_by = watcher.replicas("demo").listed[0].worker_id

        # The leader dies: no release, its lease left to run out.
        leadership = a.manager.parts.leadership
        assert leadership is not None
        monkeypatch.setattr(leadership.store, "release", lambda me: None)
        await leadership.close(release=False)
        await a.stop()
        # A cold request arrives while nobody leads: it waits at the activator, which
        # reports it queued; demand signals go nowhere until a leader answers.
        waiting = asyncio.create_task(watcher.acquire(watcher.models["second"], watcher.clock()))
        await until("b leads", lambda: b.manager.leading, b.manager, timeout_s=30)
        assert b.manager.term == 2
        acquired = await asyncio.wait_for(waiting, 60)
        assert acquired.cold
        watcher.release("second", acquired.replica)
        # Hot traffic untouched: the replica serving demo is the same worker, adopted.
        assert served_by in {r.worker_id for r in watcher.replicas("demo").listed}
        # What the dead leader changed, the new one serves (it read the registry on taking over).
        assert b.manager.parts.model_admin.revision("second") == 1
        await until("the workers heartbeat to b", lambda: b.manager.adopted, b.manager)
        # Fenced: a worker that heard of term 2 refuses a call of term 1 (a controller
        # that lost the lease and has not noticed yet).
        worker = next(iter(await provider.instances()))
        await until("the worker heard of term 2", lambda: b.manager.fleet.facts[worker.worker_id].status is not None,
                    b.manager)
        stale = HttpWorkerControl(TOKEN)
        stale.fence(lambda: 1)
        try:
            with pytest.raises(ControlError) as refused:
                await stale.release(worker.control_url, ReleaseRequest(assignment_id="x"))
            assert refused.value.status == 409 and "term 2 leads now" in str(refused.value)
            # A call of the current term whose sender's lease had ended by its own count
            # when the call arrived (it was paused, or the call held on the way): refused
            # too, as a worker that had not heard of the next term yet would have to.
            late = HttpWorkerControl(TOKEN)
            late.fence(lambda: 2, lambda: time.time() - 5.0)
            try:
                with pytest.raises(ControlError) as refused:
                    await late.release(worker.control_url, ReleaseRequest(assignment_id="x"))
                assert refused.value.status == 409 and "lease ended" in str(refused.value)
            finally:
                await late.close()
        finally:
            await stale.close()

        # The decision log: one controller per term, and the new term's first event after
        # the old term's last.
        events = await asyncio.to_thread(ControllerStore(Db.postgres(url)).events)
        by_term: dict[int, set[str]] = {}
        for e in events:
            by_term.setdefault(e.term, set()).add(e.controller)
        assert by_term[1] == {"a"} and by_term[2] == {"b"}, by_term
        last_a = max(e.event.at for e in events if e.term == 1)
        first_b = min(e.event.at for e in events if e.term == 2)
        assert last_a < first_b
        assert any(e.decision and e.term == 2 and e.event.model == "second" for e in events)
        # The same log over the API, from the new leader: the dead one's events too.
        async with httpx.AsyncClient(headers=auth, timeout=5) as http:
            log = (await http.get(f"{urls[1]}/v1/events", params={"history": "true"})).json()["events"]
            recent = (await http.get(f"{urls[1]}/v1/events")).json()["events"]
        assert {(e["controller"], e["term"]) for e in log} >= {("a", 1), ("b", 2)}
        assert all(e["term"] is None for e in recent) and len(recent) < len(log)
    finally:
        await watcher.close()
        await stack.aclose()
        await provider.shutdown()
