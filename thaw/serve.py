"""Run one service's ASGI app the way every Thaw service runs: uvicorn, JSON logs, and a
SIGTERM (or Ctrl-C) that drains through the app's lifespan and exits 0.

Its connections have what uvicorn lacks (``guarded_protocol``): a deadline for a
request's headers, and a bound on their bytes on the wire, so that a client that sends
its headers slowly (slowloris), never, or without end holds neither a connection nor
memory for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import uvicorn


@dataclass(frozen=True)
class ConnectionLimits:
    """``header_timeout_s``: from a connection's first byte (or its opening, for its
    first request) to the end of a request's headers; then 408 and the connection is
    closed (closed silently if nothing came at all). ``max_header_bytes``: the request
    line and headers as they arrive; beyond, 431 and closed (httptools itself has no
    limit). An app may bound headers more tightly, with its own answer (the activator:
    ``activator.bounds``). ``send_buffer_bytes``: the kernel's send buffer of each
    connection (SO_SNDBUF; the kernel doubles it; None: the kernel's autotuning, up to
    ``net.ipv4.tcp_wmem``'s 4 MiB by default): what a client that does not read can make
    the host hold for it below the app's own buffers. 256 KiB still carries 2.5 MB/s
    at a 100 ms round trip, far above a token stream."""

    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    send_buffer_bytes: int | None = 256 * 1024


def run_server(app: Any, host: str, port: int, *, graceful_s: float = 10.0, access_log: bool = False,
               on_exit: Callable[[], Coroutine[Any, Any, None]] | None = None, reuse_port: bool = False,
               limits: ConnectionLimits | None = None) -> int:
    """Serve ``app`` until SIGTERM/SIGINT; 0 after a clean shutdown.

    uvicorn turns the signal into a graceful shutdown (the lifespan stops what the app
    started) and afterwards re-raises it under the handlers it found: these make that a
    no-op, so a completed shutdown exits 0 instead of dying by the signal.
    ``reuse_port``: bind with SO_REUSEPORT, so that several processes share the port and
    the kernel spreads new connections across them. ``limits``: those of every
    connection (default: ``ConnectionLimits()``).
    """
    import uvicorn

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    config = server_config(app, host, port, graceful_s=graceful_s, access_log=access_log, limits=limits)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Before uvicorn stops taking connections: e.g. the controller stops deciding.
            if on_exit is not None and not self.should_exit:
                asyncio.get_event_loop().create_task(on_exit())
            super().handle_exit(sig, frame)

    server = Server(config)
    server.run(sockets=[reuse_port_socket(host, port)] if reuse_port else None)
    return 0 if server.started else 1


def reuse_port_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def server_config(app: Any, host: str, port: int, *, graceful_s: float = 10.0, access_log: bool = False,
                  lifespan: Literal["auto", "on", "off"] = "on", limits: ConnectionLimits | None = None) -> uvicorn.Config:
    """uvicorn's config for ``app`` as ``run_server`` serves it."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_config=None, access_log=access_log, lifespan=lifespan,
                          timeout_graceful_shutdown=int(graceful_s),
                          http=guarded_protocol(limits or ConnectionLimits()))


def _raw_error(status: int, phrase: str, message: str, code: str) -> bytes:
    """An OpenAI-shaped error answer written straight to the connection, which then closes."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()
    return (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with ``limits`` on each request's headers."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    timeout_answer = _raw_error(408, "Request Timeout", "the request headers did not arrive within "
                                f"{limits.header_timeout_s:g} s", "request_timeout")
    too_large_answer = _raw_error(431, "Request Header Fields Too Large", "the request line and headers exceed "
                                  f"{limits.max_header_bytes} bytes", "request_header_fields_too_large")

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        # While reading a request's line and headers: their bytes so far (None: not reading them).
        _header_bytes: int | None = 0
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            sock = transport.get_extra_info("socket")
            if limits.send_buffer_bytes is not None and sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limits.send_buffer_bytes)
            super().connection_made(transport)
            self._header_bytes = 0
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._header_bytes is not None:
                self._header_bytes += len(data)
            super().data_received(data)
            # Checked after the parser has seen the data: a read that ends the headers and
            # brings some of the body is not counted against them.
            if self._header_bytes is not None and self._header_bytes > limits.max_header_bytes:
                self._refuse(too_large_answer)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._header_timer is None:  # the first request's runs from the connection's opening
                self._arm_header_timer()

        def on_headers_complete(self) -> None:
            self._header_bytes = None
            self._cancel_header_timer()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._header_bytes = 0  # what comes next is the next request's line and headers

        def _arm_header_timer(self) -> None:
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._header_timeout)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self.cycle is not None and not self.cycle.response_complete:
                # Still answering the request before (pipelined): the next one's headers
                # have their time from when it is done.
                self._arm_header_timer()
                return
            self._refuse(timeout_answer if self._header_bytes else None)

        def _refuse(self, answer: bytes | None) -> None:
            self._cancel_header_timer()
            self._header_bytes = None
            if self.transport.is_closing():
                return
            # Written only between answers: never into the middle of one.
            if answer is not None and (self.cycle is None or self.cycle.response_complete):
                self.transport.write(answer)
            self.transport.close()

    return GuardedHttpToolsProtocol
