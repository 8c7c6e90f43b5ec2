"""asyncio helpers that the standard library gets subtly wrong on Python 3.11."""

from __future__ import annotations

import asyncio
import contextlib


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` passes; True when it was set.

    Not ``asyncio.wait_for(event.wait(), t)``: on 3.11 that swallows a cancellation that
    arrives in the same loop turn as the event (it returns the event's result instead of
    raising), so a background loop built on it can outlive its ``cancel()`` forever.
    ``asyncio.timeout`` tells its own cancellation from the caller's."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()
