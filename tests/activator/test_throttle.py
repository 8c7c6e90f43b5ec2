"""Bad-key throttling per client address: the bucket's arithmetic (time passed in), its
bounded memory, and the app: 401s, then 429 with Retry-After, while a valid key from
the same address is served as ever."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from activator.app import create_app
from activator.limits import Bucket
from activator.throttle import Address, FailedAuthThrottle, Verdict, spend
from tests.activator.support import KEY, assert_openai_error, make_config
from thaw.config import FailedAuthThrottle as FailedAuthConfig
from thaw.embedded_store import free_port

CFG = FailedAuthConfig(burst=3, refill_per_s=0.5, max_addresses=2)


def at(tokens: float, t: float, refusing: bool = False) -> Address:
    return Address(Bucket(CFG.burst, tokens, t, CFG.refill_per_s), refusing)


@pytest.mark.parametrize("address, now, verdict, after", [
    # Unseen: a full bucket of 3, one spent.
    (None, 10.0, Verdict(0.0), at(2.0, 10.0)),
    # 0.5 left, 1 s later: 0.5 + 1 * 0.5 = 1 -> spent, allowed.
    (at(0.5, 9.0), 10.0, Verdict(0.0), at(0.0, 10.0)),
    # 0 left, 1 s later: 0.5 < 1 -> refused; (1 - 0.5) / 0.5 = 1 s to a whole token.
    (at(0.0, 9.0), 10.0, Verdict(1.0, newly_throttled=True), at(0.5, 10.0, refusing=True)),
    # Refused before too: not newly throttled (logged once); (1 - 0) / 0.5 = 2 s.
    (at(0.0, 10.0, refusing=True), 10.0, Verdict(2.0), at(0.0, 10.0, refusing=True)),
    # A long quiet: refilled to the burst, no more: min(3, 0 + 100 * 0.5) - 1 = 2.
    (at(0.0, 0.0, refusing=True), 100.0, Verdict(0.0), at(2.0, 100.0)),
])
def test_spend(address: Address | None, now: float, verdict: Verdict, after: Address) -> None:
    before = repr(address)
    assert spend(address, now, CFG) == (verdict, after)
    assert repr(address) == before  # a new state; the old one is untouched


def test_the_burst_then_one_per_refill_from_one_address() -> None:
    now = [0.0]
    throttle = FailedAuthThrottle(CFG, clock=lambda: now[0])
    assert [throttle.failed("a").retry_after_s for _ in range(4)] == [0.0, 0.0, 0.0, 2.0]
    now[0] = 2.0  # one token back
    assert throttle.failed("a").retry_after_s == 0.0
    assert throttle.failed("a").retry_after_s > 0
    assert throttle.failed("b").retry_after_s == 0.0  # another address has its own


def test_memory_is_bounded_and_the_least_recently_seen_is_forgotten() -> None:
    throttle = FailedAuthThrottle(CFG, clock=lambda: 0.0)
    for _ in range(4):
        throttle.failed("a")
    assert throttle.failed("a").retry_after_s > 0
    throttle.failed("b")
    throttle.failed("a")  # a is the most recent again
    throttle.failed("c")  # max_addresses 2: b goes
    assert len(throttle) == 2
    assert throttle.failed("a").retry_after_s > 0  # still remembered
    throttle.failed("d")  # c goes; then a, the oldest now
    throttle.failed("e")
    assert throttle.failed("a").retry_after_s == 0.0  # forgotten: a fresh burst


# -- the app ----------------------------------------------------------------------------
@pytest.fixture
async def app() -> AsyncIterator[Any]:
    cfg = make_config()
    server = cfg.server.model_copy(update={"failed_auth": FailedAuthConfig(burst=3, refill_per_s=0.01)})
    app = create_app(cfg.model_copy(update={"server": server}), f"http://127.0.0.1:{free_port()}",
                     activator_id="th")
    yield app
    await app.state.routes.close()
    await app.state.service.close()
    app.state.ledger.close()


def client(app: Any, address: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(address, 1234)), base_url="http://act")


def counted(app: Any, outcome: str) -> float:
    value = app.state.metrics.registry.get_sample_value("thaw_auth_failures_total", {"outcome": outcome})
    return value or 0.0


async def test_bad_keys_from_one_address_get_429_but_a_valid_key_is_served(app: Any) -> None:
    async with client(app, "10.0.0.1") as c:
        # Missing, malformed and wrong keys all count: 3 x 401 (the burst)...
        for headers in ({}, {"Authorization": "Basic x"}, {"Authorization": "Bearer wrong"}):
            assert_openai_error(await c.get("/v1/models", headers=headers), 401, "invalid_api_key")
        # ...then 429 with Retry-After, on the completion path (the edge) too.
        r = await c.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        err = assert_openai_error(r, 429, "too_many_failed_auth")
        # (1 - 0.0...) / 0.01 per s: about 100 s to a whole token.
        assert 90 <= int(r.headers["retry-after"]) <= 100
        assert err["type"] == "rate_limit_exceeded"
        r = await c.post("/v1/chat/completions", json={"model": "thaw-demo", "messages": []})
        assert_openai_error(r, 429, "too_many_failed_auth")
        assert r.headers["retry-after"]
        # A valid key from the same address: checked and served as ever.
        for path in ("/v1/models", "/v1/models/thaw-demo", "/v1/usage"):
            r = await c.get(path, headers={"Authorization": f"Bearer {KEY}"})
            assert r.status_code == 200, r.text
    async with client(app, "10.0.0.2") as other:
        assert_openai_error(await other.get("/v1/models"), 401, "invalid_api_key")
    assert (counted(app, "refused"), counted(app, "throttled")) == (4.0, 2.0)
