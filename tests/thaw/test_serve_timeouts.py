"""Every service's connections (thaw.serve.guarded_protocol), over real sockets: a
client that sends its headers too slowly, never, or without end is cut off, while
requests on other connections, and long answers, go on."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from tests.activator.fake_engine import read_until_closed as read_wire
from tests.activator.fake_engine import serve_app
from tests.faults.support import tcp_queues
from thaw.serve import ConnectionLimits

LIMITS = ConnectionLimits(header_timeout_s=0.5, max_header_bytes=8 * 1024)
# A hang fails the test in this time instead of holding it; nothing waits for it.
HANG_S = 10.0


async def app(scope: Any, receive: Any, send: Any) -> None:
    """Answers "ok"; /slow after 1.5 s (longer than the header timeout)."""
    assert scope["type"] == "http"
    if scope["path"] == "/slow":
        await asyncio.sleep(1.5)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain"),
                                                                      (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@contextmanager
def serving(limits: ConnectionLimits = LIMITS) -> Iterator[int]:
    with serve_app(app, lifespan="off", limits=limits, timeout_s=HANG_S) as url:
        yield int(url.rsplit(":", 1)[1])


def read_until_closed(sock: socket.socket) -> bytes:
    return read_wire(sock, HANG_S)


def status_and_body(raw: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    return int(head.split(b" ")[1]), json.loads(body)


def trickle(sock: socket.socket, every_s: float = 0.1) -> threading.Thread:
    """Send one header byte every ``every_s`` (well within the timeout: it is the headers'
    deadline that must end it, not the gap between bytes) until the server hangs up."""

    def run() -> None:
        try:
            for _ in range(int(HANG_S / every_s)):
                sock.sendall(b"X")
                time.sleep(every_s)  # not a poll: the trickle's pace
        except OSError:
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_headers_sent_too_slowly_get_408_and_the_connection_closes() -> None:
    with serving() as port, socket.create_connection(("127.0.0.1", port)) as slow:
        start = time.monotonic()
        slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        sender = trickle(slow)
        # Meanwhile, another connection is served.
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=HANG_S).text == "ok"
        status, body = status_and_body(read_until_closed(slow))
        elapsed = time.monotonic() - start
        sender.join(timeout=HANG_S)
        assert status == 408
        assert body["error"]["code"] == "request_timeout"
        assert elapsed < HANG_S


def test_a_connection_that_sends_nothing_is_closed_silently() -> None:
    with serving() as port, socket.create_connection(("127.0.0.1", port)) as idle:
        assert read_until_closed(idle) == b""


def test_the_next_request_on_a_kept_alive_connection_has_its_own_deadline() -> None:
    with serving() as port, socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        conn.settimeout(HANG_S)
        answer = b""
        while not answer.endswith(b"\r\n\r\nok"):
            chunk = conn.recv(65536)
            assert chunk, answer
            answer += chunk
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the end of it
        status, body = status_and_body(read_until_closed(conn))
        assert status == 408


def test_a_long_answer_is_not_cut_by_the_header_deadline() -> None:
    # /slow answers after 1.5 s: the headers' clock stopped when they ended.
    with serving() as port:
        r = httpx.get(f"http://127.0.0.1:{port}/slow", timeout=HANG_S)
        assert r.status_code == 200 and r.text == "ok"


def test_headers_over_the_wire_bound_get_431_and_the_connection_closes() -> None:
    with serving() as port, socket.create_connection(("127.0.0.1", port)) as conn:
        # Without the bound, httptools buffers a header of any size (here: 32 KiB,
        # with no end of headers after it).
        try:
            conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (32 * 1024))
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, body = status_and_body(read_until_closed(conn))
        assert status == 431
        assert body["error"] == {"message": body["error"]["message"], "type": "invalid_request_error",
                                 "param": None, "code": "request_header_fields_too_large"}
        # Headers within the bound are served.
        assert httpx.get(f"http://127.0.0.1:{port}/", headers={"X-Ok": "a" * 4000}, timeout=HANG_S).text == "ok"


async def flood(scope: Any, receive: Any, send: Any) -> None:
    """Streams 32 MiB as fast as the connection takes it."""
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    chunk = b"x" * (64 * 1024)
    for _ in range(512):
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def test_a_client_that_does_not_read_gets_a_bounded_kernel_send_buffer() -> None:
    """What waits in the kernel for a client that stopped reading is bounded by
    ``send_buffer_bytes`` (doubled by the kernel), not grown by autotuning to 4 MiB."""
    limits = ConnectionLimits(send_buffer_bytes=128 * 1024)
    with serve_app(flood, lifespan="off", limits=limits, timeout_s=HANG_S) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            sock.recv(1)  # the answer has begun; from now on nothing is read
            waiting = 0
            for _ in range(20):
                time.sleep(0.1)  # not a poll: two seconds of not reading, for the queue to grow as far as it will
                waiting = max([q.tx for q in tcp_queues(os.getpid()) if q.local_port == port] or [0])
            assert 0 < waiting <= 2 * 128 * 1024 + 64 * 1024, waiting
