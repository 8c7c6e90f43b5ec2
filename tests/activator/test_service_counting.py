"""Counting only when it matters (activator/service.py's admission with
activator/token_bound.py): a request the bound decides is not rendered; near the
context, near a tenant's token budget or for a model without a ready replica the prompt
is counted exactly, and refused as it was before the bound."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from activator.app import create_app
from activator.tokens import ModelTokenizer
from tests.activator.chat_templates import STRICT, tokenizer
from tests.activator.fake_engine import FakeEngine, serve
from tests.activator.support import KEY, assert_openai_error, make_config, replica, table
from tests.waiting import until
from thaw.config import parse_config
from thaw.demo_tokenizer import CHAT_TEMPLATE
from thaw.embedded_store import free_port

AUTH = {"Authorization": f"Bearer {KEY}"}
CONTEXT = 2048  # the demo model's max_context_tokens in examples/thaw.yaml


class Tokenizers:
    """The service's tokenizers: one for every model."""

    def __init__(self, tok: ModelTokenizer) -> None:
        self.tok = tok

    async def get(self, uri: str) -> ModelTokenizer:
        return self.tok


class Renders:
    """Counts the chat renderings and encodings of a tokenizer."""

    def __init__(self, tok: ModelTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        for name in ("render_chat", "_length"):
            monkeypatch.setattr(tok, name, self.counting(getattr(tok, name)))

    def counting(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return fn(*args, **kwargs)
        return wrapped


@contextlib.asynccontextmanager
async def hot_app(tmp_path: Path, demo_model_dir: Path,
                  limits: dict[str, int] | None = None) -> AsyncIterator[tuple[Any, httpx.AsyncClient, ModelTokenizer]]:
    """An activator whose demo model has a ready replica, with the demo tokenizer;
    the ``all`` tenant has ``limits``."""
    data = make_config(tmp_path).model_dump(mode="json")
    data["tenants"][0]["limits"] = limits or {}
    data["server"]["max_body_bytes"] = 1_000_000
    app = create_app(parse_config(data), f"http://127.0.0.1:{free_port()}", activator_id="count")
    tok = tokenizer(demo_model_dir, CHAT_TEMPLATE)
    app.state.service.tokens = Tokenizers(tok)
    with serve(FakeEngine("one")) as url:
        app.state.routes.apply(table(1, [replica(url)]))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
            yield app, client, tok
    await app.state.routes.close()
    await app.state.service.close()
    app.state.ledger.close()


def counts(app: Any, how: str) -> float:
    return app.state.service.metrics.registry.get_sample_value("thaw_prompt_counts_total", {"how": how}) or 0.0


def chat(content: str, **fields: Any) -> dict[str, Any]:
    return {"model": "thaw-demo", "messages": [{"role": "user", "content": content}], **fields}


async def test_a_request_the_bound_decides_is_not_rendered(
        tmp_path: Path, demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The bound of "hello there" is 170 (tests/activator/test_token_bound.py): 170 + 10
    # fits 2048, and its reservation 180 fits the tenant's 1000 a minute.
    async with hot_app(tmp_path, demo_model_dir, {"tokens_per_minute": 1000}) as (app, client, tok):
        renders = Renders(tok, monkeypatch)
        r = await client.post("/v1/chat/completions", json=chat("hello there", max_tokens=10), headers=AUTH)
        assert r.status_code == 200, r.text
        assert renders.calls == 0 and (counts(app, "bound"), counts(app, "exact")) == (1, 0)
        assert r.headers["x-ratelimit-remaining-tokens"] == "820"  # 1000 - 180, the bound's reservation


async def test_a_prompt_just_over_the_context_is_refused_as_before(
        tmp_path: Path, demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with hot_app(tmp_path, demo_model_dir) as (app, client, tok):
        await _just_over_the_context(app, client, tok, monkeypatch)


async def _just_over_the_context(app: Any, client: httpx.AsyncClient, tok: ModelTokenizer,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    renders = Renders(tok, monkeypatch)
    content = "hello there " * 40
    n = tok.count("chat", chat(content))
    assert n is not None
    over = await client.post("/v1/chat/completions", json=chat(content, max_tokens=CONTEXT - n + 1), headers=AUTH)
    err = assert_openai_error(over, 400, "context_length_exceeded", "max_tokens")
    assert err["message"] == (f"this model's maximum context length is {CONTEXT} tokens; the request needs "
                              f"{n} in the prompt + {CONTEXT - n + 1} to generate")
    # One token less fits: counted too (its bound did not fit), and sent.
    ok = await client.post("/v1/chat/completions", json=chat(content, max_tokens=CONTEXT - n), headers=AUTH)
    assert ok.status_code == 200, ok.text
    # A prompt over the context on its own names the messages.
    long = await client.post("/v1/chat/completions", json=chat("word " * 3000), headers=AUTH)
    assert_openai_error(long, 400, "context_length_exceeded", "messages")
    assert renders.calls > 0 and (counts(app, "bound"), counts(app, "exact")) == (0, 3)


async def test_a_tenant_at_its_token_limit_is_refused_as_before(tmp_path: Path, demo_model_dir: Path) -> None:
    # 118 tokens a minute: "hello there" is 18, + 100 to generate.
    async with hot_app(tmp_path, demo_model_dir, {"tokens_per_minute": 118}) as (app, client, tok):
        await _at_the_token_limit(app, client, tok)


async def _at_the_token_limit(app: Any, client: httpx.AsyncClient, tok: ModelTokenizer) -> None:
    assert tok.count("chat", chat("hello there")) == 18
    # The bound's reservation (170 + 100) is over the limit of 118; the exact one
    # (18 + 100) is not: counted, admitted.
    first = await client.post("/v1/chat/completions", json=chat("hello there", max_tokens=100), headers=AUTH)
    assert first.status_code == 200, first.text
    assert counts(app, "exact") == 1
    # 118 again: the engine used 8 of the first 118, so about 110 are left.
    again = await client.post("/v1/chat/completions", json=chat("hello there", max_tokens=100), headers=AUTH)
    err = assert_openai_error(again, 429, "rate_limit_tokens")
    assert "118 tokens per minute" in err["message"]
    # 18 + 101 = 119: more than the limit itself, whatever is left.
    big = await client.post("/v1/chat/completions", json=chat("hello there", max_tokens=101), headers=AUTH)
    err = assert_openai_error(big, 429, "tokens_exceeded")
    assert err["message"].startswith("this request needs 119 tokens (prompt + max tokens), more than the "
                                     "tenant's limit of 118 tokens per minute")


async def test_a_model_without_a_ready_replica_is_counted_and_a_refused_template_is_a_400(
        tmp_path: Path, demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(make_config(tmp_path), f"http://127.0.0.1:{free_port()}", activator_id="cold")
    monkeypatch.setattr(app.state.routes.feed, "signal_demand", lambda model, trace=None: None)
    strict = tokenizer(demo_model_dir, STRICT)
    app.state.service.tokens = Tokenizers(strict)
    refused = {"model": "thaw-demo", "messages": [{"role": "assistant", "content": "hi"}]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
        app.state.routes.apply(table(1, []))  # at zero
        r = await client.post("/v1/chat/completions", json=refused, headers=AUTH)
        err = assert_openai_error(r, 400, None, "messages")
        assert err["message"] == "the messages do not fit the model's chat template: the first turn must be the user"
        assert counts(app, "exact") == 1
        # A request it accepts is counted too, then waits for the cold start.
        waiting = asyncio.create_task(client.post("/v1/chat/completions", json=chat("hi"), headers=AUTH))
        try:
            await until("the cold request counted", lambda: counts(app, "exact") == 2)
        finally:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
    with serve(FakeEngine("one")) as url:
        app.state.routes.apply(table(2, [replica(url)]))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
            # Hot, the bound decides: the template's refusal is the engine's to give.
            r = await client.post("/v1/chat/completions", json=refused, headers=AUTH)
            assert r.status_code == 200 and counts(app, "bound") == 1
    await app.state.routes.close()
    await app.state.service.close()
    app.state.ledger.close()
