"""Following the leading controller among several (``controller.urls``).

Several controllers may share one PostgreSQL; one of them leads (``warm_pool.leader``).
A follower answers every call but ``/healthz`` with 503, ``error.type``
``not_leader`` and the leader's URL in the ``X-Thaw-Leader`` header (when one leads).
A client keeps the URL that last answered, and on a refused connection or a follower's
answer moves on: to the leader it was told of, else to the next URL in the list. One
call tries each URL about twice and then gives the last answer, or raises the last
connection error, as a single controller would. A leader the list does not name (a
follower's word) is followed too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from typing import Any, Protocol

import httpx

LEADER_HEADER = "X-Thaw-Leader"
# The leader's term on its control calls to workers (worker/fence.py).
TERM_HEADER = "X-Thaw-Term"
# When the sender's lease ends by its own count (epoch seconds): a call that arrives
# later is refused, although its worker has not heard of a newer term yet.
UNTIL_HEADER = "X-Thaw-Lease-Until"
NOT_LEADER = "not_leader"


def parse_urls(text: str | list[str]) -> list[str]:
    """``URL[,URL...]`` (or a list) as a list of URLs without trailing slashes."""
    items = text.split(",") if isinstance(text, str) else text
    urls = [u.strip().rstrip("/") for u in items if u.strip()]
    if not urls:
        raise ValueError("no controller URL given")
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise ValueError(f"controller URL {u!r} must start with http:// or https://")
    return urls


def is_not_leader(r: httpx.Response) -> bool:
    """A follower's answer (503 ``not_leader``)."""
    return r.status_code == 503 and r.headers.get("X-Thaw-Role") == "follower"


class Requester(Protocol):
    """What :meth:`Controllers.request` sends through: an ``httpx.AsyncClient``, or a
    harness's cheaper client of the same call (``loadtests.bare_client``)."""

    def request(self, method: str, url: str, **kw: Any) -> Awaitable[httpx.Response]: ...


class Controllers:
    """The controllers a client may call, and the one it calls now (``url``)."""

    def __init__(self, urls: str | list[str]) -> None:
        self.urls = parse_urls(urls)
        self.url = self.urls[0]

    def __repr__(self) -> str:
        return f"Controllers(url={self.url!r}, urls={self.urls!r})"

    def _next(self, r: httpx.Response | None) -> None:
        """Move on after a refused connection (``r`` None) or a follower's answer."""
        told = r.headers.get(LEADER_HEADER, "").rstrip("/") if r is not None else ""
        if told and told != self.url:
            if told not in self.urls:
                # A leader the list does not name (its URL as it advertises itself).
                self.urls.append(told)
            self.url = told
            return
        self.url = self.urls[(self.urls.index(self.url) + 1) % len(self.urls)]

    def _attempts(self) -> int:
        return 2 * len(self.urls) + 1

    def _done(self, r: httpx.Response | None) -> bool:
        """After one try (``r`` None: the connection failed): is this the answer? Else
        the next try goes where the follower said, or to the next URL."""
        if r is not None and not is_not_leader(r):
            return True
        if len(self.urls) == 1 and (r is None or not r.headers.get(LEADER_HEADER)):
            return True  # nowhere else to go
        self._next(r)
        return False

    def _tries(self, method: str) -> Generator[str, httpx.Response | httpx.TransportError, httpx.Response]:
        """The URL of each try, sent the outcome of the one before; returns the answer,
        or raises the connection error when no controller gave one.

        A read (GET) whose connection broke after it was made (a kept-alive connection
        the controller had closed: ``ReadError``, ``RemoteProtocolError``) is tried once
        more where it went, even with no other controller to try: it changes nothing."""
        answer: httpx.Response | None = None
        tries = self._attempts()
        reread = method.upper() == "GET"
        for attempt in range(tries):
            outcome = yield self.url
            if isinstance(outcome, httpx.TransportError):
                if reread and attempt + 1 < tries and isinstance(outcome, httpx.ReadError | httpx.RemoteProtocolError):
                    reread = False
                    continue
                if attempt + 1 < tries and not self._done(None):
                    continue
                if answer is None:
                    raise outcome
                break  # a follower's answer says more than this failure
            answer = outcome
            if self._done(answer):
                break
        assert answer is not None
        return answer

    async def request(self, http: httpx.AsyncClient | Requester, method: str, path: str, **kw: Any) -> httpx.Response:
        """``method path`` at the leader (see the module's docstring)."""
        tries = self._tries(method)
        url = next(tries)
        while True:
            try:
                outcome: httpx.Response | httpx.TransportError = await http.request(method, f"{url}{path}", **kw)
            except httpx.TransportError as exc:
                outcome = exc
            try:
                url = tries.send(outcome)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]

    def request_sync(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """The same, blocking (the ``thaw`` commands)."""
        tries = self._tries(method)
        url = next(tries)
        while True:
            try:
                outcome: httpx.Response | httpx.TransportError = httpx.request(method, f"{url}{path}", **kw)
            except httpx.TransportError as exc:
                outcome = exc
            try:
                url = tries.send(outcome)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]


class ControllerClient:
    """Calls to the leading controller with the cluster token, on one connection pool
    (the activator's Files and Batches APIs and its batch worker share one)."""

    def __init__(self, urls: str | list[str], token: str | None, *, timeout_s: float = 10.0) -> None:
        from thaw.auth import bearer

        self.controllers = Controllers(urls)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=2.0),
                                       headers=bearer(token) if token else None)

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """``method path`` at the leader; raises ``httpx.TransportError`` when no
        controller could be reached."""
        return await self.controllers.request(self._http, method, path, **kw)

    async def answer(self, method: str, path: str, **kw: Any) -> httpx.Response | None:
        """The leader's answer, or None (logged) when no controller could be reached or
        it failed (5xx): the caller says what that means to its own caller."""
        from thaw.log import get_logger

        try:
            r = await self.request(method, path, **kw)
        except httpx.TransportError as exc:
            get_logger().warning("controller_unreachable", path=path, error=repr(exc))
            return None
        except (AttributeError, RuntimeError) as exc:
            # httpcore can fail this way on a connection the controller drops as it dies
            # ('NoneType' object has no attribute 'getpeername'): no answer, as above.
            get_logger().warning("controller_unreachable", path=path, error=repr(exc))
            return None
        if r.status_code >= 500:
            get_logger().warning("controller_failed", path=path, status=r.status_code, body=r.text[:500])
            return None
        return r

    async def post_json(self, path: str, body: str, **kw: Any) -> httpx.Response | None:
        """``answer`` for a POST of a JSON body."""
        return await self.answer("POST", path, content=body, headers={"content-type": "application/json"}, **kw)

    async def aclose(self) -> None:
        await self._http.aclose()
