"""A streamed request held for a cold start: progress comments before its first token,
its answer after them, a refusal after the 200 as an error event, a client that leaves
while held, and a proxy with an idle limit shorter than the cold start.

The activator runs under uvicorn on the test's own event loop (its route table is
applied there, as its controller feed would); the fake engine in a thread of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from activator.app import create_app
from activator.context import RequestContext
from activator.held import held_phase, progress_comment, ready_comment
from activator.ledger import query_usage
from tests.activator.fake_engine import FakeEngine, serve
from tests.activator.idle_proxy import idle_limited_proxy
from tests.activator.support import KEY, make_config, replica, served_in_this_loop, table
from tests.waiting import until
from thaw.config import ThawConfig
from thaw.embedded_store import free_port

INTERVAL_S = 0.2
CHAT = {"model": "thaw-demo", "messages": [{"role": "user", "content": "hi"}], "stream": True}
AUTH = {"Authorization": f"Bearer {KEY}"}


def with_interval(cfg: ThawConfig, interval_s: float) -> ThawConfig:
    return cfg.model_copy(update={"server": cfg.server.model_copy(update={"held_progress_interval_s": interval_s})})


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[FakeEngine, str]]:
    e = FakeEngine("held")
    with serve(e) as url:
        yield e, url


@pytest.fixture
async def activator(tmp_path: Path) -> AsyncIterator[tuple[Any, str]]:
    """An activator serving on loopback from this test's loop: (app, base URL). Its
    controller refuses connections (demand signals fail quietly); activation times out
    after 2 s."""
    app = create_app(with_interval(make_config(tmp_path), INTERVAL_S), f"http://127.0.0.1:{free_port()}",
                     activator_id="held")
    async with served_in_this_loop(app) as base:
        yield app, base


def ledger_rows(app: Any) -> list[dict[str, Any]]:
    return query_usage(app.state.ledger.path)


async def read_held(r: httpx.Response, on_comments: int, then: Any) -> list[str]:
    """The lines of a held stream; ``then()`` is called once ``on_comments`` progress
    comments have come."""
    lines, comments = [], 0
    async for line in r.aiter_lines():
        lines.append(line)
        if line.startswith(": thaw held"):
            comments += 1
            if comments == on_comments:
                then()
    return lines


# -- the lines themselves -----------------------------------------------------------------

def test_the_phase_is_where_the_request_waits() -> None:
    assert held_phase(sent=False, loading=0) == "queued"
    assert held_phase(sent=False, loading=2) == "loading"
    assert held_phase(sent=True, loading=1) == "first_token"


def test_a_progress_line_is_an_sse_comment_with_the_time_left_when_known() -> None:
    assert progress_comment("loading", 12.34, None) == b": thaw held phase=loading held_s=12.3\n\n"
    assert progress_comment("queued", 5.0, 20.0) == b": thaw held phase=queued held_s=5.0 expected_left_s=15.0\n\n"
    # Longer than the cold starts seen: nothing left to say but zero.
    assert progress_comment("first_token", 30.0, 20.0).endswith(b"expected_left_s=0.0\n\n")


def test_the_ready_line_carries_what_the_headers_could_not() -> None:
    ctx = RequestContext(request_id="r", arrival=0.0, queue_s=3.2, tier="disk", replica="demo-7")
    assert ready_comment(ctx) == b": thaw ready queue_ms=3200 tier=disk replica=demo-7\n\n"


# -- through a served activator ----------------------------------------------------------

async def test_a_held_stream_gets_progress_then_its_answer_and_later_ones_the_time_left(
        activator: tuple[Any, str], engine: tuple[FakeEngine, str]) -> None:
    app, base = activator
    _, url = engine
    routes = app.state.routes
    routes.apply(table(1, [], loading=1))
    async with httpx.AsyncClient(timeout=30) as c, c.stream("POST", f"{base}/v1/chat/completions", json=CHAT,
                                                            headers=AUTH) as r:
        # Answered before any token: the status, and of the headers what is known.
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-thaw-cold-start"] == "true"
        assert "x-thaw-tier" not in r.headers and "x-thaw-queue-ms" not in r.headers
        lines = await read_held(r, 2, lambda: routes.apply(table(2, [replica(url, assignment="demo-7")])))
    comments = [ln for ln in lines if ln.startswith(":")]
    assert len(comments) >= 3
    assert all(ln.startswith(": thaw held phase=loading held_s=") for ln in comments[:2])
    assert "expected_left_s" not in comments[0]  # no cold start of this model seen here yet
    assert comments[-1].startswith(": thaw ready queue_ms=") and "tier=s3" in comments[-1] \
        and "replica=demo-7" in comments[-1]
    data = [ln for ln in lines if ln.startswith("data: ")]
    assert data[-1] == "data: [DONE]" and all("tok" in d for d in data[:5])
    (row,) = await until("the usage row", lambda: ledger_rows(app), 10)
    assert (row["status"], row["cold_start"], row["cancelled"], row["error_code"]) == (200, 1, 0, None)
    assert row["queue_ms"] >= 2 * INTERVAL_S * 1000

    # At zero again, with no replica loading: queued, and now the time left is said.
    routes.apply(table(3, [], loading=0))
    async with httpx.AsyncClient(timeout=30) as c, c.stream("POST", f"{base}/v1/chat/completions", json=CHAT,
                                                            headers=AUTH) as r:
        lines = await read_held(r, 1, lambda: routes.apply(table(4, [replica(url, assignment="demo-8")])))
    first = next(ln for ln in lines if ln.startswith(": thaw held"))
    assert first.startswith(": thaw held phase=queued") and "expected_left_s=" in first
    assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"


async def test_the_official_client_reads_a_held_stream_and_a_refusal_after_it(
        activator: tuple[Any, str], engine: tuple[FakeEngine, str]) -> None:
    app, base = activator
    _, url = engine
    routes = app.state.routes
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)
    routes.apply(table(1, [], loading=1))
    # The call returns with the 200, while the model still starts.
    stream = await client.chat.completions.create(model="thaw-demo", messages=CHAT["messages"], stream=True)
    assert routes.status("demo").cold_queue == 1
    routes.apply(table(2, [replica(url)]))
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "tok0 tok1 tok2 tok3 tok4 "

    # Nothing becomes ready: past activation_timeout_s (2 s) the error comes as an event,
    # which the client raises with OpenAI's code.
    routes.apply(table(3, [], loading=1))
    stream = await client.chat.completions.create(model="thaw-demo", messages=CHAT["messages"], stream=True)
    with pytest.raises(openai.APIError) as info:
        [c async for c in stream]
    assert info.value.body["code"] == "model_unavailable"  # type: ignore[index]
    assert "did not become ready within 2 s" in info.value.message
    rows = await until("two usage rows", lambda: len(ledger_rows(app)) == 2 and ledger_rows(app), 10)
    assert (rows[1]["status"], rows[1]["error_code"], rows[1]["cold_start"]) == (503, "model_unavailable", 1)
    async with httpx.AsyncClient(timeout=30) as c:
        metrics = (await c.get(f"{base}/metrics")).text
    assert 'error_type="model_unavailable"' in metrics
    await client.close()


async def test_a_client_that_leaves_while_held_leaves_the_queue_and_is_metered_as_cancelled(
        activator: tuple[Any, str], engine: tuple[FakeEngine, str]) -> None:
    app, base = activator
    eng, _ = engine
    routes = app.state.routes
    sent_before = len(eng.requests)
    routes.apply(table(1, [], loading=1))
    async with httpx.AsyncClient(timeout=30) as c, c.stream("POST", f"{base}/v1/chat/completions", json=CHAT,
                                                            headers=AUTH) as r:
        async for line in r.aiter_lines():
            if line.startswith(": thaw held"):
                break  # hang up while held
    await until("the request out of the cold queue", lambda: routes.status("demo").cold_queue == 0, 10)
    (row,) = await until("the usage row", lambda: ledger_rows(app), 10)
    assert (row["cancelled"], row["cold_start"], row["completion_tokens"]) == (1, 1, 0)
    assert len(eng.requests) == sent_before  # nothing reached an engine


async def test_a_held_stream_outlives_a_proxy_idle_limit_shorter_than_its_cold_start(
        activator: tuple[Any, str], engine: tuple[FakeEngine, str]) -> None:
    app, base = activator
    _, url = engine
    routes = app.state.routes
    port = int(base.rsplit(":", 1)[1])
    idle_s, cold_s = 0.6, 2.0  # the proxy cuts after 0.6 s of silence; the start takes 2
    async with idle_limited_proxy(port, idle_s) as (proxied, cuts):
        loop = asyncio.get_running_loop()
        routes.apply(table(1, [], loading=1))
        loop.call_later(cold_s - 0.5, lambda: routes.apply(table(2, [replica(url)])))
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.post(f"{proxied}/v1/chat/completions", json=CHAT, headers=AUTH)
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]") and cuts == []

        # Without comments the same wait is cut by the proxy: what they are for.
        app.state.service.use_config(with_interval(app.state.service.cfg, 0))
        routes.apply(table(3, [], loading=1))
        loop.call_later(cold_s, lambda: routes.apply(table(4, [replica(url)])))
        async with httpx.AsyncClient(timeout=30) as c:
            with pytest.raises(httpx.RemoteProtocolError):
                await c.post(f"{proxied}/v1/chat/completions", json=CHAT, headers=AUTH)
        assert len(cuts) == 1 and cuts[0] >= idle_s


async def test_a_client_that_leaves_as_its_held_answer_begins_frees_the_replica(
        activator: tuple[Any, str], engine: tuple[FakeEngine, str]) -> None:
    app, base = activator
    eng, url = engine
    routes = app.state.routes
    cancelled_before, eng.token_delay_s = eng.cancelled, 0.2  # an answer still streaming when the client goes
    try:
        routes.apply(table(1, [], loading=1))
        async with httpx.AsyncClient(timeout=30) as c, c.stream("POST", f"{base}/v1/chat/completions", json=CHAT,
                                                                headers=AUTH) as r:
            async for line in r.aiter_lines():
                if line.startswith(": thaw held") and not routes.status("demo").ready:
                    routes.apply(table(2, [replica(url, assignment="demo-5")]))
                if line.startswith(": thaw ready"):
                    break  # hang up as the answer begins
        await until("the engine's stream cancelled", lambda: eng.cancelled > cancelled_before, 10)
        await until("the replica's slot free", lambda: routes.report_body().models["demo"].in_flight == 0, 10)
        (row,) = await until("the usage row", lambda: ledger_rows(app), 10)
        assert (row["cancelled"], row["cold_start"], row["status"]) == (1, 1, 200)
    finally:
        eng.token_delay_s = 0.0
