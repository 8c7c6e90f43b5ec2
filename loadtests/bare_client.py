"""A bare HTTP/1.1 client on asyncio streams, for harnesses that must cost little: the
simulated fleet (:mod:`loadtests.sim_fleet`) sends a thousand workers' heartbeats through
it, where httpx's machinery cost the harness most of a core and took it from the
controller it measures.

It speaks only what those calls need: one request at a time per kept-alive connection,
a body of ``Content-Length`` bytes or chunks, answers as :class:`httpx.Response` (so
:class:`thaw.controllers.Controllers` follows the leader with it as with httpx), and
failures as httpx's transport errors (``ConnectError`` before anything was sent,
``ReadError`` after)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit

import httpx

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class BareClient:
    def __init__(self, headers: dict[str, str] | None = None, *, timeout_s: float = 10.0,
                 connect_timeout_s: float = 5.0, max_idle: int = 64) -> None:
        self.headers = dict(headers or {})
        self.timeout_s, self.connect_timeout_s, self.max_idle = timeout_s, connect_timeout_s, max_idle
        self._idle: dict[tuple[str, int], list[Connection]] = {}

    async def request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        """``method url`` with ``content`` (bytes or text), ``headers`` and ``timeout``
        (seconds), httpx's names for them; nothing else is known here."""
        unknown = set(kw) - {"content", "headers", "timeout"}
        if unknown:
            raise TypeError(f"BareClient.request takes content, headers and timeout, not {sorted(unknown)}")
        content: bytes | str = kw.get("content", b"")
        headers: dict[str, str] | None = kw.get("headers")
        timeout: float | None = kw.get("timeout")
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        body = content.encode() if isinstance(content, str) else content
        lines = [f"{method} {target or '/'} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in {**self.headers, **(headers or {})}.items()]
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        key = (host, port)
        # A kept-alive connection the server closed meanwhile fails before any answer:
        # the request is sent once more on a new one (nothing was answered, so nothing done
        # twice by this client's callers' idempotent heartbeats and reads).
        for fresh in (False, True):
            conn = self._take(key) if not fresh else None
            reused = conn is not None
            if conn is None:
                conn = await self._open(host, port)
            try:
                status, response_headers, data, keep = await asyncio.wait_for(
                    self._exchange(conn, raw), timeout or self.timeout_s)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError) as exc:
                _close(conn)
                if reused and not fresh and not isinstance(exc, TimeoutError):
                    continue
                raise httpx.ReadError(f"{method} {url}: {type(exc).__name__}: {exc}") from None
            if keep and len(self._idle.setdefault(key, [])) < self.max_idle:
                self._idle[key].append(conn)
            else:
                _close(conn)
            return httpx.Response(status, headers=response_headers, content=data,
                                  request=httpx.Request(method, url))
        raise AssertionError("unreachable")

    def _take(self, key: tuple[str, int]) -> Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn[1].is_closing() and not conn[0].at_eof():
                return conn
            _close(conn)
        return None

    async def _open(self, host: str, port: int) -> Connection:
        try:
            return await asyncio.wait_for(asyncio.open_connection(host, port), self.connect_timeout_s)
        except (OSError, TimeoutError) as exc:
            raise httpx.ConnectError(f"{host}:{port}: {type(exc).__name__}: {exc}") from None

    @staticmethod
    async def _exchange(conn: Connection, raw: bytes) -> tuple[int, list[tuple[str, str]], bytes, bool]:
        reader, writer = conn
        writer.write(raw)
        await writer.drain()
        status_line = await reader.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        headers: list[tuple[str, str]] = []
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode("latin-1").partition(":")
            headers.append((name.strip(), value.strip()))
        found = {k.lower(): v for k, v in headers}
        if found.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while size := int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16):
                chunks.append(await reader.readexactly(size))
                await reader.readexactly(2)
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            data = b"".join(chunks)
        else:
            data = await reader.readexactly(int(found.get("content-length", "0")))
        keep = found.get("connection", "").lower() != "close"
        return status, headers, data, keep

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                _close(conn)
        self._idle.clear()


def _close(conn: Connection) -> None:
    with contextlib.suppress(Exception):
        conn[1].close()


async def first_event(url: str, body: bytes, headers: dict[str, str], *,
                      timeout_s: float = 300.0) -> tuple[int | None, float | None, str | None]:
    """POST ``body`` to ``url`` on a connection of its own and read the streamed answer to
    its end: its status, the seconds from the send to the first server-sent event
    (``data: ``; None if none came), and what went wrong (a refusal's body, or the
    transport's error). A harness's thousand streams at once, each on its own socket: no
    pool to wait in, and ``time`` starts when the request is written."""
    import time

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    lines = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}",
             "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    status: int | None = None
    first: float | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
                await writer.drain()
                t0 = time.perf_counter()
                status = int((await reader.readuntil(b"\r\n")).split(b" ", 2)[1])
                rest = b""
                while chunk := await reader.read(65536):
                    if first is None and b"data: " in rest[-8:] + chunk:
                        first = time.perf_counter() - t0
                    if status != 200 and len(rest) < 4096:
                        rest += chunk
                    elif status == 200:
                        rest = chunk[-8:]
            finally:
                _close((reader, writer))
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError) as exc:
        return status, first, f"{type(exc).__name__}: {exc}"
    if status != 200:
        return status, None, rest.split(b"\r\n\r\n", 1)[-1].decode(errors="replace")[:300]
    return status, first, None
