"""Starting the engine an assignment runs: its launch command, its client and URL, and
waiting until it answers ``/health``.

The agent launches an engine for an assignment and the kept engines (``worker.kept``)
build one ahead or swap a model into it: both start and reach an engine the same way,
here."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from thaw.config import EngineArgs
from worker.caches import WeightCaches
from worker.engine_client import EngineClient
from worker.launch import LaunchCommand, engine_env
from worker.settings import AgentSettings

EngineClientFactory = Callable[[str], EngineClient]


def launch_command(settings: AgentSettings, caches: WeightCaches, uri: str, served_model_name: str,
                   max_model_len: int, engine: EngineArgs, port: int, *, cache_root_of: str,
                   sleep_mode: bool = False, swappable: bool = False, serving: bool = True) -> LaunchCommand:
    """The launch of ``uri`` on ``port``: its loader reads through the weight caches, and
    its compile cache is the one of model ``cache_root_of``."""
    s = settings
    cache_root = s.engine_cache_root(cache_root_of)
    return LaunchCommand(
        uri=uri, served_model_name=served_model_name, max_model_len=max_model_len,
        engine=caches.loader_args(engine), port=port, host=s.host, sleep_mode=sleep_mode,
        swappable=swappable, serving=serving,
        env=engine_env(engine, s.store.env(), str(s.data_dir), cache_root=str(cache_root),
                       assets_dir=str(s.engine_assets_dir), sleep_mode=sleep_mode),
    )


async def wait_healthy(engine: EngineClient, *, timeout_s: float, poll_s: float,
                       clock: Callable[[], float]) -> bool:
    """Wait until the engine answers ``/health``; False after ``timeout_s``."""
    deadline = clock() + timeout_s
    while not await engine.healthy():
        if clock() > deadline:
            return False
        await asyncio.sleep(poll_s)
    return True


class CurrentEngine:
    """The client of the engine the worker runs now and its URL for the routes (None
    and None: none). One place, so that the client and the URL never disagree."""

    def __init__(self, settings: AgentSettings, client: EngineClientFactory) -> None:
        self._settings = settings
        self._client_of = client
        self.client: EngineClient | None = None
        self.url: str | None = None

    def at(self, port: int, *, reuse: bool = False) -> EngineClient:
        """From now on the engine on ``port``: a new client, or with ``reuse`` the one
        held if there is one (a kept engine's stays across the models swapped in)."""
        s = self._settings
        if self.client is None or not reuse:
            self.client = self._client_of(f"http://{s.local}:{port}")
        self.url = f"http://{s.advertised}:{port}"
        return self.client

    async def close(self) -> None:
        client, self.client, self.url = self.client, None, None
        if client is not None:
            await client.aclose()
