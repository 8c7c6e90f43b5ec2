"""Limits shared across activators in a real Redis, and what happens when it goes away.

Each test starts its own ``redis-server`` on a free loopback port. Without one on PATH
the tests fail (they do not skip): ``apt-get install redis-server``, or run
``scripts/test``, which installs it where it can.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import structlog
from fastapi import FastAPI, Query, Request, Response
from prometheus_client import CollectorRegistry

from activator.app import create_app
from activator.errors import TooManyRequests
from activator.ledger import query_usage
from activator.limits import Admission
from activator.limits_redis import RedisLimiter
from activator.metrics import ActivatorMetrics
from tests.activator.fake_engine import FakeEngine, serve, serve_app
from tests.activator.support import KEY, make_config, replica, table
from tests.redis_server import RedisServer
from tests.waiting import until
from thaw.config import LimitsConfig, RateLimits, parse_config
from thaw.wire import KeyTable


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    d = tmp_path / "redis"
    d.mkdir()
    server = RedisServer(d)
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.resume()  # a stopped (SIGSTOP) process does not act on SIGTERM
        server.stop()


def limits_config(url: str, **kw: Any) -> LimitsConfig:
    # Generous call budget: this machine may be busy; the timeout test sets its own.
    return LimitsConfig(**{"backend": "redis", "url": url, "timeout_ms": 2000, "retry_interval_s": 0.1, **kw})


@pytest.fixture
async def limiters(redis_server: RedisServer) -> AsyncIterator[Callable[..., RedisLimiter]]:
    """Makes RedisLimiters on the test's Redis (each one as one activator), closes them."""
    made: list[RedisLimiter] = []

    def make(*, start: bool = True, activators: int = 2, **cfg: Any) -> RedisLimiter:
        lim = RedisLimiter(limits_config(redis_server.url, **cfg), ActivatorMetrics(CollectorRegistry()),
                           owner=f"act{len(made)}", activators=lambda: activators)
        made.append(lim)
        return lim

    yield make
    for lim in made:
        await lim.close()


async def admit(lim: RedisLimiter, limits: RateLimits, tokens: int = 0) -> Admission:
    return await lim.admit("t", "m", limits, tokens, time.time())


async def refused(lim: RedisLimiter, limits: RateLimits, tokens: int = 0) -> TooManyRequests:
    with pytest.raises(TooManyRequests) as info:
        await admit(lim, limits, tokens)
    return info.value


def degraded(lim: RedisLimiter) -> float:
    return lim.metrics.registry.get_sample_value("thaw_limits_degraded") or 0.0


# -- shared buckets ---------------------------------------------------------------------

async def test_two_activators_share_one_request_bucket(limiters: Callable[..., RedisLimiter]) -> None:
    a, b = limiters(), limiters()
    await a.start()
    await b.start()
    lim = RateLimits(requests_per_minute=10)
    remaining = []
    for i in range(10):
        adm = await admit(a if i % 2 else b, lim)
        remaining.append(int(adm.headers["x-ratelimit-remaining-requests"]))
    # One bucket of 10 across both, not 10 each: 9 left after the first, 0 after the tenth.
    assert remaining == list(range(9, -1, -1))
    for lim_ in (a, b):
        err = await refused(lim_, lim)
        assert err.code == "rate_limit_requests" and "10 requests per minute" in err.message
        # Empty, refilled at 10/min: one request in at most 60 / 10 = 6 s.
        assert err.retry_after_s is not None and 5.0 < err.retry_after_s <= 6.0
        assert err.headers["x-ratelimit-limit-requests"] == "10"
        assert err.headers["x-ratelimit-remaining-requests"] == "0"
    # Another tenant has a bucket of its own.
    await a.admit("u", "m", lim, 0, time.time())
    assert degraded(a) == 0 and degraded(b) == 0


async def test_two_activators_share_one_token_bucket(limiters: Callable[..., RedisLimiter]) -> None:
    a, b = limiters(), limiters()
    lim = RateLimits(tokens_per_minute=100)
    first = await admit(a, lim, 30)
    await admit(b, lim, 30)
    await admit(a, lim, 30)
    # 100 - 3 x 30 = 10 left, 30 wanted: 20 tokens at 100/min = 12 s.
    err = await refused(b, lim, 30)
    assert err.code == "rate_limit_tokens"
    assert err.retry_after_s == pytest.approx(12.0, abs=0.1)
    # The first used 10 of its 30: 20 come back, in the bucket both share.
    await a.settle(first, 10, time.time())
    await admit(b, lim, 30)
    err = await refused(a, lim, 500)
    assert err.code == "tokens_exceeded" and "limit of 100 tokens per minute" in err.message


