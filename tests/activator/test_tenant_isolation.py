"""Tenant isolation: what one tenant can learn through the activator of another's usage,
models, prompts and answers — nothing.

Two tenants, each allowed one model: ``all`` (KEY) may use ``demo`` (served as
``thaw-demo``), ``limited`` (LIMITED_KEY) may use ``other``. Both models are served by
one fake engine, which records every body the activator forwards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from fastapi import FastAPI

from activator.app import create_app
from activator.protocol import tenant_cache_salt
from activator.shipping import encode_lines, segment_key
from tests.activator.fake_engine import FakeEngine, serve
from tests.activator.support import (
    KEY,
    LIMITED_KEY,
    assert_openai_error,
    make_config,
    record,
    replica,
)
from thaw.config import ThawConfig, parse_config
from thaw.embedded_store import free_port
from thaw.wire import RouteTable

A = {"Authorization": f"Bearer {KEY}"}  # tenant "all": demo only
B = {"Authorization": f"Bearer {LIMITED_KEY}"}  # tenant "limited": other only
MESSAGES = [{"role": "user", "content": "hi"}]


def two_tenant_config(tmp_path: Path) -> ThawConfig:
    data = make_config(tmp_path).model_dump(mode="json")
    data["tenants"][0]["allowed_models"] = ["demo"]
    return parse_config(data)


def routes_to(version: int, url: str | None, *, cold: tuple[str, ...] = ()) -> RouteTable:
    """Both models on the engine at ``url``, but those in ``cold`` (no replica, none loading)."""
    models = {}
    for name, served in (("demo", "thaw-demo"), ("other", "other")):
        replicas = [] if name in cold or url is None else [replica(url, f"w-{name}", f"{name}-1")]
        models[name] = {"served_name": served, "replicas": replicas, "loading": 0, "failures": 0,
                        "error": None, "backoff_until": None}
    return RouteTable.model_validate({"epoch": "e1", "version": version, "models": models})


class FakeStore:
    """The two calls of an S3 client that ``UsageReader`` makes, over fixed objects."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects

    def list_objects_v2(self, **kw: Any) -> dict[str, Any]:
        return {"Contents": [{"Key": k, "ETag": str(len(v))} for k, v in sorted(self.objects.items())
                             if k.startswith(kw["Prefix"])], "IsTruncated": False}

    def get_object(self, **kw: Any) -> dict[str, Any]:
        return {"Body": io.BytesIO(self.objects[kw["Key"]])}


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient, FakeEngine, str]]:
    fake = FakeEngine("isolation")
    with serve(fake) as url:
        app = create_app(two_tenant_config(tmp_path), f"http://127.0.0.1:{free_port()}", activator_id="iso")
        app.state.routes.apply(routes_to(1, url))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
            yield app, client, fake, url
        await app.state.routes.close()
        await app.state.service.close()
        app.state.ledger.close()


# -- 1. usage -----------------------------------------------------------------------------


async def test_usage_shows_the_caller_its_own_rows_only_whatever_it_asks(tmp_path: Path) -> None:
    cfg = two_tenant_config(tmp_path)
    # Another activator shipped rows of both tenants to the store.
    rows = [{**dataclasses.asdict(record(i, tenant=t, request_id=f"shipped-{t}-{i}")), "id": i,
             "activator": "elsewhere"} for i, t in enumerate(["all", "limited", "all", "limited"], start=1)]
    store = FakeStore({segment_key(cfg.ledger.ship_prefix, "elsewhere", 1, 4): encode_lines(rows)})
    fake = FakeEngine("usage")
    with serve(fake) as url:
        app = create_app(cfg, f"http://127.0.0.1:{free_port()}", activator_id="iso", usage_client=store)
        app.state.routes.apply(routes_to(1, url))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
            for i in range(2):
                for who, model, h in (("all", "thaw-demo", A), ("limited", "other", B)):
                    r = await client.post("/v1/chat/completions", json={"model": model, "messages": MESSAGES},
                                          headers={**h, "x-request-id": f"local-{who}-{i}"})
                    assert r.status_code == 200
            for me, h, other in (("all", A, "limited"), ("limited", B, "all")):
                # Naming the other tenant, in any spelling, changes nothing: the key decides.
                for query in ("", f"?tenant={other}", f"?tenant={me}&tenant={other}", "?tenant=*",
                              f"?since=0&tenant={other}"):
                    r = await client.get("/v1/usage" + query, headers=h)
                    assert r.status_code == 200, r.text
                    got = r.json()
                    assert got["tenant"] == me and got["complete"] is True
                    assert {row["tenant"] for row in got["data"]} == {me}
                    assert sorted(row["request_id"] for row in got["data"]) == sorted(
                        [f"local-{me}-0", f"local-{me}-1", *(s["request_id"] for s in rows if s["tenant"] == me)])
                    # 2 local + 2 shipped, all of them the caller's
                    assert got["totals"]["requests"] == 4
                    assert f"local-{other}-" not in r.text and f"shipped-{other}-" not in r.text
        await app.state.routes.close()
        await app.state.service.close()
        app.state.ledger.close()


