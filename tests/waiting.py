"""Waiting on a condition, never on the clock alone (tests/test_no_sleep_then_assert.py
holds every test to it): poll until a predicate holds, or fail naming what was awaited.

``pred`` may return an awaitable (a coroutine function's call) in the async form."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


async def until(what: str, pred: Callable[[], Any], timeout_s: float = 10.0, *, interval_s: float = 0.02,
                detail: Callable[[], str] | None = None) -> Any:
    """Poll ``pred`` on the event loop until it is truthy (its value); AssertionError
    after ``timeout_s`` naming ``what`` (and ``detail()``, the state to debug it by)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}"
                                 + (f": {detail()}" if detail is not None else ""))
        await asyncio.sleep(interval_s)


def wait_until(what: str, pred: Callable[[], Any], timeout_s: float = 10.0, interval_s: float = 0.05, *,
               detail: Callable[[], str] | None = None) -> Any:
    """:func:`until` for a thread that may block."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}"
                                 + (f": {detail()}" if detail is not None else ""))
        time.sleep(interval_s)