# -- concurrency leases -----------------------------------------------------------------

async def test_concurrency_leases_are_shared_and_given_back(limiters: Callable[..., RedisLimiter]) -> None:
    a, b = limiters(), limiters()
    lim = RateLimits(max_concurrent_requests=2)
    held = await admit(a, lim)
    await admit(b, lim)
    for x in (a, b):
        err = await refused(x, lim)
        assert err.code == "concurrency_limit_exceeded" and err.retry_after_s == 1.0
    await a.settle(held, None, time.time())
    assert not a.held
    await admit(b, lim)  # the slot a gave back


async def test_a_dead_activators_leases_lapse_and_a_live_ones_do_not(
    limiters: Callable[..., RedisLimiter], redis_server: RedisServer
) -> None:
    live = limiters(lease_ttl_s=1.0)
    dead = limiters(lease_ttl_s=1.0)
    await live.start()  # refreshes its leases every 1/3 s; `dead` never does
    lim = RateLimits(max_concurrent_requests=2)
    long_stream = await admit(live, lim)
    await admit(dead, lim)  # never settled: its activator died
    assert (await refused(live, lim)).code == "concurrency_limit_exceeded"
    t0 = time.monotonic()

    async def slot_free() -> bool:
        try:
            await admit(live, lim)
            return True
        except TooManyRequests:
            return False

    await until("the dead activator's lease lapsed", slot_free, 10.0)
    # The dead lease lasted its TTL; the live one, refreshed, outlived it.
    assert time.monotonic() - t0 >= 0.8
    await asyncio.sleep(1.5)  # quiet: past the live lease's first TTL, only refreshes keep it
    assert (await refused(live, lim)).code == "concurrency_limit_exceeded"
    await live.settle(long_stream, None, time.time())
    client = redis.Redis(port=redis_server.port, decode_responses=True)
    try:
        leases = client.zrange(live.keys("t", "m")[1], 0, -1)
        assert isinstance(leases, list) and len(leases) == 1 and str(leases[0]).startswith("act0:")
    finally:
        client.close()


async def test_idle_buckets_vanish(limiters: Callable[..., RedisLimiter], redis_server: RedisServer) -> None:
    a = limiters()
    await admit(a, RateLimits(requests_per_minute=6000))
    client = redis.Redis(port=redis_server.port)
    try:
        buckets = a.keys("t", "m")[0]
        # 1 of 6000/min is back within 10 ms; the key lives that long plus a second.
        ttl = client.pttl(buckets)
        assert isinstance(ttl, int) and 0 < ttl <= 1100
    finally:
        client.close()


# -- degraded mode ----------------------------------------------------------------------