# -- 2. models: another tenant's answers exactly like none -------------------------------

# (method, path, body): "{name}" stands for the model probed.
PROBES = [
    ("GET", "/v1/models/{name}", None),
    ("GET", "/m/{name}/v1/models", None),
    ("POST", "/v1/chat/completions", {"model": "{name}", "messages": MESSAGES}),
    ("POST", "/v1/completions", {"model": "{name}", "prompt": "hi"}),
    ("POST", "/m/{name}/v1/chat/completions", {"messages": MESSAGES}),
    ("POST", "/m/{name}/v1/completions", {"prompt": "hi"}),
    ("POST", "/m/{name}/v1/chat/completions", {"model": "{name}", "messages": MESSAGES, "stream": True}),
    # A URL and a body that disagree: whether they name one model must not tell.
    ("POST", "/m/{name}/v1/chat/completions", {"model": "no-such-model", "messages": MESSAGES}),
    ("POST", "/m/{name}/v1/completions", {"model": "other", "prompt": "hi"}),
    ("POST", "/m/other/v1/chat/completions", {"model": "{name}", "messages": MESSAGES}),
]


def _fill(value: Any, name: str) -> Any:
    return json.loads(json.dumps(value).replace("{name}", name))


@pytest.mark.parametrize(("method", "path", "body"), PROBES, ids=[f"{m} {p} {b and sorted(b)}" for m, p, b in PROBES])
@pytest.mark.parametrize(("forbidden", "missing"), [("thaw-demo", "thaw-nope"), ("demo", "dumo")],
                         ids=["served-name", "config-name"])
async def test_a_model_of_another_tenant_answers_exactly_like_a_missing_one(
    stack: tuple[FastAPI, httpx.AsyncClient, FakeEngine, str], method: str, path: str, body: Any,
    forbidden: str, missing: str,
) -> None:
    # Names of one length: the answers may then differ by nothing at all, Content-Length included.
    assert len(forbidden) == len(missing)
    _, client, fake, _ = stack
    answers = []
    for name in (forbidden, missing):
        r = await client.request(method, path.replace("{name}", name), json=_fill(body, name),
                                 headers={**B, "x-request-id": "probe"})
        answers.append((r.status_code, dict(r.headers), r.text.replace(name, "<name>")))
    assert answers[0] == answers[1]
    assert answers[0][0] in (400, 404), answers[0]
    assert not fake.requests  # neither reached the engine


async def test_the_model_list_holds_only_the_callers_models(
    stack: tuple[FastAPI, httpx.AsyncClient, FakeEngine, str]
) -> None:
    _, client, _, _ = stack
    for h, mine in ((A, "thaw-demo"), (B, "other")):
        r = await client.get("/v1/models", headers=h)
        assert [m["id"] for m in r.json()["data"]] == [mine]
    r = await client.get("/v1/models", headers=B)
    assert "demo" not in r.text


