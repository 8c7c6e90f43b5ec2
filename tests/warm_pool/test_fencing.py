"""Fencing (warm_pool.fencing) on a real PostgreSQL: a controller whose term is over
changes nothing, whatever it believes.

The row: a fenced write and a provider action are refused once another controller holds
the lease, in the database's own transaction. The controller: one that still believes it
leads (its renewals stopped and its own count wrong, as after a long pause, before it
next looks) has its registry change answered as a follower's (503, where the leader is;
the client follows and the change lands once, at the leader) and its launch never
reaches the provider; the terms and actions are on record for a history checker."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from pathlib import Path

import httpx
import pytest

from tests.warm_pool.in_process import (
    TOKEN,
    InProcessProvider,
    fleet_config,
    on_postgres,
    until,
)
from thaw.controllers import LEADER_HEADER, Controllers
from thaw.embedded_store import free_port
from warm_pool.batch.store import BatchStore
from warm_pool.conversations.store import ResponseStore
from warm_pool.db import Db
from warm_pool.fencing import ACTIONS_RETAINED_S, ActionLog, Deposed, LeaseFence
from warm_pool.leader import LeaseStore
from warm_pool.persist import ControllerStore
from warm_pool.policy.decide import Snapshot
from warm_pool.policy.decisions import Launch

LEASE_S = 3.0


def expire_lease(url: str) -> None:
    """The lease runs out now (what the database sees of a leader that stopped renewing)."""
    db = Db.postgres(url)
    try:
        with db.write(fenced=False) as tx:
            tx.execute("UPDATE controller_lease SET expires_at = 0")
    finally:
        db.close()


def test_a_deposed_term_writes_nothing_and_acts_on_nothing(postgres_url: str) -> None:
    db_a, db_b = Db.postgres(postgres_url), Db.postgres(postgres_url)
    store = ControllerStore(db_a)
    leases = LeaseStore(Db.postgres(postgres_url))
    a_term: list[int | None] = [None]
    db_a.fence = LeaseFence("a", lambda: a_term[0]).check
    fence_b = LeaseFence("b", lambda: 2)
    db_b.fence = fence_b.check
    actions_a = ActionLog(db_a, "a", LeaseFence("a", lambda: a_term[0]))
    actions_b = ActionLog(db_b, "b", fence_b)

    with pytest.raises(Deposed, match="does not lead"):  # nobody leads yet
        store.save_budget({"total_usd_per_hour": 1.0})
    lease, mine = leases.claim("a", "http://a", 30.0)
    assert mine and lease is not None and lease.term == 1
    a_term[0] = 1
    store.save_budget({"total_usd_per_hour": 1.0})
    launched = actions_a.begin(1, "launch", worker_id="w-1", shape="cpu-local")
    actions_a.end(launched, "done", "i-1")

    expire_lease(postgres_url)
    lease, mine = leases.claim("b", "http://b", 30.0)
    assert mine and lease is not None and lease.term == 2
    # ``a`` still believes it leads in term 1: the database says otherwise.
    with pytest.raises(Deposed, match="b leads in term 2") as refused:
        store.save_budget({"total_usd_per_hour": 99.0})
    assert refused.value.leader_url == "http://b"
    assert store.load_budget() == {"total_usd_per_hour": 1.0}
    with pytest.raises(Deposed):
        actions_a.begin(1, "launch", worker_id="w-2", shape="cpu-local")
    # Every store on the database is fenced the same way: a batch line's lease, the purge
    # of stored responses.
    with pytest.raises(Deposed):
        BatchStore(db_a).lease("act-1", ["demo"], 1, time.time(), 30.0, renew=[("batch_1", 0)])
    with pytest.raises(Deposed):
        ResponseStore(db_a).purge(time.time())
    # The new term acts; an expired lease stops even its holder.
    actions_b.begin(2, "terminate", worker_id="w-1", instance_id="i-1", shape="cpu-local")
    expire_lease(postgres_url)
    with pytest.raises(Deposed, match="ran out"):
        actions_b.begin(2, "terminate", worker_id="w-1", instance_id="i-1", shape="cpu-local")

    log = ActionLog(Db.postgres(postgres_url), "reader", None)
    assert [(t.term, t.holder, t.url) for t in log.terms()] == [(1, "a", "http://a"), (2, "b", "http://b")]
    assert [(x.term, x.kind, x.worker_id, x.instance_id, x.outcome) for x in log.actions()] == [
        (1, "launch", "w-1", "i-1", "done"), (2, "terminate", "w-1", "i-1", None)]
    # Kept for a month, as the decision log is: an older action is deleted as one is written.
    with db_b.write(fenced=False) as tx:
        tx.execute("UPDATE controller_actions SET at = at - ? WHERE worker_id = 'w-1' AND kind = 'launch'",
                   (ACTIONS_RETAINED_S + 1,))
    log.begin(None, "launch", worker_id="w-9", shape="cpu-local")
    assert [(x.kind, x.worker_id) for x in log.actions()] == [("terminate", "w-1"), ("launch", "w-9")]


async def test_a_leader_that_has_not_noticed_its_deposition_changes_nothing(
    postgres_url: str, tmp_path: Path,
) -> None:
    ports = free_port(), free_port()
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    provider = InProcessProvider(tmp_path / "workers", ",".join(urls))
    cfg = fleet_config(idle_grace_s=120)

    one = on_postgres(cfg, provider, postgres_url, LEASE_S)

    auth = {"Authorization": f"Bearer {TOKEN}", "X-Thaw-Actor": "ops@test"}
    stack = contextlib.AsyncExitStack()
    try:
        a = await stack.enter_async_context(one("a", ports[0]))
        await until("a leads", lambda: a.manager.leading, a.manager)
        await until("a has launched its standby", lambda: provider.launched == 1, a.manager)
        b = await stack.enter_async_context(one("b", ports[1]))
        # ``a`` stalls where its own count cannot see it: no more renewals, and it still
        # believes it leads (as between a long pause's end and its next look at the lease).
        leadership = a.manager.parts.leadership
        assert leadership is not None and leadership._task is not None
        leadership._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leadership._task
        leadership._valid_until = math.inf
        await asyncio.to_thread(expire_lease, postgres_url)
        await until("b leads", lambda: b.manager.leading and b.manager.term == 2, b.manager, timeout_s=30)
        assert a.manager.leading and a.manager.term == 1

        body = {"name": "second", "spec": {"uri": "s3://thaw/models/second", "shape": "cpu-local"}}
        async with httpx.AsyncClient(headers=auth, timeout=5) as http:
            r = await http.post(f"{urls[0]}/v1/admin/models", json=body)
            assert r.status_code == 503, r.text
            assert r.headers["X-Thaw-Role"] == "follower" and r.headers[LEADER_HEADER] == urls[1]
            assert "no longer leads" in r.json()["error"] and r.json()["leader"] == urls[1]
            assert "second" not in {m["name"] for m in (await http.get(f"{urls[1]}/v1/admin/models")).json()["models"]}
            # A client that called the deposed one follows it to the leader: the change lands once.
            follow = Controllers([urls[0], urls[1]])
            r = await follow.request(http, "POST", "/v1/admin/models", json=body)
            assert r.status_code == 201, r.text
            assert follow.url == urls[1]
        assert b.manager.parts.model_admin.revision("second") == 1

        # Its launch is refused before the provider is called.
        launched = provider.launched
        a.manager.actuator.carry_out(Launch("cpu-local", "standby"), Snapshot(workers=()), {}, a.manager.clock())
        await a.manager.actuator.settle()
        assert provider.launched == launched
        refused = a.manager.parts.metrics.fenced.labels("launch", "deposed")._value.get()
        assert refused == 1
        actions = await asyncio.to_thread(ActionLog(Db.postgres(postgres_url), "reader", None).actions)
        assert [(x.term, x.kind) for x in actions] == [(1, "launch")] * len([x for x in actions])
        assert all(x.controller == "a" and x.outcome == "done" for x in actions)
    finally:
        await stack.aclose()
        await provider.shutdown()
