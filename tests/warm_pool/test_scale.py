"""The control plane at a thousand models (issue 45's middle size), with the simulated
fleet's workers (loadtests/sim_fleet.py) heartbeating to the controller's real app and
loop, and requests through the activator's real app.

A thousand models at zero on a pool of fifty workers, one request each: every one is
answered by its own model, the pool's idle replicas of other models evicted for the
models that wait. And two controllers on one PostgreSQL with a thousand models and a
hundred workers, eighty of them serving: the leader dies, the follower takes over and
adopts the fleet (some workers heard only after its adoption grace), and every worker
keeps its assignment, the route table the same replicas."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.warm_pool.at_scale import (
    API_KEY,
    activator,
    name,
    ready_replicas,
    scale_config,
    served,
    sim_fleet,
)
from tests.warm_pool.in_process import Controller, controller, states, steps_pass, until
from thaw.embedded_store import free_port
from warm_pool.db import Db
from warm_pool.leader import LeaseStore
from warm_pool.providers.static import StaticProvider

MODELS, WORKERS = 1000, 50
# Clients at once, each asking for the next model at zero when its answer is in. A
# replica is held about 2 s after its request's demand signal (the controller counts
# the signal as a queued request until then), so the fleet turns over some 20 models a
# second and every client waits about as long for an idle replica to be evicted for
# it: within the 3 s after which a model with nothing to take is refused
# (warm_pool.policy.evict.CAPACITY_GRACE_S), and a refusal is retried anyway.
CLIENTS = 40
TOKENS = 3
# How long a client retries a model refused for capacity: a model still refused after
# this is an answer that fails the test, not a test that never ends.
REFUSED_FOR_S = 60.0


@dataclass(frozen=True)
class Answer:
    model: str
    status: int
    chunks: list[dict[str, object]]
    done: bool
    refusals: int  # 503 pool_at_capacity answers retried after their Retry-After


async def ask(http: aiohttp.ClientSession, base: str, model: str) -> Answer:
    """One streamed chat completion of ``model``, retried as a client should on a 503
    ``pool_at_capacity`` (after its Retry-After), for up to REFUSED_FOR_S; then the
    refusal is its answer. (aiohttp, not httpx: a thousand streams through httpx's
    connection pool cost this one-process test seconds of CPU.)"""
    body = {"model": served(model), "stream": True, "max_tokens": TOKENS,
            "messages": [{"role": "user", "content": "hi"}]}
    refusals = 0
    deadline = time.monotonic() + REFUSED_FOR_S
    while True:
        async with http.post(f"{base}/v1/chat/completions", json=body) as r:
            raw = [line.decode().rstrip("\n") async for line in r.content]
        if r.status == 503 and '"pool_at_capacity"' in "".join(raw) and time.monotonic() < deadline:
            refusals += 1
            await asyncio.sleep(float(r.headers["Retry-After"]))  # not a poll: the client honours Retry-After
            continue
        data = [line[6:] for line in raw if line.startswith("data: ")]
        chunks = [json.loads(d) for d in data if d != "[DONE]"]
        return Answer(model, r.status, chunks, bool(data) and data[-1] == "[DONE]", refusals)


async def test_a_thousand_models_at_zero_on_fifty_workers_each_answer_their_request(tmp_path: Path) -> None:
    # Keep-alives of ten minutes: a replica is given up only for a waiting model (a full
    # pool's idle replicas are held by nothing else). Heartbeats every 5 s (a change of
    # state is sent at once): what a thousand models cost this test is their cold starts,
    # not idle bookkeeping.
    cfg = scale_config(tmp_path, models=MODELS, workers=WORKERS, idle_grace_s=600, heartbeat_s=5.0)
    async with controller(cfg, StaticProvider(), free_port(), adopt_grace_s=3.0) as c, \
            sim_fleet(c.url, WORKERS, load_s=0.05) as fleet, activator(cfg, c.url) as act:
        m = c.manager
        await until("every simulated worker adopted, standing by",
                    lambda: m.adopted and list(states(m).values()) == ["standby"] * WORKERS, m, timeout_s=60)
        queue = [name(i) for i in range(MODELS)]
        answers: list[Answer] = []
        asking: set[str] = set()

        async def client() -> None:
            while queue:
                model = queue.pop(0)
                asking.add(model)
                answers.append(await ask(http, act, model))
                asking.discard(model)

        started = time.monotonic()
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_KEY}"},
                                         timeout=aiohttp.ClientTimeout(total=180)) as http:
            try:
                async with asyncio.timeout(300):
                    await asyncio.gather(*(client() for _ in range(CLIENTS)))
            except TimeoutError:
                pytest.fail(f"{len(answers)} of {MODELS} answered in 300 s; still asking for {sorted(asking)[:10]}: "
                            f"{m.status().model_dump_json()[:4000]}")
        took = time.monotonic() - started
        stats = fleet.stats()
        evicted = [e for e in m.parts.event_log.events if e.kind == "release" and e.reason == "evicted"]

    # Every model answered, whole, by an engine of its own (its served name on every chunk).
    assert len(answers) == MODELS
    wrong = [(a.model, a.status) for a in answers if a.status != 200 or not a.done or len(a.chunks) != TOKENS
             or any(ch["model"] != served(a.model) for ch in a.chunks)]
    assert wrong == [], f"{len(wrong)} of {MODELS} not answered whole by their model: {wrong[:10]}"
    # Twenty times the models the fleet has, and nothing but an eviction frees a worker
    # (keep-alives of ten minutes): every model after the first fifty took a worker whose
    # idle replica was evicted for it (1,000 - 50 = 950 at least), each eviction logged
    # with the model it made room for.
    metric = m.parts.registry.get_sample_value("thaw_pool_decisions_total", {"kind": "release", "reason": "evicted"})
    assert stats["assigns"] >= MODELS and stats["releases"] >= MODELS - WORKERS, stats
    assert metric is not None and metric >= MODELS - WORKERS, (metric, stats)
    # (The log keeps its last 5,000 events: the most recent evictions.)
    assert evicted and all(e.inputs["for_model"] not in (None, e.model) for e in evicted)
    print(f"{MODELS} models on {WORKERS} workers in {took:.1f} s: {metric:.0f} evictions, "
          f"{sum(a.refusals for a in answers)} refusals retried")


TAKEOVER_WORKERS, SERVING, LATE = 100, 80, 10
# As in test_leader_fleet: long enough that a loaded machine does not stall a renewal
# past it (a lease lost and taken back would start a third term mid-test).
LEASE_S = 3.0


async def test_a_takeover_at_a_thousand_models_keeps_every_assignment(
        postgres_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Keep-alives of an hour: every replica stays across the takeover.
    cfg = scale_config(tmp_path, models=MODELS, workers=TAKEOVER_WORKERS, idle_grace_s=3600)
    ports = free_port(), free_port()
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    # The adoption grace `thaw controller` takes: a heartbeat interval and a half, and 0.5 s.
    grace_s = cfg.cluster.heartbeat_interval_s * 1.5 + 0.5

    def one(controller_id: str, port: int) -> contextlib.AbstractAsyncContextManager[Controller]:
        return controller(cfg, StaticProvider(), port, state_db=Db.postgres(postgres_url),
                          lease=LeaseStore(Db.postgres(postgres_url)), url=f"http://127.0.0.1:{port}",
                          controller_id=controller_id, lease_s=LEASE_S, adopt_grace_s=grace_s)

    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(one("a", ports[0]))
        await until("a leads", lambda: a.manager.leading, a.manager, timeout_s=30)
        b = await stack.enter_async_context(one("b", ports[1]))
        # The workers are told the follower's URL first: they find the leader themselves.
        fleet = await stack.enter_async_context(sim_fleet(f"{urls[1]},{urls[0]}", TAKEOVER_WORKERS, load_s=0.05))
        m = a.manager
        await until("every simulated worker adopted by a, standing by",
                    lambda: m.adopted and list(states(m).values()) == ["standby"] * TAKEOVER_WORKERS, m, timeout_s=60)
        assert len(m.cfg.models) == MODELS and not b.manager.leading
        serving = [name(i * (MODELS // SERVING)) for i in range(SERVING)]  # spread over the registry
        for model in serving:
            m.traffic.demand(model)
        await until(f"{SERVING} models ready in a's route table",
                    lambda: len(ready_replicas(m.feed.table)) == SERVING, m, timeout_s=60)
        before = ready_replicas(m.feed.table)
        assigned = {wid: w.assignment.assignment_id for wid, w in fleet.workers.items() if w.assignment}
        assert {r[0] for r in before} == set(serving) and len(assigned) == SERVING
        assert {r[3] for r in before} == set(assigned.values())

        # The leader dies: no release of its lease, left to run out. A few serving
        # workers are heard by the new leader only after its adoption grace (on a static
        # pool it knows no worker it could wait for).
        late = sorted(assigned)[:LATE]
        for wid in late:
            fleet.workers[wid].silent = True
        leadership = m.parts.leadership
        assert leadership is not None
        monkeypatch.setattr(leadership.store, "release", lambda me: None)
        await leadership.close(release=False)
        await a.stop()
        nb = b.manager
        await until("b leads", lambda: nb.leading, nb, timeout_s=30)
        assert nb.term == 2 and len(nb.cfg.models) == MODELS
        await until("b adopted the fleet", lambda: nb.adopted, nb, timeout_s=60)
        assert not set(late) & set(nb.fleet.facts)
        for wid in late:
            fleet.workers[wid].silent = False
            fleet.workers[wid].changed.set()
        await until("b routes every replica a routed", lambda: ready_replicas(nb.feed.table) == before, nb,
                    timeout_s=60)
        # Every model found serving counts as used when found (its idle grace starts anew):
        # nothing is released because the leader changed.
        assert set(nb.traffic.adopted_serving) == set(serving)
        await steps_pass(nb, 10)

        # Nothing released, nothing assigned again: each worker holds the assignment it had.
        assert fleet.stats()["releases"] == 0 and fleet.stats()["assigns"] == SERVING, fleet.stats()
        assert {wid: w.assignment.assignment_id for wid, w in fleet.workers.items() if w.assignment} == assigned
        assert ready_replicas(nb.feed.table) == before
        # (While the late ones were unheard it asked the static pool for standbys, in vain.)
        decided = [e for e in nb.parts.event_log.events if e.kind in ("assign", "release")]
        assert decided == [], decided[:5]