async def test_a_model_of_another_tenant_is_refused_before_any_queueing_or_activation(
    stack: tuple[FastAPI, httpx.AsyncClient, FakeEngine, str]
) -> None:
    """Cold (no replica): had the request got as far as the queue, it would signal demand
    (a cold start the other tenant could time) and wait up to activation_timeout_s (2 s)."""
    app, client, fake, url = stack
    routes = app.state.routes
    routes.apply(routes_to(2, url, cold=("demo",)))
    seen: list[str] = []
    real_acquire, real_signal = routes.acquire, routes.feed.signal_demand

    async def acquire(model: Any, *args: Any, **kw: Any) -> Any:
        seen.append(f"acquire {model.name}")
        return await real_acquire(model, *args, **kw)

    def signal_demand(model: str) -> None:
        seen.append(f"demand {model}")
        real_signal(model)

    routes.acquire, routes.feed.signal_demand = acquire, signal_demand

    def activity() -> tuple[int, float | None]:
        # (A model never asked for here is left out of the report: no arrivals, none yet.)
        st = routes.report_body().models.get("demo")
        return (st.arrivals, st.last_request_at) if st is not None else (0, None)

    before = activity()
    loop = asyncio.get_running_loop()
    for path, body in (("/v1/chat/completions", {"model": "thaw-demo", "messages": MESSAGES}),
                       ("/v1/completions", {"model": "demo", "prompt": "hi", "stream": True}),
                       ("/m/thaw-demo/v1/chat/completions", {"messages": MESSAGES}),
                       ("/m/demo/v1/completions", {"prompt": "hi"})):
        started = loop.time()
        r = await client.post(path, json=body, headers=B)
        assert_openai_error(r, 404, "model_not_found", "model")
        assert loop.time() - started < 1.0  # answered at once, not after the 2 s activation timeout
        assert r.headers["x-thaw-cold-start"] == "false"
    assert seen == []
    assert activity() == before
    assert routes.status("demo").cold_queue == 0 and routes.status("demo").fair_queue == 0
    assert not fake.requests
    # The caller's own usage rows do not name the model either (its config name is "demo").
    rows = (await client.get("/v1/usage", headers=B)).json()["data"]
    assert [(row["status"], row["model"]) for row in rows] == [(404, None)] * 4


# -- 3. prompts and answers: not through the cache, errors or logs ---------------------------


async def test_every_forwarded_request_carries_its_tenants_cache_salt(
    stack: tuple[FastAPI, httpx.AsyncClient, FakeEngine, str]
) -> None:
    _, client, fake, _ = stack
    salt_a, salt_b = tenant_cache_salt("all"), tenant_cache_salt("limited")
    assert salt_a != salt_b
    sends: list[tuple[dict[str, str], str, dict[str, Any], str]] = [
        (A, "/v1/chat/completions", {"model": "thaw-demo", "messages": MESSAGES}, salt_a),
        (A, "/v1/chat/completions", {"model": "thaw-demo", "messages": MESSAGES, "stream": True}, salt_a),
        (A, "/m/thaw-demo/v1/completions", {"prompt": "hi"}, salt_a),
        (B, "/v1/completions", {"model": "other", "prompt": "hi", "stream": True}, salt_b),
        (B, "/m/other/v1/chat/completions", {"messages": MESSAGES}, salt_b),
        # A client's own salt divides its tenant's cache, hashed with the tenant: the same
        # salt from two tenants differs, and naming the other tenant's salt is no way in.
        (A, "/v1/chat/completions", {"model": "thaw-demo", "messages": MESSAGES, "cache_salt": "s1"},
         tenant_cache_salt("all", "s1")),
        (B, "/v1/chat/completions", {"model": "other", "messages": MESSAGES, "cache_salt": "s1"},
         tenant_cache_salt("limited", "s1")),
        (B, "/v1/completions", {"model": "other", "prompt": "hi", "cache_salt": salt_a},
         tenant_cache_salt("limited", salt_a)),
    ]
    for h, path, body, salt in sends:
        r = await client.post(path, json=body, headers=h)
        assert r.status_code == 200, r.text
        assert fake.requests[-1]["body"]["cache_salt"] == salt
    forwarded = [req["body"]["cache_salt"] for req in fake.requests]
    assert len(set(forwarded)) == 5  # two tenants, two client salts of theirs, one borrowed
    assert salt_a not in forwarded[3:5] + forwarded[6:] and salt_b not in forwarded[:3] + forwarded[5:6]
    # What vLLM 0.32 accepts (validate_cache_salt): 1-128 characters, none of @ / \ NUL.
    assert all(0 < len(s) <= 128 and not set(s) & set("@/\\\0") for s in forwarded)
    for bad in ("", 5, ["x"], "x" * 1025):
        r = await client.post("/v1/chat/completions", json={"model": "thaw-demo", "messages": MESSAGES,
                                                            "cache_salt": bad}, headers=A)
        assert_openai_error(r, 400, param="cache_salt")


SECRET_PROMPT = "zebra-violet-7731"
SECRET_ANSWER = "quartz-heron-5519"