async def test_redis_stopped_degrades_to_this_activators_share_then_recovers(
    limiters: Callable[..., RedisLimiter], redis_server: RedisServer
) -> None:
    a = limiters(activators=2)
    await a.start()
    lim = RateLimits(requests_per_minute=10, max_concurrent_requests=20)
    before = [await admit(a, lim) for _ in range(3)]
    redis_server.stop()
    with structlog.testing.capture_logs() as logs:
        # ceil(10 / 2) = 5 requests per minute for this activator while Redis is away.
        granted = [await admit(a, lim) for _ in range(5)]
        assert all(int(g.headers["x-ratelimit-limit-requests"]) == 5 for g in granted)
        err = await refused(a, lim)
        assert err.code == "rate_limit_requests" and "5 requests per minute" in err.message
        # Settling what Redis granted, while it is away, raises nothing (those leases lapse).
        for adm in before + granted:
            await a.settle(adm, None, time.time())
    assert degraded(a) == 1
    assert a.metrics.registry.get_sample_value("thaw_limits_degraded_admissions_total") == 6
    warnings = [e for e in logs if e["event"] == "limits_degraded"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    assert warnings[0]["activators"] == 2

    with structlog.testing.capture_logs() as logs:
        redis_server.start()  # empty: a fresh bucket
        await until("the limiter left degraded mode", lambda: degraded(a) == 0, 10.0)
    assert [e["log_level"] for e in logs if e["event"] == "limits_restored"] == ["info"]
    adm = await admit(a, lim)
    assert adm.headers["x-ratelimit-limit-requests"] == "10"  # shared again


async def test_redis_too_slow_is_degraded_mode_within_the_call_budget(
    limiters: Callable[..., RedisLimiter], redis_server: RedisServer
) -> None:
    a = limiters(activators=3, timeout_ms=200)
    lim = RateLimits(requests_per_minute=10)
    await admit(a, lim)
    redis_server.pause()
    try:
        t0 = time.monotonic()
        adm = await admit(a, lim)
        # ceil(10 / 3) = 4, decided after at most the 200 ms budget (plus this machine's slack).
        assert adm.headers["x-ratelimit-limit-requests"] == "4"
        assert time.monotonic() - t0 < 2.0
        assert degraded(a) == 1
    finally:
        redis_server.resume()


async def test_tenants_without_limits_never_reach_redis(limiters: Callable[..., RedisLimiter],
                                                        redis_server: RedisServer) -> None:
    a = limiters()
    redis_server.stop()
    adm = await admit(a, RateLimits())
    assert adm.headers == {} and degraded(a) == 0


# -- two activators, one controller, one Redis ------------------------------------------

class FakeController:
    """What activators need of the controller: a route table naming the replica and
    the number of activators, an empty key table, and somewhere to post reports."""

    def __init__(self, engine_url: str, activators: int) -> None:
        self.table = table(1, [replica(engine_url)]).model_copy(update={"activators": activators})
        app = FastAPI()

        @app.get("/v1/routes")
        async def routes(since: int = Query(-1), wait_s: float = Query(0.0)) -> Response:
            if since >= self.table.version:
                await asyncio.sleep(min(wait_s, 0.5))  # a long poll with nothing new
            return Response(self.table.model_dump_json(), media_type="application/json")

        @app.get("/v1/keys")
        async def keys() -> Response:
            return Response(KeyTable(version=0, keys=[]).model_dump_json(), media_type="application/json")

        @app.post("/v1/{what}")
        async def report(what: str, request: Request) -> Response:
            return Response(status_code=204)

        self.app = app


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    with serve(FakeEngine("one", tokens=2)) as url:
        yield url


async def test_two_activators_one_redis_then_redis_stops(engine_url: str, redis_server: RedisServer,
                                                         tmp_path: Path) -> None:
    data = make_config(tmp_path).model_dump(mode="json")
    data["tenants"][0]["limits"] = {"requests_per_minute": 4}
    data["limits"] = {"backend": "redis", "url": redis_server.url, "timeout_ms": 2000, "retry_interval_s": 0.2}
    cfg = parse_config(data)
    controller = FakeController(engine_url, activators=2)
    chat = {"model": "thaw-demo", "messages": [{"role": "user", "content": "hi"}]}
    sent: dict[int, dict[str, int]] = {0: {}, 1: {}}  # activator -> request id -> status

    with serve_app(controller.app, lifespan="on") as pool_url:
        apps = [create_app(cfg, pool_url, activator_id=f"act{i}") for i in range(2)]
        with serve_app(apps[0], lifespan="on") as url0, serve_app(apps[1], lifespan="on") as url1:
            urls = [url0, url1]
            await until("both activators have the controller's table",
                        lambda: all(a.state.routes.feed.activators == 2 and a.state.routes.replicas("demo").usable
                                    for a in apps), 20.0)
            async with httpx.AsyncClient(timeout=30) as client:
                async def send(i: int, rid: str) -> httpx.Response:
                    r = await client.post(f"{urls[i]}/v1/chat/completions", json=chat,
                                          headers={"Authorization": f"Bearer {KEY}", "x-request-id": rid})
                    sent[i][rid] = r.status_code
                    return r

                # 4 per minute for the tenant across both activators (each admitted
                # request would have been 4 per activator with local limits: 8).
                for n in range(4):
                    r = await send(n % 2, f"shared-{n}")
                    assert r.status_code == 200, r.text
                    assert r.headers["x-ratelimit-remaining-requests"] == str(3 - n)
                for i in (0, 1):
                    r = await send(i, f"shared-over-{i}")
                    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_requests"
                    assert int(r.headers["retry-after"]) >= 1

                redis_server.stop()
                # Each activator alone: ceil(4 / 2) = 2 per minute, served all the same.
                for i in (0, 1):
                    for n in range(2):
                        r = await send(i, f"degraded-{i}-{n}")
                        assert r.status_code == 200, r.text
                        assert r.headers["x-ratelimit-limit-requests"] == "2"
                    r = await send(i, f"degraded-over-{i}")
                    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_requests"
                    metrics = (await client.get(f"{urls[i]}/metrics")).text
                    assert "thaw_limits_degraded 1.0" in metrics
                    assert "thaw_limits_degraded_admissions_total 3.0" in metrics

    # Every request answered, served or refused, is in its activator's ledger.
    for i, app in enumerate(apps):
        records = {r["request_id"]: r["status"] for r in query_usage(app.state.ledger.path)}
        assert records == sent[i]
    assert sum(s == 200 for s in sent[0].values()) + sum(s == 200 for s in sent[1].values()) == 4 + 4


def test_redis_server_missing_is_a_failure_not_a_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="apt-get install redis-server"):
        RedisServer(tmp_path)
