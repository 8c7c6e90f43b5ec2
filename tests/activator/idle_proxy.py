"""A TCP proxy with an idle limit, as load balancers have (an AWS ALB closes a connection
that carries no byte either way for 60 s by default): on the test's event loop, it
closes both sides of a connection once nothing has crossed it for ``idle_s``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from thaw.embedded_store import free_port


@asynccontextmanager
async def idle_limited_proxy(upstream_port: int, idle_s: float) -> AsyncIterator[tuple[str, list[float]]]:
    """Yields the proxy's base URL and the list of idle cuts it made (each connection's
    idle time when cut)."""
    cuts: list[float] = []

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream_port)
        last = time.monotonic()

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            nonlocal last
            while data := await r.read(65536):
                last = time.monotonic()
                w.write(data)
                await w.drain()

        pipes = [asyncio.ensure_future(pipe(client_r, up_w)), asyncio.ensure_future(pipe(up_r, client_w))]
        try:
            while not any(p.done() for p in pipes):
                idle = time.monotonic() - last
                if idle >= idle_s:
                    cuts.append(idle)
                    break
                await asyncio.wait(pipes, timeout=idle_s - idle, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for p in pipes:
                p.cancel()
            for w in (client_w, up_w):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()

    port = free_port()
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}", cuts
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5)
