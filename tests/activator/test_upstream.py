"""The activator's HTTP/1.1 client against raw asyncio servers that misbehave on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from activator.upstream import UpstreamClosed, UpstreamPool
from thaw.embedded_store import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return await reader.readexactly(length)


OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def serving(handler: Handler) -> tuple[asyncio.Server, str]:
    port = free_port()
    server = await asyncio.start_server(handler, "127.0.0.1", port)
    return server, f"http://127.0.0.1:{port}/v1/chat/completions"


async def test_a_chunked_stream_arrives_whole_and_the_connection_is_kept() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                body = await read_request(reader)
            except asyncio.IncompleteReadError:
                break
            writer.write(OK_HEAD)
            for part in (b"data: 1\n\n", b"data: " + body + b"\n\n", b"data: [DONE]\n\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        writer.close()

    server, url = await serving(handler)
    pool = UpstreamPool()
    try:
        for i in range(3):
            r = await pool.post(url, b'{"n":%d}' % i, {"content-type": "application/json"})
            assert r.status == 200 and r.headers["content-type"] == "text/event-stream"
            assert await r.read() == b'data: 1\n\ndata: {"n":%d}\n\ndata: [DONE]\n\n' % i
            assert r.at_eof()
            r.release()
        assert connections == 1  # kept alive
    finally:
        await pool.close()
        server.close()


async def test_a_kept_connection_the_server_closed_is_replaced_once_transparently() -> None:
    served = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        await read_request(reader)
        served += 1
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        # Keep-alive by the headers, but this server reads the next request and hangs up.
        try:
            await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server, url = await serving(handler)
    pool = UpstreamPool()
    try:
        for _ in range(2):
            r = await pool.post(url, b"{}", {})
            assert await r.read() == b"ok"
            r.release()
        assert served == 2
    finally:
        await pool.close()
        server.close()


async def test_refused_dropped_and_silent_replicas_raise_what_the_service_retries_or_not() -> None:
    pool = UpstreamPool(read_timeout_s=0.3)
    with pytest.raises(UpstreamClosed, match="cannot connect"):
        await pool.post(f"http://127.0.0.1:{free_port()}/v1/completions", b"{}", {})

    async def drops_mid_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK_HEAD + b"9\r\ndata: 1\n\n\r\n")
        await writer.drain()
        writer.close()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    server, url = await serving(drops_mid_body)
    r = await pool.post(url, b"{}", {})
    assert await r.readany() == b"data: 1\n\n"
    with pytest.raises(UpstreamClosed):
        await r.readany()
    r.close()
    server.close()
    server, url = await serving(silent)
    with pytest.raises(TimeoutError):
        await pool.post(url, b"{}", {})
    server.close()
    await pool.close()


async def test_a_reader_that_falls_behind_pauses_the_replica() -> None:
    big = b"x" * 65536

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK_HEAD)
        for _ in range(64):  # 4 MiB
            writer.write(b"%x\r\n%s\r\n" % (len(big), big))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    server, url = await serving(flood)
    pool = UpstreamPool()
    try:
        r = await pool.post(url, b"{}", {})
        await asyncio.sleep(0.3)  # quiet: the reader does not read meanwhile
        assert r._buffered < 1024 * 1024  # paused near the high-water mark, not 4 MiB
        total = len(await r.read())
        assert total == 64 * len(big)
        r.release()
    finally:
        await pool.close()
        server.close()
