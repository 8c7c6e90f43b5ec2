"""What one request may make the activator hold or walk: header bounds (431), JSON depth
and string bounds (400), body size (413) and the body's deadline (408); the last over
real sockets, as the activator is served (thaw.serve with its connection limits)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from activator.app import create_app
from activator.bounds import RequestBounds, check_headers, parse_json
from activator.errors import BadRequest, HeadersTooLarge
from activator.server import connection_limits
from tests.activator.fake_engine import read_until_closed as read_wire
from tests.activator.fake_engine import serve_app
from tests.activator.support import KEY, assert_openai_error, make_config
from thaw.config import ThawConfig
from thaw.embedded_store import free_port
from thaw.serve import ConnectionLimits

CHAT = {"model": "thaw-demo", "messages": [{"role": "user", "content": "hi"}]}
AUTH = {"Authorization": f"Bearer {KEY}"}
# A hang fails the test in this time instead of holding it; nothing waits for it.
HANG_S = 10.0


def config(**server: Any) -> ThawConfig:
    cfg = make_config()  # max_body_bytes 2000
    return cfg.model_copy(update={"server": cfg.server.model_copy(update=server)})


# -- pure checks ------------------------------------------------------------------------
BOUNDS = RequestBounds(max_header_count=3, max_header_bytes=100, max_header_line_bytes=40,
                       max_json_depth=4, max_json_string_chars=10)


@pytest.mark.parametrize("headers, refused", [
    ([(b"a", b"1")] * 3, False),
    ([(b"a", b"1")] * 4, True),  # 4 headers > 3
    ([(b"a", b"x" * 35)], False),  # 1 + 35 + 4 = 40 bytes: the line limit
    ([(b"a", b"x" * 36)], True),  # 41 > 40
    ([(b"a", b"x" * 30)] * 3, True),  # 3 * (1 + 30 + 4) = 105 > 100 in all
    ([(b"a", b"x" * 28)] * 3, False),  # 3 * 33 = 99
])
def test_header_bounds(headers: list[tuple[bytes, bytes]], refused: bool) -> None:
    if refused:
        with pytest.raises(HeadersTooLarge):
            check_headers(headers, BOUNDS)
    else:
        check_headers(headers, BOUNDS)


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("raw, code, param", [
    (nested(4), None, None),  # 4 levels: the limit
    (nested(5), "json_too_deep", "0.0.0.0"),  # the fifth level is the list at [0][0][0][0]
    (b'{"a": {"b": {"c": {"d": {}}}}}', "json_too_deep", "a.b.c.d"),
    # json's own recursion gives up first (about 1000 deep): the same 400.
    (nested(100_000), "json_too_deep", None),
    (b'{"a": "0123456789"}', None, None),  # 10 characters: the limit
    (b'{"a": [1, "01234567890"]}', "string_too_long", "a.1"),
    (b'{"0123456789a": 1}', "string_too_long", None),  # a key counts as a string
    # Escapes and multi-byte characters: characters are counted, not bytes.
    ('{"a": "\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9éééé\\n"}'.encode(), None, None),
    (b'{"a": ', "", None),  # not JSON at all: 400 without a code
])
def test_json_bounds(raw: bytes, code: str | None, param: str | None) -> None:
    if code is None:
        parse_json(raw, BOUNDS)
        return
    with pytest.raises(BadRequest) as err:
        parse_json(raw, BOUNDS)
    assert err.value.code == (code or None)
    assert err.value.param == param


def test_the_activator_connection_limits_come_from_its_config() -> None:
    cfg = config(header_timeout_s=3.0, max_header_bytes=1000)
    # The wire bound is 4 times the app's: between the two, the app's 431 with a request id.
    assert connection_limits(cfg.server) == ConnectionLimits(header_timeout_s=3.0, max_header_bytes=4000)


# -- the app, in process ---------------------------------------------------------------
@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(config(max_header_count=20, max_header_bytes=2000, max_header_line_bytes=1000,
                            max_json_string_chars=100, max_body_bytes=300_000),
                     f"http://127.0.0.1:{free_port()}", activator_id="b")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as c:
        yield c
    await app.state.routes.close()
    await app.state.service.close()
    app.state.ledger.close()


@pytest.mark.parametrize("headers", [
    {f"x-h{i}": "1" for i in range(20)},  # with httpx's own: over 20
    {"x-big": "a" * 1200},  # one line over 1000 bytes
    {f"x-h{i}": "a" * 500 for i in range(5)},  # 5 * 508 bytes: over 2000 in all
], ids=["count", "line", "total"])
@pytest.mark.parametrize("method, path", [
    ("GET", "/v1/models"), ("GET", "/healthz"), ("POST", "/v1/chat/completions"), ("POST", "/m/demo/v1/completions"),
    ("GET", "/nowhere"),
])
async def test_headers_over_the_bounds_are_431_on_every_path(client: httpx.AsyncClient, headers: dict[str, str],
                                                             method: str, path: str) -> None:
    r = await client.request(method, path, headers={**AUTH, **headers}, json=CHAT if method == "POST" else None)
    err = assert_openai_error(r, 431, "request_header_fields_too_large")
    assert err["type"] == "invalid_request_error"
    assert r.headers["connection"] == "close"


async def test_headers_within_the_bounds_are_served(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/models", headers={**AUTH, "x-big": "a" * 900})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("body, code, param", [
    # 100,000 deep: json's recursion gives up (about 1000 deep), a 400 all the same.
    (json.dumps({**CHAT, "x": 0}).replace("0", "[" * 100_000 + "]" * 100_000).encode(), "json_too_deep", None),
    # 36 lists in the body (level 1) and "x" (level 2): level 33 is x + 31 indices.
    (json.dumps({**CHAT, "x": 0}).replace("0", "[" * 36 + "]" * 36).encode(), "json_too_deep", "x" + ".0" * 31),
    (json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 101}]}).encode(),
     "string_too_long", "messages.0.content"),
], ids=["bomb", "deep", "long-string"])
async def test_json_bombs_are_400_with_their_code(client: httpx.AsyncClient, body: bytes, code: str,
                                                  param: str | None) -> None:
    r = await client.post("/v1/chat/completions", content=body, headers=AUTH)
    assert_openai_error(r, 400, code, param)


# -- the activator as it is served, over real sockets -----------------------------------
@pytest.fixture(scope="module")
def served() -> Iterator[int]:
    """The activator (no lifespan: no controller, no replicas) on a free loopback port,
    with the connection limits `thaw activator` gives it; yields the port."""
    cfg = config(header_timeout_s=0.5, body_timeout_s=0.5, max_header_bytes=4096)
    app = create_app(cfg, f"http://127.0.0.1:{free_port()}", activator_id="b-served")
    with serve_app(app, lifespan="off", limits=connection_limits(cfg.server), timeout_s=HANG_S) as url:
        yield int(url.rsplit(":", 1)[1])
    app.state.ledger.close()


def read_until_closed(sock: socket.socket) -> bytes:
    return read_wire(sock, HANG_S)


def read_answer(sock: socket.socket) -> bytes:
    """One answer with a Content-Length, the connection left as it is."""
    sock.settimeout(HANG_S)
    out = b""
    while True:
        head, sep, body = out.partition(b"\r\n\r\n")
        if sep and len(body) >= int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]):
            return out
        chunk = sock.recv(65536)
        assert chunk, out
        out += chunk


def answer(raw: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    if headers.get("transfer-encoding") == "chunked":
        size, _, rest = body.partition(b"\r\n")
        body = rest[:int(size, 16)]
    return int(lines[0].split(" ")[1]), headers, json.loads(body)


def post_head(length: int | None, key: str | None = KEY) -> bytes:
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: act\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    head += f"Authorization: Bearer {key}\r\n" if key else ""
    return (head + "\r\n").encode()


def test_a_body_too_slow_gets_408_and_the_connection_closes(served: int) -> None:
    body = json.dumps(CHAT).encode()
    with socket.create_connection(("127.0.0.1", served)) as slow:
        start = time.monotonic()
        slow.sendall(post_head(len(body)) + body[:10])  # and the rest never comes
        # Meanwhile, another connection is served.
        assert httpx.get(f"http://127.0.0.1:{served}/healthz", timeout=HANG_S).status_code == 200
        status, headers, err = answer(read_until_closed(slow))
        assert time.monotonic() - start < HANG_S
    assert status == 408
    assert err["error"]["code"] == "request_timeout" and err["error"]["type"] == "invalid_request_error"
    assert headers["connection"] == "close" and headers["x-request-id"]


def test_an_answer_before_the_body_ends_closes_the_connection(served: int) -> None:
    # No key: 401 without reading the body. Kept open, the connection would be held by a
    # body that trickles in for ever, read by nobody.
    with socket.create_connection(("127.0.0.1", served)) as conn:
        conn.sendall(post_head(1000, key=None) + b"{")
        status, headers, err = answer(read_until_closed(conn))
    assert status == 401 and err["error"]["code"] == "invalid_api_key"
    assert headers["connection"] == "close"


def test_a_chunked_body_over_the_limit_is_413(served: int) -> None:
    # No Content-Length to refuse up front: counted as it arrives (the limit: 2000 bytes).
    chunk = b"1f4\r\n" + b" " * 500 + b"\r\n"
    with socket.create_connection(("127.0.0.1", served)) as conn:
        conn.sendall(post_head(None) + chunk * 5 + b"0\r\n\r\n")
        status, headers, err = answer(read_answer(conn))
    assert status == 413 and err["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("size, end, by_the_app", [(6000, b"\r\n\r\n", True), (40_000, b"", False)])
def test_headers_over_the_bounds_are_431_on_the_wire(served: int, size: int, end: bytes, by_the_app: bool) -> None:
    # max_header_bytes 4096: over it, the app's 431 (with a request id). Headers still
    # coming past 4 times it (here: without end) get the connection's own, before the app
    # sees anything: without it, httptools would buffer them without limit.
    with socket.create_connection(("127.0.0.1", served)) as conn:
        try:
            conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: act\r\nX-Big: " + b"a" * size + end)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, headers, err = answer(read_until_closed(conn))
    assert status == 431 and err["error"]["code"] == "request_header_fields_too_large"
    assert ("x-request-id" in headers) == by_the_app
