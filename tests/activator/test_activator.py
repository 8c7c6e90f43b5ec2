"""The activator against fake engines: admission errors, hot and cold paths, the proxy.

The pool manager is not running here: the route table is applied by hand, which is
exactly what the activator does with what it long-polls.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from activator.app import create_app
from activator.protocol import tenant_cache_salt
from tests.activator.fake_engine import FakeEngine, serve
from tests.activator.support import (
    KEY,
    LIMITED_KEY,
    assert_openai_error,
    make_config,
    replica,
    table,
)
from tests.waiting import until, wait_until
from thaw.config import parse_config
from thaw.embedded_store import free_port


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[FakeEngine, str]]:
    e = FakeEngine("one")
    with serve(e) as url:
        yield e, url


@pytest.fixture
async def activator() -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    # Pool manager address that refuses connections: demand signals fail quietly.
    app = create_app(make_config(), f"http://127.0.0.1:{free_port()}", activator_id="t")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://act") as client:
        yield app, client
    await app.state.routes.close()
    await app.state.service.close()
    app.state.ledger.close()


def oai(client: httpx.AsyncClient, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://act/v1", api_key=key, http_client=client, max_retries=0)


CHAT = {"model": "thaw-demo", "messages": [{"role": "user", "content": "hi"}]}




async def test_healthz_names_the_route_table_version_it_acts_on(activator: tuple[Any, httpx.AsyncClient]) -> None:
    app, client = activator
    app.state.routes.apply(table(7, []))
    health = (await client.get("/healthz")).json()
    assert health["ok"] is True and health["routes_version"] == 7


async def test_bad_key_is_401(activator: tuple[Any, httpx.AsyncClient]) -> None:
    _, client = activator
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert_openai_error(r, 401, "invalid_api_key")
    r = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer nope"})
    assert_openai_error(r, 401, "invalid_api_key")
    with pytest.raises(openai.AuthenticationError):
        await oai(client, "wrong").chat.completions.create(**CHAT)


async def test_unknown_and_forbidden_models_are_404(activator: tuple[Any, httpx.AsyncClient]) -> None:
    _, client = activator
    h = {"Authorization": f"Bearer {KEY}"}
    r = await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"}, headers=h)
    assert_openai_error(r, 404, "model_not_found", "model")
    # A model the tenant may not use looks exactly like one that does not exist.
    r = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {LIMITED_KEY}"})
    err = assert_openai_error(r, 404, "model_not_found", "model")
    assert err["message"] == "the model 'thaw-demo' does not exist"
    with pytest.raises(openai.NotFoundError):
        await oai(client).chat.completions.create(**{**CHAT, "model": "nope"})


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "must be a JSON object"),
        (b"", None, "body is empty"),
        (json.dumps({"model": "thaw-demo"}).encode(), "messages", "non-empty array"),
        (json.dumps({**CHAT, "stream": "yes"}).encode(), "stream", "must be a boolean"),
        (json.dumps({**CHAT, "max_tokens": 0}).encode(), "max_tokens", "positive integer"),
        (json.dumps({"messages": CHAT["messages"]}).encode(), "model", "'model' is required"),
    ],
)
async def test_malformed_body_is_400(activator: tuple[Any, httpx.AsyncClient], body: bytes, param: str | None,
                                     fragment: str) -> None:
    _, client = activator
    r = await client.post("/v1/chat/completions", content=body,
                          headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    err = assert_openai_error(r, 400, param=param)
    assert fragment in err["message"]


async def test_body_over_limit_is_413(activator: tuple[Any, httpx.AsyncClient]) -> None:
    _, client = activator
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    r = await client.post("/v1/chat/completions", json=big, headers={"Authorization": f"Bearer {KEY}"})
    assert_openai_error(r, 413, "request_too_large")


async def test_unknown_route_is_openai_404(activator: tuple[Any, httpx.AsyncClient]) -> None:
    _, client = activator
    r = await client.get("/v1/nothing-here")
    assert_openai_error(r, 404)


async def test_hot_stream_is_passed_through(activator: tuple[Any, httpx.AsyncClient], engine: tuple[FakeEngine, str]) -> None:
    app, client = activator
    fake, url = engine
    app.state.routes.apply(table(1, [replica(url)]))
    stream = await oai(client).chat.completions.create(**CHAT, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream])
    assert text == "tok0 tok1 tok2 tok3 tok4 "
    # The engine saw its own served name, and our request id.
    assert fake.requests[-1]["body"]["model"] == "served-demo"

    r = await client.post("/v1/chat/completions", json=CHAT,
                          headers={"Authorization": f"Bearer {KEY}", "x-request-id": "my-id-1"})
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "my-id-1"
    assert r.headers["x-thaw-cold-start"] == "false"
    assert "x-thaw-queue-ms" not in r.headers
    assert r.json()["choices"][0]["message"]["content"] == "tok0 tok1 tok2 tok3 tok4"
    assert fake.requests[-1]["request_id"] == "my-id-1"

    # Per-model base URL.
    r = await client.post("/m/thaw-demo/v1/completions", json={"prompt": "hello"},
                          headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    assert fake.requests[-1]["kind"] == "completions"
    assert fake.requests[-1]["body"] == {"prompt": "hello", "model": "served-demo",
                                         "cache_salt": tenant_cache_salt("all")}
    r = await client.post("/m/thaw-demo/v1/completions", json={"prompt": "hello", "model": "other"},
                          headers={"Authorization": f"Bearer {KEY}"})
    assert_openai_error(r, 400, param="model")


async def test_cold_request_waits_for_the_route_then_streams(
    activator: tuple[Any, httpx.AsyncClient], engine: tuple[FakeEngine, str]
) -> None:
    app, client = activator
    _, url = engine
    routes = app.state.routes
    app.state.routes.apply(table(1, [], loading=1))
    task = asyncio.create_task(client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                                           headers={"Authorization": f"Bearer {KEY}"}))
    await until("the request queued", lambda: routes.status("demo").cold_queue, 2)
    assert routes.status("demo").cold_queue == 1
    await asyncio.sleep(0.2)
    routes.apply(table(2, [replica(url, assignment="demo-7")]))
    r = await task
    assert r.status_code == 200
    assert r.headers["x-thaw-cold-start"] == "true"
    assert int(r.headers["x-thaw-queue-ms"]) >= 200
    assert r.text.endswith("data: [DONE]\n\n")
    metrics = (await client.get("/metrics")).text
    assert r.headers["x-thaw-tier"] == "s3"  # the replica reported no load: read from the store
    assert 'thaw_cold_starts_total{model="demo",tier="s3"} 1.0' in metrics
    for phase in ("queued", "instance_acquired", "snapshot_restored", "weights_loaded", "engine_ready",
                  "first_token", "total"):
        assert f'thaw_cold_start_seconds_count{{model="demo",phase="{phase}",tier="s3"}} 1.0' in metrics


async def test_full_queue_is_429_and_deadline_is_503(activator: tuple[Any, httpx.AsyncClient]) -> None:
    app, client = activator
    app.state.routes.apply(table(1, [], loading=1))
    h = {"Authorization": f"Bearer {KEY}"}
    waiting = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=h)) for _ in range(3)]
    await until("three requests queued", lambda: app.state.routes.status("demo").cold_queue == 3, 2)
    r = await client.post("/v1/chat/completions", json=CHAT, headers=h)
    assert_openai_error(r, 429, "queue_full")
    assert int(r.headers["retry-after"]) >= 1
    # Nothing becomes ready: after activation_timeout_s (2 s) each waiter gets a 503.
    for resp in await asyncio.gather(*waiting):
        err = assert_openai_error(resp, 503, "model_unavailable")
        assert "did not become ready within 2 s" in err["message"]
        assert int(resp.headers["retry-after"]) >= 1
        assert resp.headers["x-thaw-cold-start"] == "true"


async def test_load_failure_fails_waiters_with_the_reason(activator: tuple[Any, httpx.AsyncClient]) -> None:
    app, client = activator
    routes = app.state.routes
    routes.apply(table(1, [], loading=1))
    h = {"Authorization": f"Bearer {KEY}"}
    waiting = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=h)) for _ in range(2)]
    await until("two requests queued", lambda: routes.status("demo").cold_queue == 2, 2)
    backoff_until = routes.clock() + 4
    # The operator's detail (the store's address, the bucket's paths) stays with the
    # operator: a tenant is told what kind of failure it was.
    detail = ('cannot read the model\'s manifest at s3://thaw/models/demo: Could not connect to the endpoint URL: '
              '"http://10.0.0.7:8333/thaw/models/demo/thaw-manifest.json"')
    routes.apply(table(2, [], failures=1, error=detail, failure_kind="store", backoff_until=backoff_until))
    reason = "model 'thaw-demo' failed to start: its weights could not be read from the object store"
    for resp in await asyncio.gather(*waiting):
        err = assert_openai_error(resp, 503, "model_unavailable")
        assert err["message"].startswith(reason) and "s3://" not in err["message"] and "10.0.0.7" not in err["message"]
        assert 1 <= int(resp.headers["retry-after"]) <= 4
    # A new request during the backoff is answered at once, with the same reason.
    r = await client.post("/v1/chat/completions", json=CHAT, headers=h)
    assert assert_openai_error(r, 503)["message"].startswith(reason)
    models = (await client.get("/v1/models", headers=h)).json()["data"]
    demo = next(m for m in models if m["id"] == "thaw-demo")
    assert demo["thaw"]["state"] == "failed" and "s3://" not in json.dumps(demo)


async def test_a_full_pool_is_a_503_at_once_that_names_the_cause(activator: tuple[Any, httpx.AsyncClient]) -> None:
    app, client = activator
    routes = app.state.routes
    routes.apply(table(1, []))
    h = {"Authorization": f"Bearer {KEY}"}
    waiting = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=h))
    await until("the request queued", lambda: routes.status("demo").cold_queue == 1, 2)
    full = "pool cpu-local is at max_instances 1 and every replica is busy"
    routes.apply(table(2, [], failure_kind="capacity", error=full))
    reason = f"model 'thaw-demo' cannot start now: {full}; retry later"
    # Answered when the table says so, not after the activation timeout (2 s).
    for resp in (await asyncio.wait_for(waiting, 1),
                 await asyncio.wait_for(client.post("/v1/chat/completions", json=CHAT, headers=h), 1)):
        assert assert_openai_error(resp, 503, "pool_at_capacity")["message"] == reason
        assert resp.headers["retry-after"] == "5"


async def test_two_dead_replicas_are_a_502_that_says_when_to_retry(activator: tuple[Any, httpx.AsyncClient]) -> None:
    """Both tries fail before a first byte: 502 in OpenAI's shape, with Retry-After as
    long as the replicas stay ejected (retrying then may find them back)."""
    app, client = activator
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]  # nothing listens there
    app.state.routes.apply(table(1, [replica(dead[0], "w0", "demo-0"), replica(dead[1], "w1", "demo-1")]))
    r = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {KEY}"})
    err = assert_openai_error(r, 502, "upstream_error")
    assert "failed before answering" in err["message"]
    assert r.headers["retry-after"] == str(math.ceil(app.state.cfg.server.replica_ejection_s))


async def test_dead_replica_before_first_byte_is_retried_on_another(
    activator: tuple[Any, httpx.AsyncClient], engine: tuple[FakeEngine, str]
) -> None:
    app, client = activator
    _, url = engine
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    app.state.routes.apply(table(1, [replica(dead, "w0", "demo-0"), replica(url, "w1", "demo-1")]))
    for r_ in app.state.routes.replicas("demo").usable:
        r_.outstanding = 0 if r_.url == dead else 5  # make sure the dead one is picked first
    r = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    assert [x.url for x in app.state.routes.replicas("demo").usable] == [url]


async def test_failure_after_first_byte_becomes_an_sse_error_then_done(
    activator: tuple[Any, httpx.AsyncClient]
) -> None:
    app, client = activator
    dying = FakeEngine("dying", tokens=5, die_after_chunks=2)
    with serve(dying) as url:
        app.state.routes.apply(table(1, [replica(url)]))
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                              headers={"Authorization": f"Bearer {KEY}"})
    events = [e for e in r.text.split("\n\n") if e]
    assert events[0].startswith("data: {") and "tok0" in events[0]
    assert json.loads(events[-2][len("data: "):])["error"]["code"] == "upstream_error"
    assert events[-1] == "data: [DONE]"


def stall_app(**server: Any) -> Any:
    cfg = make_config()
    return create_app(cfg.model_copy(update={"server": cfg.server.model_copy(update=server)}),
                      f"http://127.0.0.1:{free_port()}", activator_id="stall")


async def test_a_stream_whose_replica_stays_silent_goes_to_another(engine: tuple[FakeEngine, str]) -> None:
    """A replica silent past the stream idle limit before its first byte (a stalled link
    or engine) is cut and the request served by another; the silent one gets nothing
    more until its ejection ends, then is tried again."""
    good, url = engine
    # Margins for a loaded machine: the good engine answers in milliseconds, but a fresh
    # clone's 2-core run has seen it take over a second to send its headers (so it too was
    # cut at a 1 s limit); the checks while ejected follow its answer at once.
    app = stall_app(upstream_stream_idle_s=5.0, replica_ejection_s=10.0)
    silent = FakeEngine("silent")
    silent.stall_before_headers = True
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
            with serve(silent) as silent_url:
                app.state.routes.apply(table(1, [replica(silent_url, "w0", "demo-0"), replica(url, "w1", "demo-1")]))
                for r_ in app.state.routes.replicas("demo").usable:
                    r_.outstanding = 0 if r_.url == silent_url else 5  # the silent one is picked first
                served_before = len(good.requests)  # the engine fixture serves other tests too
                r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                                      headers={"Authorization": f"Bearer {KEY}"})
                assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text
                assert "error" not in r.text
                assert len(silent.requests) == 1 and len(good.requests) == served_before + 1
                assert [x.url for x in app.state.routes.replicas("demo").usable] == [url]
                # The same table again (the controller still lists it): still ejected.
                app.state.routes.apply(table(2, [replica(silent_url, "w0", "demo-0"), replica(url, "w1", "demo-1")]))
                assert [x.url for x in app.state.routes.replicas("demo").usable] == [url]
                await until("the ejected replica readmitted once its ejection ends",
                            lambda: len(app.state.routes.replicas("demo").usable) == 2, 30)
                assert {x.url for x in app.state.routes.replicas("demo").usable} == {url, silent_url}
                silent.stall_before_headers = False
    finally:
        await app.state.routes.close()
        await app.state.service.close()
        app.state.ledger.close()


async def test_a_stream_that_goes_silent_midway_ends_with_an_error_event(engine: tuple[FakeEngine, str]) -> None:
    app = stall_app(upstream_stream_idle_s=3.0)
    stalling = FakeEngine("stalling", tokens=5)
    stalling.stall_after_chunks = 2
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
            with serve(stalling) as url:
                app.state.routes.apply(table(1, [replica(url)]))
                r = await asyncio.wait_for(client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                                                       headers={"Authorization": f"Bearer {KEY}"}), 10)
                stalling.stall_after_chunks = None
        events = [e for e in r.text.split("\n\n") if e]
        assert "tok1" in events[1]
        err = json.loads(events[-2][len("data: "):])["error"]
        assert err["code"] == "upstream_error" and "sent nothing for too long" in err["message"], err
        assert events[-1] == "data: [DONE]"
    finally:
        await app.state.routes.close()
        await app.state.service.close()
        app.state.ledger.close()


async def test_models_list_shows_state(activator: tuple[Any, httpx.AsyncClient], engine: tuple[FakeEngine, str]) -> None:
    app, client = activator
    _, url = engine
    app.state.routes.apply(table(1, [replica(url)]))
    data = (await client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})).json()
    assert data["object"] == "list"
    demo = next(m for m in data["data"] if m["id"] == "thaw-demo")
    assert demo["thaw"] == {"state": "ready", "replicas_ready": 1, "replicas_loading": 0, "queue_depth": 0,
                            "error": None}
    limited = (await client.get("/v1/models", headers={"Authorization": f"Bearer {LIMITED_KEY}"})).json()
    assert [m["id"] for m in limited["data"]] == ["other"]
    listed = await oai(client).models.list()
    assert {m.id for m in listed.data} == {"thaw-demo", "other"}


def test_client_disconnect_aborts_the_upstream_stream(engine: tuple[FakeEngine, str]) -> None:
    """A real server (not ASGI-in-process): closing the client connection mid-stream must
    close the upstream request, which is what makes vLLM abort the generation."""
    import threading

    import uvicorn

    slow = FakeEngine("slow", tokens=200)
    slow.token_delay_s = 0.05
    app = create_app(make_config(), f"http://127.0.0.1:{free_port()}", activator_id="t2")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    with serve(slow) as url:
        wait_until("the activator started", lambda: server.started, 10)
        app.state.routes.apply(table(1, [replica(url)]))
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json={**CHAT, "stream": True},
                          headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break  # got the first token: hang up
        wait_until("the engine's stream cancelled", lambda: slow.cancelled, 10)
        assert slow.cancelled == 1
        # The activator no longer counts it as in flight, and metered it as cancelled.
        from activator.ledger import query_usage

        rows: list[dict[str, Any]] = wait_until("the usage row", lambda: query_usage(app.state.ledger.path), 10)
        assert app.state.routes.report_body().models["demo"].in_flight == 0
        assert [(r["cancelled"], r["usage_source"]) for r in rows] == [(1, "estimated")]
        assert rows[0]["completion_tokens"] >= 1
    server.should_exit = True
    thread.join(timeout=10)


async def test_every_request_is_metered_with_the_usage_the_client_saw(
    activator: tuple[Any, httpx.AsyncClient], engine: tuple[FakeEngine, str]
) -> None:
    from activator.ledger import query_usage

    app, client = activator
    _, url = engine
    app.state.routes.apply(table(1, [replica(url, assignment="demo-9")]))
    c = oai(client)
    # Streamed, asking for usage: the client gets the usage chunk.
    stream = await c.chat.completions.create(**CHAT, stream=True, stream_options={"include_usage": True})
    chunks = [ch async for ch in stream]
    seen_usage = [ch.usage for ch in chunks if ch.usage]
    assert len(seen_usage) == 1 and seen_usage[0].completion_tokens == 5
    # Streamed, not asking: no usage chunk reaches the client, but it is metered.
    stream = await c.chat.completions.create(**CHAT, stream=True)
    assert not [ch async for ch in stream if ch.usage]
    # Not streamed.
    out = await c.chat.completions.create(**CHAT)
    assert out.usage is not None and out.usage.prompt_tokens == 3
    # Failures after authentication are metered too.
    with pytest.raises(openai.NotFoundError):
        await c.chat.completions.create(**{**CHAT, "model": "nope"})
    with pytest.raises(openai.BadRequestError):
        await c.chat.completions.create(model="thaw-demo", messages=[])
    # A bad key is not (there is no tenant to bill).
    with pytest.raises(openai.AuthenticationError):
        await oai(client, "wrong").chat.completions.create(**CHAT)

    rows = query_usage(app.state.ledger.path)
    assert [(r["status"], r["prompt_tokens"], r["completion_tokens"], r["usage_source"]) for r in rows] == [
        (200, 3, 5, "engine"), (200, 3, 5, "engine"), (200, 3, 5, "engine"), (404, 0, 0, "none"),
        (400, 0, 0, "none"),
    ]
    assert all(r["tenant"] == "all" and r["replica"] in ("demo-9", None) for r in rows)
    assert rows[0]["stream"] == 1 and rows[2]["stream"] == 0
    # The tenant's counts on /metrics (the tenants' dashboard): by outcome, and its tokens.
    metrics = (await client.get("/metrics")).text
    for line in ('thaw_tenant_requests_total{outcome="ok",tenant="all"} 3.0',
                 'thaw_tenant_requests_total{outcome="model_not_found",tenant="all"} 1.0',
                 'thaw_tenant_tokens_total{tenant="all",type="input"} 9.0',
                 'thaw_tenant_tokens_total{tenant="all",type="output"} 15.0'):
        assert line in metrics, line

    # GET /v1/usage: the caller's own records only.
    mine = (await client.get("/v1/usage", headers={"Authorization": f"Bearer {KEY}"})).json()
    assert mine["tenant"] == "all" and mine["totals"]["requests"] == 5 and mine["totals"]["completion_tokens"] == 15
    theirs = (await client.get("/v1/usage", headers={"Authorization": f"Bearer {LIMITED_KEY}"})).json()
    assert theirs["totals"]["requests"] == 0 and theirs["data"] == []
    bad = await client.get("/v1/usage?since=yesterday", headers={"Authorization": f"Bearer {KEY}"})
    assert_openai_error(bad, 400, param="since")


async def test_unsupported_parameter_is_named_and_known_ones_pass(
    activator: tuple[Any, httpx.AsyncClient], engine: tuple[FakeEngine, str]
) -> None:
    app, client = activator
    fake, url = engine
    app.state.routes.apply(table(1, [replica(url)]))
    c = oai(client)
    with pytest.raises(openai.BadRequestError) as info:
        await c.chat.completions.create(**CHAT, extra_body={"frobnicate": 1})
    assert info.value.body["param"] == "frobnicate"  # type: ignore[index]
    assert info.value.body["code"] == "unsupported_parameter"  # type: ignore[index]
    await c.chat.completions.create(
        **CHAT, n=2, stop=["\n"], seed=7, logprobs=True, top_logprobs=2, max_completion_tokens=4,
        response_format={"type": "json_object"}, temperature=0, extra_body={"top_k": 5})
    sent = fake.requests[-1]["body"]
    assert (sent["n"], sent["stop"], sent["seed"], sent["top_logprobs"], sent["top_k"]) == (2, ["\n"], 7, 2, 5)
    assert sent["response_format"] == {"type": "json_object"}


async def test_get_one_model(activator: tuple[Any, httpx.AsyncClient]) -> None:
    _, client = activator
    m = await oai(client).models.retrieve("thaw-demo")
    assert m.id == "thaw-demo"
    with pytest.raises(openai.NotFoundError):
        await oai(client, LIMITED_KEY).models.retrieve("thaw-demo")


async def test_limits_hit_one_tenant_not_another(engine: tuple[FakeEngine, str], tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    data = cfg.model_dump(mode="json")
    data["tenants"][0]["limits"] = {"requests_per_minute": 2}
    data["tenants"][1]["allowed_models"] = ["*"]
    cfg = parse_config(data)
    app = create_app(cfg, f"http://127.0.0.1:{free_port()}", activator_id="t3")
    _, url = engine
    app.state.routes.apply(table(1, [replica(url)]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
        a = {"Authorization": f"Bearer {KEY}"}
        b = {"Authorization": f"Bearer {LIMITED_KEY}"}
        r1 = await client.post("/v1/chat/completions", json=CHAT, headers=a)
        assert r1.status_code == 200 and r1.headers["x-ratelimit-remaining-requests"] == "1"
        assert r1.headers["x-ratelimit-limit-requests"] == "2"
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=a)).status_code == 200
        r3 = await client.post("/v1/chat/completions", json=CHAT, headers=a)
        err = assert_openai_error(r3, 429, "rate_limit_requests")
        assert "2 requests per minute" in err["message"]
        assert int(r3.headers["retry-after"]) >= 1 and r3.headers["x-ratelimit-remaining-requests"] == "0"
        # The other tenant is unaffected.
        for _ in range(3):
            assert (await client.post("/v1/chat/completions", json=CHAT, headers=b)).status_code == 200
    await app.state.routes.close()
    await app.state.service.close()
    app.state.ledger.close()


async def test_context_length_exceeded_before_any_gpu_work(
    engine: tuple[FakeEngine, str], demo_model_dir: Path, tmp_path: Path
) -> None:
    def fetch(uri: str, name: str) -> bytes | None:
        p = demo_model_dir / name
        return p.read_bytes() if p.exists() else None

    fake, url = engine
    data = make_config(tmp_path).model_dump(mode="json")
    data["server"]["max_body_bytes"] = 1_000_000
    app = create_app(parse_config(data), f"http://127.0.0.1:{free_port()}", activator_id="t4",
                     store_fetcher=fetch)
    app.state.routes.apply(table(1, [replica(url)]))
    before = len(fake.requests)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
        c = oai(client)
        with pytest.raises(openai.BadRequestError) as info:
            await c.chat.completions.create(model="thaw-demo", max_tokens=100,
                                            messages=[{"role": "user", "content": "word " * 3000}])
        assert info.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
        # A prompt over INLINE_COUNT_CHARS is counted on a thread, with the same answer.
        with pytest.raises(openai.BadRequestError) as info:
            await c.chat.completions.create(model="thaw-demo", max_tokens=100,
                                            messages=[{"role": "user", "content": "word " * 4000}])
        assert info.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
        assert "maximum context length is 2048 tokens" in info.value.body["message"]  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as info:
            await c.chat.completions.create(model="thaw-demo", max_tokens=2040,
                                            messages=[{"role": "user", "content": "hello there"}])
        assert info.value.body["param"] == "max_tokens"  # type: ignore[index]
        assert len(fake.requests) == before  # refused before reaching the engine
        ok = await c.chat.completions.create(model="thaw-demo", max_tokens=10,
                                             messages=[{"role": "user", "content": "hello there"}])
        assert ok.choices
    await app.state.routes.close()
    await app.state.service.close()
    app.state.ledger.close()


async def test_keys_the_controller_sent_hold_across_a_restart_without_it(tmp_path: Path) -> None:
    import hashlib

    from activator.keys import KeyCache
    from thaw.wire import ApiKey, KeyTable

    cfg = make_config(tmp_path)
    added = "thaw-added-at-run-time"
    KeyCache(cfg.activator_dir("t5")).save(KeyTable(version=7, keys=[
        ApiKey(hash=hashlib.sha256(added.encode()).hexdigest(), tenant="limited", prefix=added[:9], created_at=1.0),
        # A key of the config file, revoked at run time.
        ApiKey(hash=hashlib.sha256(KEY.encode()).hexdigest(), tenant="all", label="config", prefix="",
               created_at=2.0, revoked_at=2.0),
    ]))
    # The controller is down (nothing listens): the activator starts from what it kept.
    app = create_app(cfg, f"http://127.0.0.1:{free_port()}", activator_id="t5")
    async with app.router.lifespan_context(app):
        assert app.state.routes.feed.keys_version == 7
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
            r = await client.get("/v1/models", headers={"Authorization": f"Bearer {added}"})
            assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["other"]
            assert (await client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})).status_code == 401
            ok = await client.get("/v1/models", headers={"Authorization": f"Bearer {LIMITED_KEY}"})
            assert ok.status_code == 200
    assert (cfg.activator_dir("t5") / "keys.json").stat().st_mode & 0o777 == 0o600


async def test_fair_queue_round_robins_tenants_when_saturated(tmp_path: Path) -> None:
    data = make_config(tmp_path).model_dump(mode="json")
    data["models"][0]["autoscaling"].update({"max_concurrency_per_replica": 1, "max_queue_length": 50,
                                             "activation_timeout_s": 60})
    data["tenants"][1]["allowed_models"] = ["*"]
    app = create_app(parse_config(data), f"http://127.0.0.1:{free_port()}", activator_id="t6")
    slow = FakeEngine("slow", tokens=3)
    slow.token_delay_s = 0.05
    with serve(slow) as url:
        app.state.routes.apply(table(1, [replica(url)]))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act",
                                     timeout=60) as client:
            def send(key: str, tag: str) -> asyncio.Task[httpx.Response]:
                body = {"model": "thaw-demo", "stream": True, "messages": [{"role": "user", "content": tag}]}
                return asyncio.create_task(client.post("/v1/chat/completions", json=body,
                                                       headers={"Authorization": f"Bearer {key}"}))

            burst = [send(KEY, f"A{i}") for i in range(5)]
            await until("A0 on the replica, A1..A4 waiting", lambda: app.state.routes.status("demo").fair_queue == 4, 2)
            b = send(LIMITED_KEY, "B0")
            results = await asyncio.gather(*burst, b)
        assert all(r.status_code == 200 for r in results)
    order = [r["body"]["messages"][0]["content"] for r in slow.requests]
    # A0 was running; then round-robin between A's queue and B's: A1, then B0.
    # B waited behind one queued request of the bursting tenant, not four.
    assert order[:3] == ["A0", "A1", "B0"], order
    assert order.index("B0") - 1 <= 1
    await app.state.routes.close()
    await app.state.service.close()
    app.state.ledger.close()


async def test_a_request_that_waits_for_a_busy_replica_is_not_a_cold_start(tmp_path: Path) -> None:
    from activator.ledger import query_usage

    data = make_config(tmp_path).model_dump(mode="json")
    data["models"][0]["autoscaling"].update({"max_concurrency_per_replica": 1, "activation_timeout_s": 0.3})
    app = create_app(parse_config(data), f"http://127.0.0.1:{free_port()}", activator_id="t7")
    slow = FakeEngine("slow", tokens=3)
    slow.token_delay_s = 0.5
    async with app.router.lifespan_context(app):
        with serve(slow) as url:
            app.state.routes.apply(table(1, [replica(url)]))
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act",
                                         timeout=60) as client:
                body = {"model": "thaw-demo", "stream": True, "messages": [{"role": "user", "content": "x"}]}
                h = {"Authorization": f"Bearer {KEY}"}
                first = asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=h))
                await until("the first request on the replica",
                            lambda: app.state.routes.replicas("demo").usable[0].outstanding, 2)
                # The one slot is taken: this one waits 0.3 s for it, then gets 503.
                second = await client.post("/v1/chat/completions", json=body, headers=h)
                assert (await first).status_code == 200
        assert second.status_code == 503 and second.headers.get("retry-after")
        assert second.headers["x-thaw-cold-start"] == "false"
        rows = query_usage(app.state.ledger.path)
        assert sorted((r["status"], r["cold_start"]) for r in rows) == [(200, 0), (503, 0)]


async def test_a_replica_that_dies_after_its_headers_before_any_body_is_retried(
    activator: tuple[Any, httpx.AsyncClient], engine: tuple[FakeEngine, str]
) -> None:
    app, client = activator
    _, url = engine
    headless = FakeEngine("headless", tokens=5, die_after_chunks=0)  # 200 headers, then it dies
    with serve(headless) as dying_url:
        app.state.routes.apply(table(1, [replica(dying_url, "w0", "demo-0"), replica(url, "w1", "demo-1")]))
        for r_ in app.state.routes.replicas("demo").usable:
            r_.outstanding = 0 if r_.url == dying_url else 5  # the dying one is picked first
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                              headers={"Authorization": f"Bearer {KEY}"})
        # Served whole by the other replica; the dying one is no longer used.
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n") and "tok4" in r.text
        assert [x.url for x in app.state.routes.replicas("demo").usable] == [url]
        # With only a dying replica, the client gets an error in OpenAI's shape, not a
        # 200 cut short.
        app.state.routes.apply(table(2, [replica(dying_url, "w0", "demo-0")]))
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                              headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code >= 500 and r.json()["error"]["message"]


async def test_a_model_at_zero_is_woken_before_its_request_is_counted(
        activator: tuple[Any, httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch) -> None:
    app, client = activator
    signalled: list[str] = []
    monkeypatch.setattr(app.state.routes.feed, "signal_demand", lambda model, trace=None: signalled.append(model))
    loaded = asyncio.Event()

    class SlowTokenizers:
        """The model's tokenizer, still being fetched from the store."""

        async def get(self, uri: str) -> None:
            await loaded.wait()

    app.state.service.tokens = SlowTokenizers()
    app.state.routes.apply(table(1, []))  # the model at zero
    request = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT,
                                              headers={"Authorization": f"Bearer {KEY}"}))
    try:
        await until("demand signalled while the tokenizer loads", lambda: bool(signalled))
        assert not loaded.is_set() and signalled[0] == "demo"
        loaded.set()
    finally:
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
