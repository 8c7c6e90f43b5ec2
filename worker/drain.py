"""Waiting for an engine to finish what it is running (a release, a sleep)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from thaw.log import get_logger
from worker.engine_client import EngineClient

log = get_logger()


async def drain(engine: EngineClient, timeout_s: float, *, poll_s: float, clock: Callable[[], float],
                on_in_flight: Callable[[int | None], None], engine_gone: Callable[[], bool]) -> None:
    """Wait until the engine has nothing running or waiting (two readings in a row),
    or ``timeout_s`` passes, or the engine is gone. Each reading goes to ``on_in_flight``."""
    deadline = clock() + timeout_s
    zeros = 0
    while True:
        n = await engine.in_flight()
        on_in_flight(n)
        zeros = zeros + 1 if n == 0 else 0
        if zeros >= 2:
            log.info("drained")
            return
        if engine_gone():
            log.warning("drain_engine_gone")
            return
        if clock() >= deadline:
            log.warning("drain_timeout", in_flight=n, timeout_s=timeout_s)
            return
        await asyncio.sleep(poll_s)
