"""Schema fuzzing of the worker agent's API (worker.api) with schemathesis: the real
agent app on loopback with a fake engine host and engine, the cluster token as the
bearer. No 5xx, every answer as /openapi.json documents it. See tests/fuzz/support.py
for the number of examples (THAW_FUZZ_EXAMPLES)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from schemathesis import Case

from tests.fuzz.support import fuzz_config, running
from tests.warm_pool.in_process import serve
from tests.worker.fakes import TOKEN, FakeEngine, FakeHost, World
from thaw.embedded_store import free_port
from thaw.objstore import S3Endpoint
from worker.api import create_app
from worker.host import OnEvent
from worker.settings import AgentSettings


def agent_app(root: Path, port: int = 0) -> Any:
    world = World()

    async def spawn(on_event: OnEvent) -> FakeHost:
        host = FakeHost(world, on_event)
        world.hosts.append(host)
        asyncio.get_running_loop().call_later(0.01, host.emit, "imported")
        return host

    settings = AgentSettings(worker_id="w1", shape="cpu-local", port=port, data_dir=root,
                             store=S3Endpoint("http://127.0.0.1:9", "AK", "SK"), token=TOKEN,
                             ready_poll_s=0.01, in_flight_poll_s=0.01, drain_poll_s=0.01)
    return create_app(settings, spawn_host=spawn, engine_client=lambda url: FakeEngine(world, url),
                      manifest_reader=lambda store, uri: {"ok": True})


def openapi() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="thaw-fuzz-") as root:
        return agent_app(Path(root)).openapi()  # type: ignore[no-any-return]


# The internal APIs parse with pydantic's lax mode (false reads as 0.0, "1" as 1): a
# type the schema does not allow is not always refused, so that check is off here.
CHECKS = {"negative_data_rejection": {"enabled": False}}
schema = schemathesis.openapi.from_dict(openapi(), config=fuzz_config("clusterToken", TOKEN, checks=CHECKS))


@asynccontextmanager
async def agent(root: Path) -> AsyncIterator[str]:
    port = free_port()
    server, task = await serve(agent_app(root, port), port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture(scope="module")
def agent_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="thaw-fuzz-") as root, running(lambda: agent(Path(root))) as url:
        yield url


@schema.parametrize()
def test_worker_api(case: Case, agent_url: str) -> None:
    case.call_and_validate(base_url=agent_url, timeout=30)
