"""Fakes of the worker's engine host and engine, and helpers to drive the agent's API
(shared by the worker, snapshotter and warm-pool tests)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.waiting import until
from thaw.objstore import S3Endpoint
from worker.engine_client import EngineError
from worker.host import OnEvent
from worker.launch import LaunchCommand
from worker.settings import AgentSettings

SECRET = "s3cr3t-never-shown"
# A model's config.json, as the fakes' store has it.
LLAMA: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_hidden_layers": 4,
                         "vocab_size": 4096, "torch_dtype": "bfloat16"}
TOKEN = "cluster-t0ken-never-shown"
_pids = itertools.count(1000)


@dataclass
class World:
    """What the fakes do; a test changes it to script a scenario."""

    hosts: list[FakeHost] = field(default_factory=list)
    import_on_spawn: bool = True
    # On launch: "ok" (weights load, then the engine answers), "fail" (a failed
    # event, then the host exits), "crash" (the host exits with output), "hang".
    on_launch: str = "ok"
    healthy: bool = False
    # in_flight readings, taken in order; the last one repeats.
    in_flight: list[int | None] = field(default_factory=lambda: [0])
    manifest: Callable[[S3Endpoint, str], object | None] = lambda store, uri: {"ok": True}
    # What the engine's loader reports with "weights_loaded" (None: nothing, as runai).
    load_report: dict[str, Any] | None = None
    # A swap: "ok" (swapped), or a failure kind ("weights", "prefix_cache", ...).
    on_swap: str = "ok"
    commands: list[Any] = field(default_factory=list)
    # The model's config.json as the store has it (None: none).
    config: dict[str, Any] | None = field(default_factory=lambda: dict(LLAMA))

    # The engine's sleep mode: calls seen, and errors to raise.
    sleeps: list[int] = field(default_factory=list)
    wakes: int = 0
    asleep: bool = False
    sleep_error: str | None = None
    wake_error: str | None = None

    # LoRA adapters the engine holds (served name -> path), calls seen, and the adapters
    # vLLM reports busy (running or waiting), taken in order; the last one repeats.
    loras: dict[str, str] = field(default_factory=dict)
    lora_calls: list[tuple[str, str]] = field(default_factory=list)
    lora_busy: list[set[str]] = field(default_factory=lambda: [set()])
    lora_error: str | None = None

    def next_in_flight(self) -> int | None:
        return self.in_flight.pop(0) if len(self.in_flight) > 1 else self.in_flight[0]


class FakeHost:
    def __init__(self, world: World, on_event: OnEvent) -> None:
        self.world = world
        self.on_event = on_event
        self.pid = next(_pids)
        self.launched = False
        self.launches: list[LaunchCommand] = []
        self.stops: list[float] = []
        self.output = ["vllm says hello", "Traceback (most recent call last):", "OSError: boom"]
        self._rc: int | None = None
        self._exited = asyncio.Event()

    @property
    def returncode(self) -> int | None:
        return self._rc

    def emit(self, event: str, **fields: Any) -> None:
        self.on_event(self, {"event": event, "t": time.time(), **fields})

    def exit(self, code: int) -> None:
        if self._rc is None:
            self._rc = code
            self._exited.set()

    async def launch(self, cmd: LaunchCommand) -> None:
        self.launched = True
        self.launches.append(cmd)
        loop = asyncio.get_running_loop()
        mode = self.world.on_launch
        if mode == "ok":
            loop.call_later(0.01, lambda: self.emit("weights_loaded", load=self.world.load_report))
            loop.call_later(0.02, setattr, self.world, "healthy", True)
        elif mode == "fail":
            loop.call_later(0.01, lambda: self.emit("failed", error="FileNotFoundError: NoSuchKey", where="engine_core"))
        elif mode == "crash":
            loop.call_later(0.01, self.exit, 1)

    async def command(self, cmd: Any) -> None:
        self.world.commands.append(cmd)
        loop = asyncio.get_running_loop()
        if cmd.op == "park":
            loop.call_later(0.01, lambda: self.emit("parked", swap_id=cmd.swap_id,
                                                    seconds={"prefix_cache_s": 0.002, "total_s": 0.002}))
        elif self.world.on_swap == "ok":
            loop.call_later(0.01, lambda: self.emit("swapped", swap_id=cmd.swap_id, load=self.world.load_report,
                                                    seconds={"total_s": 0.01}))
        else:
            loop.call_later(0.01, lambda: self.emit("swap_failed", swap_id=cmd.swap_id, kind=self.world.on_swap,
                                                    error="ChecksumMismatch: sha256 of model.safetensors differs"))

    async def wait(self) -> int:
        await self._exited.wait()
        assert self._rc is not None
        return self._rc

    async def stop(self, grace_s: float) -> None:
        self.stops.append(grace_s)
        self.world.healthy = False
        self.exit(-15 if grace_s else -9)

    def output_tail(self, lines: int = 20) -> str:
        return "\n".join(self.output[-lines:])


class FakeEngine:
    def __init__(self, world: World, base_url: str) -> None:
        self.world = world
        self.base_url = base_url

    async def healthy(self) -> bool:
        return self.world.healthy

    async def in_flight(self) -> int | None:
        return self.world.next_in_flight()

    async def sleep(self, level: int) -> None:
        self.world.sleeps.append(level)
        if self.world.sleep_error:
            raise EngineError(self.world.sleep_error)
        self.world.asleep = True

    async def wake_up(self) -> None:
        self.world.wakes += 1
        if self.world.wake_error:
            raise EngineError(self.world.wake_error)
        self.world.asleep = False

    async def load_lora(self, name: str, path: str) -> None:
        self.world.lora_calls.append(("load", name))
        if self.world.lora_error:
            raise EngineError(self.world.lora_error)
        self.world.loras[name] = path

    async def unload_lora(self, name: str) -> None:
        self.world.lora_calls.append(("unload", name))
        self.world.loras.pop(name, None)

    async def lora_busy(self) -> set[str] | None:
        busy = self.world.lora_busy
        return busy.pop(0) if len(busy) > 1 else busy[0]

    async def aclose(self) -> None:
        pass



def assign_body(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "assignment_id": "a1", "model": "demo", "uri": "s3://thaw/models/demo",
        "served_model_name": "demo-chat", "max_model_len": 512,
        "engine": {"enforce_eager": True, "cpu_kvcache_gib": 2},
    }
    body.update(over)
    return body


async def wait_state(c: httpx.AsyncClient, *states: str, timeout_s: float = 5.0) -> dict[str, Any]:
    last: list[dict[str, Any]] = [{}]

    async def reached() -> dict[str, Any] | None:
        last[0] = body = (await c.get("/state")).json()
        return body if body["state"] in states else None

    got: dict[str, Any] = await until(f"the agent in {states}", reached, timeout_s, interval_s=0.005,
                                      detail=lambda: f"state {last[0].get('state')!r}: {last[0]}")
    return got


async def ready(c: httpx.AsyncClient, **over: Any) -> dict[str, Any]:
    await wait_state(c, "standby")
    r = await c.post("/assign", json=assign_body(**over))
    assert r.status_code == 202, r.text
    return await wait_state(c, "ready")


# -- start-up, health, metrics -------------------------------------------------------


def fake_front_end_fetch(uri: str, dest: Path, manifest: Any) -> Path:
    """The fakes' model files: a copy that is complete and empty (no store to read)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / ".complete").touch()
    return dest


