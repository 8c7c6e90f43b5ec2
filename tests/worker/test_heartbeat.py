"""The worker's heartbeat: accepted, refused, and giving up when the controller is gone."""

from __future__ import annotations

import asyncio

from tests.waiting import until
from tests.worker.fakes import TOKEN
from thaw.embedded_store import free_port
from thaw.wire import WorkerState, WorkerStatus
from worker.heartbeat import Heartbeat


def status() -> WorkerStatus:
    return WorkerStatus(worker_id="w1", instance_id="i-1", shape="cpu", state=WorkerState.STANDBY,
                        control_url="http://127.0.0.1:9", started_at=0, state_since=0)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def test_a_worker_without_a_controller_gives_up_after_exit_when_orphaned_s() -> None:
    clock = Clock()
    orphaned = asyncio.Event()
    failures: list[int] = []
    beat = Heartbeat(status, f"http://127.0.0.1:{free_port()}", TOKEN, interval_s=0.01, exit_when_orphaned_s=60,
                     on_orphaned=orphaned.set, on_failures=failures.append, clock=clock)
    await beat.start()
    try:
        # Nobody answers, but 60 s have not passed: it keeps trying.
        await until("a few failed beats", lambda: len(failures) >= 3)
        assert not orphaned.is_set() and failures[-1] == len(failures)
        clock.t = 61.0
        await asyncio.wait_for(orphaned.wait(), 5)
    finally:
        await beat.close()


async def test_no_limit_means_it_never_gives_up() -> None:
    clock = Clock()
    orphaned = asyncio.Event()
    beat = Heartbeat(status, f"http://127.0.0.1:{free_port()}", TOKEN, interval_s=0.01, on_orphaned=orphaned.set,
                     clock=clock)
    await beat.start()
    try:
        clock.t = 10_000.0
        await until("a few failed beats", lambda: beat.failures >= 3)
        assert not orphaned.is_set()
    finally:
        await beat.close()
