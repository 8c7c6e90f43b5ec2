"""The Responses API on the activator (activator/conversations/responses.py), with the official openai
client: a real activator on a loopback port, a fake engine, and a controller stand-in
that serves the route table and the real stored-responses API on SQLite.

A turn continued by ``previous_response_id`` sends the engine the whole history; a
response is stored before its client sees the end (streamed or not) and can be read,
listed and deleted; another tenant's id is a 404; ``store: false`` keeps nothing; bad
requests get 400s naming the parameter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi import FastAPI
from openai.types.responses import Response as SdkResponse

from activator.app import create_app
from tests.activator.fake_engine import FakeEngine
from tests.activator.support import KEY, LIMITED_KEY, controller_stand_in, make_config, replica
from tests.waiting import until
from tests.warm_pool.in_process import serve
from thaw.embedded_store import free_port
from thaw.wire import RouteTable
from warm_pool.db import Db


@dataclass
class World:
    url: str
    engine: FakeEngine
    clients: list[openai.AsyncOpenAI]

    def client(self, key: str = KEY) -> openai.AsyncOpenAI:
        c = openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0)
        self.clients.append(c)
        return c


def controller(engine_url: str, db: Db) -> FastAPI:
    entry = {"served_name": "thaw-demo", "replicas": [replica(engine_url)]}
    table = RouteTable.model_validate({"epoch": "e", "version": 1, "models": {"demo": entry}})
    return controller_stand_in(table, db)  # type: ignore[no-any-return]


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    engine = FakeEngine("one", tokens=3)
    db = Db.sqlite(None)
    engine_port, ctl_port, port = free_port(), free_port(), free_port()
    started = [await serve(engine.app, engine_port),
               await serve(controller(f"http://127.0.0.1:{engine_port}", db), ctl_port)]
    app = create_app(make_config(tmp_path), f"http://127.0.0.1:{ctl_port}", activator_id="r")
    started.append(await serve(app, port))
    try:
        await until("the activator's first route table", lambda: app.state.routes.feed.version >= 1)
        w = World(f"http://127.0.0.1:{port}", engine, [])
        yield w
        for c in w.clients:
            await c.close()
    finally:
        for server, task in reversed(started):
            server.should_exit = True
            await task
        db.close()


def sent(engine: FakeEngine) -> list[dict[str, Any]]:
    return engine.requests[-1]["body"]["messages"]  # type: ignore[no-any-return]


async def test_a_turn_continued_by_previous_response_id_sends_the_whole_history(world: World) -> None:
    client = world.client()
    first = await client.responses.create(model="thaw-demo", input="Hi", instructions="Be brief",
                                          max_output_tokens=3, metadata={"k": "v"})
    assert first.id.startswith("resp_") and first.status == "incomplete"  # the engine stopped at its length
    assert first.output_text == "tok0 tok1 tok2" and first.usage is not None and first.usage.input_tokens == 3
    assert first.metadata == {"k": "v"} and first.instructions == "Be brief"
    assert sent(world.engine) == [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"}]
    body = world.engine.requests[-1]["body"]
    assert body["max_tokens"] == 3 and body["model"] == "served-demo" and not body["stream"]
    second = await client.responses.create(model="thaw-demo", input=[{"role": "user", "content": "More"}],
                                           previous_response_id=first.id)
    # Instructions are not carried over (as OpenAI): the history is inputs and outputs.
    assert sent(world.engine) == [{"role": "user", "content": "Hi"},
                                  {"role": "assistant", "content": "tok0 tok1 tok2"},
                                  {"role": "user", "content": "More"}]
    assert second.previous_response_id == first.id
    got = await client.responses.retrieve(second.id)
    assert got.id == second.id and got.output_text == "tok0 tok1 tok2"
    items = await client.responses.input_items.list(second.id)
    assert [i.type for i in items.data] == ["message"] and items.data[0].content[0].text == "More"  # type: ignore[union-attr]
    # Deleted: gone, and nothing continues from it.
    deleted = await client.responses.delete(first.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as e:
        await client.responses.create(model="thaw-demo", input="Again", previous_response_id=second.id)
    assert e.value.code == "previous_response_not_found"


async def test_the_response_as_served_and_as_stored_is_the_sdks_response(world: World) -> None:
    # The SDK builds its objects without validating them; here the raw JSON is validated
    # against its Response model, tools as returned in the Responses shape they came in.
    client = world.client()
    tools = [{"type": "function", "name": "weather", "description": "d", "strict": False,
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    raw = await client.responses.with_raw_response.create(model="thaw-demo", input="Hi", tools=tools,
                                                          tool_choice="auto", temperature=0.5, user="u1")
    served = SdkResponse.model_validate(raw.http_response.json())
    assert served.tools[0].type == "function" and served.tools[0].name == "weather"  # type: ignore[union-attr]
    assert served.temperature == 0.5 and served.user == "u1" and served.tool_choice == "auto"
    assert world.engine.requests[-1]["body"]["tools"][0]["function"]["name"] == "weather"
    again = await client.responses.with_raw_response.retrieve(served.id)
    stored = SdkResponse.model_validate(again.http_response.json())
    assert stored.model_dump(exclude={"output_text"}) == served.model_dump(exclude={"output_text"})


async def test_a_streamed_response_is_stored_before_it_completes(world: World) -> None:
    client = world.client()
    kinds = []
    done = None
    async with await client.responses.create(model="thaw-demo", input="Hi", stream=True) as stream:
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.completed":
                done = event.response
                # Stored already: another request finds it while this stream is still open.
                assert (await client.responses.retrieve(done.id)).output_text == "tok0 tok1 tok2 "
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds.count("response.output_text.delta") == 3 and kinds[-1] == "response.completed"
    assert done is not None and done.usage is not None and done.usage.output_tokens == 3
    assert world.engine.requests[-1]["body"]["stream_options"] == {"include_usage": True}


async def test_another_tenant_gets_404_and_store_false_keeps_nothing(world: World) -> None:
    mine = await world.client().responses.create(model="thaw-demo", input="Hi")
    other = world.client(LIMITED_KEY)
    with pytest.raises(openai.NotFoundError):
        await other.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.input_items.list(mine.id)
    kept = await world.client().responses.create(model="thaw-demo", input="Hi", store=False)
    with pytest.raises(openai.NotFoundError):
        await world.client().responses.retrieve(kept.id)


@pytest.mark.parametrize("extra, param", [
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": []}, "input"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"truncation": "sometimes"}, "truncation"),
    ({"previous_response_id": "nope"}, "previous_response_id"),
    ({"colour": "red"}, "colour"),
])
async def test_a_bad_request_names_its_parameter(world: World, extra: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        await world.client().responses.create(model="thaw-demo", input="Hi", extra_body=extra)
    assert e.value.param == param, e.value.body


async def test_without_history_a_response_needs_input(world: World) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        await world.client().responses.create(model="thaw-demo")
    assert e.value.param == "input" and e.value.code == "missing_required_parameter"


async def test_a_conversation_holds_its_items_and_each_turn(world: World) -> None:
    client = world.client()
    conv = await client.conversations.create(items=[{"role": "user", "content": "Hi"},
                                                    {"role": "assistant", "content": "Hello"}],
                                             metadata={"topic": "demo"})
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "demo"}
    r = await client.responses.create(model="thaw-demo", input="And now?", conversation=conv.id)
    assert r.conversation is not None and r.conversation.id == conv.id
    assert sent(world.engine) == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                                  {"role": "user", "content": "And now?"}]
    # The turn's input and output are the conversation's now, and the next turn sees them.
    items = await client.conversations.items.list(conv.id, order="asc")
    texts = [i.content[0].text for i in items.data]  # type: ignore[union-attr]
    assert texts == ["Hi", "Hello", "And now?", "tok0 tok1 tok2"]
    await client.responses.create(model="thaw-demo", input="More", conversation={"id": conv.id}, store=False)
    assert len(sent(world.engine)) == 5
    added = await client.conversations.items.create(conv.id, items=[{"role": "user", "content": "Noted"}])
    first = added.data[0].id
    # Items added to a conversation are the next turn's input: a response then needs no `input`.
    await client.responses.create(model="thaw-demo", conversation=conv.id, store=False)
    assert sent(world.engine)[-1] == {"role": "user", "content": "Noted"}
    assert (await client.conversations.items.retrieve(first, conversation_id=conv.id)).id == first
    await client.conversations.items.delete(first, conversation_id=conv.id)
    with pytest.raises(openai.NotFoundError):
        await client.conversations.items.retrieve(first, conversation_id=conv.id)
    updated = await client.conversations.update(conv.id, metadata={"topic": "other"})
    assert updated.metadata == {"topic": "other"}
    # Another tenant: 404 for all of it.
    other = world.client(LIMITED_KEY)
    with pytest.raises(openai.NotFoundError):
        await other.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        await other.conversations.items.list(conv.id)
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model="thaw-demo", input="x", conversation=conv.id, previous_response_id=r.id)
    deleted = await client.conversations.delete(conv.id)
    assert deleted.deleted
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model="thaw-demo", input="x", conversation=conv.id)