@asynccontextmanager
async def agent_client(world: World, data_dir: Path, *, secret: str = SECRET, settings: dict[str, Any] | None = None,
                       **deps: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The agent's app with fake engine hosts (each reports "imported" unless the world
    says not) and fake engines, served in process; a client with the cluster token.
    ``settings``: AgentSettings fields to change; ``deps``: more of the Agent's."""
    from worker.api import create_app

    async def spawn(on_event: OnEvent) -> FakeHost:
        h = FakeHost(world, on_event)
        world.hosts.append(h)
        if world.import_on_spawn:
            asyncio.get_running_loop().call_later(0.01, h.emit, "imported")
        return h

    fields: dict[str, Any] = {"worker_id": "w1", "shape": "cpu-small", "port": 0, "data_dir": data_dir,
                              "store": S3Endpoint("http://127.0.0.1:9", "AK", secret), "token": TOKEN,
                              "ready_poll_s": 0.01, "in_flight_poll_s": 0.01, "drain_poll_s": 0.01,
                              **(settings or {})}
    deps.setdefault("manifest_reader", lambda store, uri: world.manifest(store, uri))
    deps.setdefault("front_end_fetch", fake_front_end_fetch)
    app = create_app(AgentSettings(**fields), spawn_host=spawn, engine_client=lambda url: FakeEngine(world, url),
                     **deps)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent",
                                     headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            yield c
