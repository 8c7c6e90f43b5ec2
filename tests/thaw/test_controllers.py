"""Following the leader among controllers: told by a follower, or past one that is down."""

from __future__ import annotations

import httpx
import pytest

from thaw.controllers import LEADER_HEADER, Controllers, parse_urls

A, B, C = "http://a:8100", "http://b:8100", "http://c:8100"


def transport(up: dict[str, str | None]) -> tuple[httpx.MockTransport, list[str]]:
    """``up``: host URL -> the leader it names when it follows (None: it leads); a host
    not in ``up`` refuses connections."""
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        seen.append(base)
        if base not in up:
            raise httpx.ConnectError("refused", request=request)
        leader = up[base]
        if leader is None:
            return httpx.Response(200, json={"ok": base})
        headers = {"X-Thaw-Role": "follower", **({LEADER_HEADER: leader} if leader else {})}
        return httpx.Response(503, json={"error": "follows", "leader": leader or None}, headers=headers)

    return httpx.MockTransport(handle), seen


async def test_a_follower_names_the_leader_and_the_client_stays_with_it() -> None:
    mock, seen = transport({A: B, B: None})
    c = Controllers(f"{A},{B}")
    async with httpx.AsyncClient(transport=mock) as http:
        r = await c.request(http, "GET", "/v1/state")
        assert r.status_code == 200 and r.json() == {"ok": B}
        await c.request(http, "GET", "/v1/state")
    assert seen == [A, B, B] and c.url == B


async def test_a_controller_that_is_down_is_passed_over() -> None:
    mock, seen = transport({B: None})
    c = Controllers([A, B])
    async with httpx.AsyncClient(transport=mock) as http:
        assert (await c.request(http, "GET", "/v1/routes")).json() == {"ok": B}
    assert seen == [A, B]


async def test_with_no_leader_the_last_answer_is_the_followers_refusal() -> None:
    # A takeover under way: one follower names nobody, the old leader is down.
    mock, seen = transport({B: ""})
    c = Controllers([A, B])
    async with httpx.AsyncClient(transport=mock) as http:
        r = await c.request(http, "GET", "/v1/routes")
    assert r.status_code == 503 and len(seen) == 5


async def test_all_down_raises_the_connection_error() -> None:
    mock, _ = transport({})
    async with httpx.AsyncClient(transport=mock) as http:
        with pytest.raises(httpx.ConnectError):
            await Controllers([A, B]).request(http, "GET", "/v1/routes")
        with pytest.raises(httpx.ConnectError):
            await Controllers(A).request(http, "GET", "/v1/routes")


async def test_a_leader_outside_the_list_is_followed_too() -> None:
    mock, _ = transport({A: C, C: None})
    c = Controllers(A)
    async with httpx.AsyncClient(transport=mock) as http:
        assert (await c.request(http, "GET", "/x")).json() == {"ok": C}
    assert c.urls == [A, C]
    c = Controllers([A, B])
    async with httpx.AsyncClient(transport=mock) as http:
        assert (await c.request(http, "GET", "/x")).json() == {"ok": C}
    assert c.urls == [A, B, C]


async def test_a_read_on_a_connection_the_controller_closed_is_tried_once_more() -> None:
    # The one controller had closed the kept-alive connection the read went out on.
    broken: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        broken.append(request.method)
        if len(broken) % 2:
            raise httpx.ReadError("", request=request)
        return httpx.Response(200, json={"ok": A})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        assert (await Controllers(A).request(http, "GET", "/v1/batches/b")).json() == {"ok": A}
        assert broken == ["GET", "GET"]
        # Not a write: it may have been carried out before the connection broke.
        with pytest.raises(httpx.ReadError):
            await Controllers(A).request(http, "POST", "/v1/batches")
        assert broken == ["GET", "GET", "POST"]


def test_urls_are_checked() -> None:
    assert parse_urls(" http://a:1/ ,https://b ") == ["http://a:1", "https://b"]
    with pytest.raises(ValueError, match="no controller URL"):
        parse_urls(" , ")
    with pytest.raises(ValueError, match="must start with http"):
        parse_urls("a:8100")
