"""The harness's bare HTTP/1.1 client (loadtests/bare_client.py) against a real uvicorn
server: answers as httpx's, kept-alive connections reused and replaced when the server
closed them, chunked bodies, transport errors as httpx's, and the leader followed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from loadtests.bare_client import BareClient, first_event
from tests.warm_pool.in_process import serve, serving
from thaw.controllers import LEADER_HEADER, Controllers
from thaw.embedded_store import free_port


def app(role: str = "leader", leader: str = "") -> FastAPI:
    a = FastAPI()
    a.state.peers = set()

    @a.post("/echo")
    async def echo(request: Request) -> JSONResponse:
        a.state.peers.add(request.client.port if request.client else None)
        if role != "leader":
            return JSONResponse({"error": "follower"}, 503, headers={"X-Thaw-Role": "follower", LEADER_HEADER: leader})
        return JSONResponse({"got": (await request.body()).decode(), "auth": request.headers.get("authorization"),
                             "query": str(request.url.query)}, headers={"X-Seen": "yes"})

    @a.post("/events", response_model=None)
    async def events(request: Request) -> StreamingResponse | JSONResponse:
        if (await request.body()) != b"go":
            return JSONResponse({"error": "no such model"}, 404)

        async def stream() -> AsyncIterator[bytes]:
            await asyncio.sleep(0.2)
            for i in range(3):
                yield f"data: {i}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    @a.get("/chunks")
    async def chunks() -> StreamingResponse:
        async def parts() -> AsyncIterator[bytes]:
            for i in range(3):
                yield f"part{i};".encode()

        return StreamingResponse(parts(), media_type="text/plain")

    return a


async def test_answers_as_httpx_does_on_one_kept_alive_connection() -> None:
    a = app()
    async with serving(a) as url:
        client = BareClient({"Authorization": "Bearer t"})
        try:
            for i in range(5):
                r = await client.request("POST", f"{url}/echo?x={i}", content=f"body{i}",
                                         headers={"content-type": "text/plain"})
                assert r.status_code == 200 and r.headers["x-seen"] == "yes"
                assert r.json() == {"got": f"body{i}", "auth": "Bearer t", "query": f"x={i}"}
            assert len(a.state.peers) == 1  # every request on the same connection
            r = await client.request("GET", f"{url}/chunks")
            assert r.status_code == 200 and r.text == "part0;part1;part2;"
            with pytest.raises(TypeError, match="json"):
                await client.request("POST", f"{url}/echo", json={})
        finally:
            await client.aclose()


async def test_a_connection_the_server_closed_is_replaced_and_a_dead_server_is_a_connect_error() -> None:
    client = BareClient()
    try:
        async with serving(app()) as url:
            assert (await client.request("POST", f"{url}/echo", content="a")).status_code == 200
        # The server is gone: the kept-alive connection fails, and so does a new one.
        with pytest.raises(httpx.ConnectError):
            await client.request("POST", f"{url}/echo", content="b")
        # A new server on the same port: the request goes through on a new connection.
        port = int(url.rsplit(":", 1)[1])
        server, task = await serve(app(), port)
        try:
            assert (await client.request("POST", f"{url}/echo", content="c")).json()["got"] == "c"
        finally:
            server.should_exit = True
            await task
    finally:
        await client.aclose()


async def test_a_silent_server_is_a_read_error_within_the_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        await asyncio.sleep(30)

    port = free_port()
    server = await asyncio.start_server(silent, "127.0.0.1", port)
    client = BareClient(timeout_s=0.3)
    try:
        with pytest.raises(httpx.ReadError):
            await client.request("POST", f"http://127.0.0.1:{port}/x", content="a")
    finally:
        await client.aclose()
        server.close()


async def test_controllers_follow_the_leader_through_it() -> None:
    async with serving(app()) as leader, serving(app("follower", "")) as follower:
        follower_app_told = app("follower", leader)
        async with serving(follower_app_told) as telling:
            client = BareClient()
            try:
                controllers = Controllers(f"{telling},{follower},{leader}")
                r = await controllers.request(client, "POST", "/echo", content="hb")
                assert r.status_code == 200 and r.json()["got"] == "hb" and controllers.url == leader
            finally:
                await client.aclose()


async def test_first_event_times_a_stream_and_says_why_a_refusal_was_refused() -> None:
    async with serving(app()) as url:
        status, ttft, error = await first_event(f"{url}/events", b"go", {})
        assert status == 200 and error is None and ttft is not None and 0.2 <= ttft < 10
        status, ttft, error = await first_event(f"{url}/events", b"nope", {})
        assert status == 404 and ttft is None and error is not None and "no such model" in error
    status, ttft, error = await first_event(url + "/events", b"go", {}, timeout_s=5)
    assert status is None and error is not None and ttft is None  # nothing listens there now
