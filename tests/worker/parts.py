"""A stand-in for the agent as its parts see it (``worker.kept``, ``worker.sleep``,
``worker.release``): each part reaches the agent through a small protocol, so its tests
drive it with this and the fakes' engine host and engine, without an Agent."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.waiting import until
from tests.worker.fakes import FakeEngine, FakeHost, World
from thaw.objstore import S3Endpoint
from thaw.wire import AssignRequest, FailureKind, WorkerState
from worker.engine_start import CurrentEngine
from worker.host import OnEvent
from worker.metrics import WorkerMetrics
from worker.settings import AgentSettings
from worker.state import Assignment, Facts, derive_state
from worker.tasks import Tasks


def settings(data_dir: Path, **over: Any) -> AgentSettings:
    fields: dict[str, Any] = {"worker_id": "w1", "shape": "cpu-small", "port": 0, "data_dir": data_dir,
                              "store": S3Endpoint("http://127.0.0.1:9", "AK", "SK"), "ready_poll_s": 0.01,
                              "drain_poll_s": 0.01, "load_timeout_s": 5.0, **over}
    return AgentSettings(**fields)


def engine(world: World, s: AgentSettings) -> CurrentEngine:
    return CurrentEngine(s, lambda url: FakeEngine(world, url))


def assignment(assignment_id: str = "a1", model: str = "demo") -> Assignment:
    return Assignment(assignment_id, model, f"s3://thaw/models/{model}", f"{model}-chat", 100.0)


def assign_request(assignment_id: str = "a1", model: str = "demo", **over: Any) -> AssignRequest:
    body: dict[str, Any] = {"assignment_id": assignment_id, "model": model, "uri": f"s3://thaw/models/{model}",
                            "served_model_name": f"{model}-chat", "max_model_len": 512,
                            "engine": {"enforce_eager": True, "cpu_kvcache_gib": 2}, **over}
    return AssignRequest.model_validate(body)


class FakeSupervisor:
    """The engine host supervisor: the host it holds, and the replacements and closes
    asked of it (a replacement stops the host; ``on_gone`` hears of it, as the agent's
    ``host_gone`` does)."""

    def __init__(self, host: FakeHost | None) -> None:
        self.host = host
        self.replaced: list[bool] = []
        self.closed: list[bool] = []
        self.on_gone: Callable[[], None] = lambda: None

    def replace(self, graceful: bool = True) -> asyncio.Task[None]:
        self.replaced.append(graceful)
        if self.host is not None:
            self.host.exit(-15 if graceful else -9)
        self.on_gone()
        return asyncio.get_running_loop().create_task(asyncio.sleep(0))

    async def close(self, graceful: bool) -> None:
        self.closed.append(graceful)
        if self.host is not None:
            self.host.exit(-15 if graceful else -9)


def host(world: World, on_event: OnEvent | None = None) -> FakeHost:
    h = FakeHost(world, on_event or (lambda _h, _ev: None))
    world.hosts.append(h)
    return h


class FakeAgent:
    """The agent's side of the parts' protocols: facts and the state derived from them,
    its tasks, and what the parts asked of it (failures, cache scans, work stopped,
    assignments cleared)."""

    def __init__(self, s: AgentSettings, facts: Facts | None = None) -> None:
        self.settings = s
        self.metrics = WorkerMetrics()
        self.facts = facts or Facts(host_running=True, host_imported=True)
        self.launched: AssignRequest | None = None
        self.on_released: Callable[[], None] | None = None
        self.failures: list[tuple[str, FailureKind]] = []
        self.scans = 0
        self.work_stopped = 0
        self.cleared = 0
        self._tasks = Tasks()

    @property
    def state(self) -> WorkerState:
        return derive_state(self.facts)

    def record(self, **changes: Any) -> None:
        self.facts = replace(self.facts, **changes)

    def spawn(self, coro: Coroutine[Any, Any, object], name: str) -> asyncio.Task[Any]:
        return self._tasks.spawn(coro, name=name)

    def fail(self, reason: str, kind: FailureKind = "engine") -> None:
        self.failures.append((reason, kind))
        if self.facts.failure is None:
            self.record(failure=reason, failure_kind=kind, prebuilt=None)

    def host_unwell(self, reason: str) -> None:
        if self.facts.failure is None:
            self.record(failure=reason)

    async def until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        try:
            await until("the facts to change", done, timeout_s, interval_s=0.005)
        except AssertionError:
            return False
        return True

    async def scan_caches(self) -> list[Any]:
        self.scans += 1
        return []

    async def stop_work(self) -> None:
        self.work_stopped += 1

    def clear_assignment(self) -> None:
        self.cleared += 1
        self.launched = None
        self.record(assignment=None, engine_ready_at=None, launched_at=None, release_requested_at=None,
                    failure=None, failure_kind=None, in_flight=None, sleep_requested_at=None, woken_at=None)

    async def close(self) -> None:
        await self._tasks.cancel_all()