async def test_prompts_and_answers_reach_only_their_requester_and_no_log(
    stack: tuple[FastAPI, httpx.AsyncClient, FakeEngine, str], caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> None:
    app, client, fake, url = stack
    fake.reply = SECRET_ANSWER
    secret_chat = {"model": "thaw-demo", "messages": [{"role": "user", "content": SECRET_PROMPT}]}
    caplog.set_level(logging.DEBUG)
    # Every level reaches the capture, whatever level an earlier test in this process
    # configured (setup_logging's filtering logger drops events before any processor).
    saved = structlog.get_config()
    structlog.reset_defaults()
    request.addfinalizer(lambda: structlog.configure(**saved))
    with structlog.testing.capture_logs() as events:
        # Answered, streamed or not, both endpoints, and both URL forms.
        for path, body in (("/v1/chat/completions", secret_chat),
                           ("/v1/chat/completions", {**secret_chat, "stream": True}),
                           ("/m/thaw-demo/v1/completions", {"prompt": SECRET_PROMPT}),
                           ("/v1/completions", {"model": "thaw-demo", "prompt": SECRET_PROMPT, "stream": True})):
            r = await client.post(path, json=body, headers=A)
            assert r.status_code == 200 and SECRET_ANSWER in r.text
        # The engine refuses, echoing the prompt (as vLLM may): only its requester reads it,
        # not another tenant whose request ran beside it.
        fake.refuse_status = 400
        mine, theirs = await asyncio.gather(
            client.post("/v1/chat/completions", json=secret_chat, headers=A),
            client.post("/v1/chat/completions", json={"model": "other", "messages": MESSAGES}, headers=B))
        assert SECRET_PROMPT in assert_openai_error(mine, 400)["message"]
        assert SECRET_PROMPT not in assert_openai_error(theirs, 400)["message"]
        fake.refuse_status = None
        # The engine dies mid-stream, after some of the answer.
        dying = FakeEngine("dying", tokens=3, die_after_chunks=1)
        dying.reply = SECRET_ANSWER
        with serve(dying) as dying_url:
            app.state.routes.apply(routes_to(2, dying_url))
            r = await client.post("/v1/chat/completions", json={**secret_chat, "stream": True}, headers=A)
            assert "upstream_error" in r.text
        app.state.routes.apply(routes_to(3, url))
        # Refused by the activator: malformed, unknown field, a model it may not use, too large.
        for raw in (json.dumps(secret_chat)[:-1], json.dumps({**secret_chat, "frobnicate": SECRET_PROMPT}),
                    json.dumps({**secret_chat, "model": "other"}),
                    json.dumps({**secret_chat, "padding": SECRET_PROMPT * 200})):
            r = await client.post("/v1/chat/completions", content=raw,
                                  headers={**A, "content-type": "application/json"})
            assert r.status_code >= 400
            assert SECRET_PROMPT not in r.text  # not even the requester's, echoed by us
    logged = [json.dumps(e, default=str) for e in events] + [r.getMessage() + repr(r.__dict__) for r in caplog.records]
    assert any("request_dispatched" in line for line in logged)  # the capture saw the requests
    leaked = [line for line in logged if SECRET_PROMPT in line or SECRET_ANSWER in line]
    assert not leaked, leaked


async def test_metrics_need_the_cluster_token(tmp_path: Path) -> None:
    """/metrics names every model: on the tenants' port only the cluster token reads it
    (with a tenant's key or none, a tenant would learn the other tenants' models)."""
    app = create_app(two_tenant_config(tmp_path), f"http://127.0.0.1:{free_port()}", activator_id="iso",
                     token="cluster-secret")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
        for headers in (B, {}, {"Authorization": "Bearer cluster-secre"}, {"Authorization": "cluster-secret"}):
            r = await client.get("/metrics", headers=headers)
            assert r.status_code == 401, (headers, r.text)
            assert 'model="demo"' not in r.text
            assert r.json()["error"]["code"] == "cluster_token_required"
            assert r.headers["www-authenticate"] == "Bearer"
        r = await client.get("/metrics", headers={"Authorization": "Bearer cluster-secret"})
        assert r.status_code == 200 and 'model="demo"' in r.text
    await app.state.routes.close()
    await app.state.service.close()
    app.state.ledger.close()


def test_the_engine_is_launched_without_logging_prompts_or_outputs() -> None:
    """vLLM logs each request's prompt with --enable-log-requests and its output with
    --enable-log-outputs (both off by default in 0.32): a worker never passes either."""
    from thaw.config import EngineArgs
    from worker.launch import LaunchCommand, vllm_argv

    argv = vllm_argv(LaunchCommand(uri="s3://thaw/m", served_model_name="m", max_model_len=512,
                                   engine=EngineArgs(), port=4321, env={}))
    assert not [a for a in argv if a.startswith(("--enable-log-requests", "--enable-log-outputs"))], argv
