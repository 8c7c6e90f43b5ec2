"""The activator's HTTP/1.1 client to its replicas: asyncio protocols and httptools.

Every token of every stream passes through here, so the per-read work is what counts:
a socket read is parsed by httptools (C) and its body bytes are appended to a list;
the reader takes everything that arrived since its last read in one piece. General
clients do several Python calls per chunk of a chunked response (aiohttp) or hold a
cancel scope per read (httpx); ``thaw bench activator`` and ``loadtests.http_overhead``
measure the difference (docs/BENCHMARKS.md).

What it does not do, because the activator never needs it: TLS, redirects, proxies,
cookies, request bodies other than bytes, compression. Connections are kept alive per
(host, port); a pooled connection that turns out to be closed before any byte of the
answer came back is replaced by a fresh one once, transparently (the server never saw
the request). Errors: :class:`UpstreamClosed` (a ``ConnectionError``) when a replica
refuses the connection or drops it; ``TimeoutError`` when it is silent for
``read_timeout_s`` (the pool's, or the one ``post`` was given for that answer).
"""

from __future__ import annotations

import asyncio
from collections import deque

import httptools

HIGH_WATER = 256 * 1024  # buffered answer bytes at which the replica is paused (a slow client)


class UpstreamClosed(ConnectionError):
    """The replica refused the connection or dropped it before the answer was complete."""


class _Connection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.response: UpstreamResponse | None = None

    # -- asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamClosed(f"the replica's answer is not valid HTTP: {exc}"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(UpstreamClosed(f"the replica closed the connection{f': {exc}' if exc else ''}"))

    # -- httptools callbacks ---------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None:
            self.response.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        r = self.response
        if r is not None:
            r.status = self.parser.get_status_code()
            r.keep_alive = self.parser.should_keep_alive()
            r._wake()

    def on_body(self, body: bytes) -> None:
        r = self.response
        if r is not None:
            r._pieces.append(body)
            r._buffered += len(body)
            r.received_body = True
            if r._buffered > HIGH_WATER and self.transport is not None and not r._paused:
                r._paused = True
                self.transport.pause_reading()
            r._wake()

    def on_message_complete(self) -> None:
        r = self.response
        if r is not None:
            r.complete = True
            r._wake()

    # -- ours ------------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        r = self.response
        if r is not None and not r.complete and r.error is None:
            r.error = exc
            r._wake()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """An answer whose status and headers arrived; its body is read with :meth:`readany`
    or :meth:`read`. :meth:`release` when done (the connection is kept if the answer was
    whole), :meth:`close` to drop it (the replica sees the client leave)."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int], conn: _Connection,
                 read_timeout_s: float | None = None) -> None:
        self._pool = pool
        self.read_timeout_s = pool.read_timeout_s if read_timeout_s is None else read_timeout_s
        self._key = key
        self._conn = conn
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = False
        self.complete = False
        self.received_body = False
        self.error: BaseException | None = None
        self._pieces: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._done = False

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self, what: str) -> None:
        loop = self._conn.loop
        fut = self._waiter = loop.create_future()
        timer = loop.call_later(self.read_timeout_s, _expire, fut, what)
        try:
            await fut
        finally:
            timer.cancel()
            self._waiter = None

    async def _headers(self) -> None:
        while not self.status and self.error is None:
            await self._wait("headers")
        if not self.status and self.error is not None:
            raise self.error

    def at_eof(self) -> bool:
        return self.complete and not self._pieces

    async def readany(self) -> bytes:
        """Every body byte that arrived since the last call (waiting for some if none
        did); ``b""`` once the answer is complete."""
        while not self._pieces:
            if self.complete:
                return b""
            if self.error is not None:
                raise self.error
            await self._wait("body")
        data = self._pieces.popleft() if len(self._pieces) == 1 else b"".join(self._pieces)
        self._pieces.clear()
        self._buffered = 0
        if self._paused and self._conn.transport is not None:
            self._paused = False
            self._conn.transport.resume_reading()
        return data

    async def read(self) -> bytes:
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        if self._done:
            return
        self._done = True
        self._conn.response = None
        if self.complete and self.keep_alive and not self._conn.closed:
            self._pool._put(self._key, self._conn)
        else:
            self._conn.close()

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        self._conn.response = None
        self._conn.close()


def _expire(fut: asyncio.Future[None], what: str) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError(f"the replica sent nothing for too long (waiting for its {what})"))


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to replicas; made and used in one event loop."""

    def __init__(self, *, connect_timeout_s: float = 2.0, read_timeout_s: float = 600.0,
                 max_idle_per_host: int = 100) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    async def post(self, url: str, body: bytes, headers: dict[str, str],
                   read_timeout_s: float | None = None) -> UpstreamResponse:
        """Send ``body`` to ``url`` (``http://host:port/path``); returns once the status
        and headers are in. ``read_timeout_s``: this answer's longest silence (before its
        headers, between two reads), instead of the pool's."""
        host, port, path = _split(url)
        key = (host, port)
        head = (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-length: {len(body)}\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode("latin-1")
        while True:
            conn = self._take(key)
            fresh = conn is None
            if conn is None:
                conn = await self._connect(host, port)
            response = UpstreamResponse(self, key, conn, read_timeout_s)
            conn.response = response
            assert conn.transport is not None
            conn.transport.writelines((head, body))
            try:
                await response._headers()
                return response
            except UpstreamClosed:
                response.close()
                if fresh or response.status or response.received_body:
                    raise
                # A kept-alive connection the replica had closed: the request never got
                # there. Once more on a new connection.

    def _take(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    def _put(self, key: tuple[str, int], conn: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) < self.max_idle_per_host:
            conn.parser = httptools.HttpResponseParser(conn)
            idle.append(conn)
        else:
            conn.close()

    async def _connect(self, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(lambda: _Connection(loop), host, port)
        except TimeoutError:
            raise UpstreamClosed(f"cannot connect to {host}:{port}: no answer in {self.connect_timeout_s} s") from None
        except OSError as exc:
            raise UpstreamClosed(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
        return conn

    async def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


_SPLIT_CACHE: dict[str, tuple[str, int, str]] = {}


def _split(url: str) -> tuple[str, int, str]:
    got = _SPLIT_CACHE.get(url)
    if got is None:
        if not url.startswith("http://"):
            raise ValueError(f"replica URL {url!r}: only http:// is supported")
        hostport, _, path = url[len("http://"):].partition("/")
        host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "80")
        got = (host.strip("[]"), int(port), "/" + path)
        if len(_SPLIT_CACHE) < 10_000:
            _SPLIT_CACHE[url] = got
    return got
