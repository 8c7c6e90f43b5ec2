"""LoRA adapters in the engine a worker serves (``models[].base``).

An adapter model rides the engines of its base. The controller asks a worker serving
the base to load the adapter (``POST /adapters``): the worker fetches its files from the
store whole, each checked against its manifest's sha256 (``weight_streaming.fetch``),
into its data directory, and has vLLM load them under the adapter's served name
(``/v1/load_lora_adapter``; the engine was started with ``--enable-lora`` because its
model has adapters). Requests naming that served name then use the adapter; vLLM keys
its prefix cache by the adapter too, so no two adapters (or the base) share cached
blocks. An unload (``POST /adapters/unload``) marks it at once (the routes drop it),
waits until vLLM has no request of it running or waiting, then unloads it and removes
its files. The adapters go with the assignment's engine.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from thaw.digest import short_id
from thaw.log import get_logger
from thaw.wire import AdapterRequest, AdapterView, AssignRequest, WorkerState
from weight_streaming.fetch import fetch_model_files
from worker.engine_client import EngineClient, EngineError
from worker.settings import AgentSettings
from worker.state import AdapterFacts, Assignment, Facts

log = get_logger()

# Fetches a pushed model's files whole into a directory (weight_streaming.fetch); blocking.
AdapterFetch = Callable[[Any, str, Path], Path]
# An unload waits this long at most for the adapter's requests to finish.
UNLOAD_DRAIN_S = 30.0


class AdapterConflict(Exception):
    """Not possible in the worker's state (HTTP 409); ``state`` names it."""

    def __init__(self, message: str, state: WorkerState) -> None:
        super().__init__(message)
        self.state = state


class AdapterHost(Protocol):
    """What the adapters need from the agent."""

    settings: AgentSettings

    @property
    def facts(self) -> Facts: ...
    @property
    def state(self) -> WorkerState: ...
    @property
    def engine(self) -> EngineClient | None: ...
    @property
    def launched(self) -> AssignRequest | None: ...
    def record(self, **changes: Any) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]: ...


class Adapters:
    def __init__(self, host: AdapterHost, *, clock: Callable[[], float],
                 fetch: AdapterFetch = fetch_model_files) -> None:
        self._host = host
        self._clock = clock
        self._fetch = fetch

    def views(self) -> list[AdapterView]:
        return [AdapterView(model=a.model, served_model_name=a.served_model_name, state=a.state,  # type: ignore[arg-type]
                            since=a.since, requested_at=a.requested_at, error=a.error)
                for a in self._host.facts.adapters]

    def _get(self, model: str) -> AdapterFacts | None:
        return next((a for a in self._host.facts.adapters if a.model == model), None)

    def _put(self, a: AdapterFacts | None, *, model: str) -> None:
        rest = tuple(x for x in self._host.facts.adapters if x.model != model)
        self._host.record(adapters=rest if a is None else (*rest, a))

    def load(self, req: AdapterRequest) -> bool:
        """Start loading the adapter; False when it is loaded or loading already.
        Raises :class:`AdapterConflict` unless the engine serves with LoRA and has a slot."""
        host = self._host
        launched = host.launched
        if host.state is not WorkerState.READY or launched is None:
            raise AdapterConflict(f"worker is {host.state.value}; an adapter loads only into a ready engine",
                                  host.state)
        extra = launched.engine.extra
        if not extra.get("enable_lora"):
            raise AdapterConflict(f"the engine of {launched.model} was not started with LoRA (no adapter of it "
                                  "in the config when it was assigned)", host.state)
        cur = self._get(req.model)
        if cur is not None and cur.state in ("loading", "ready"):
            return False
        if cur is not None and cur.state == "unloading":
            raise AdapterConflict(f"adapter {req.model} is being unloaded; ask again when it is gone", host.state)
        held = [a for a in host.facts.adapters if a.state != "failed" and a.model != req.model]
        slots = int(extra.get("max_loras") or 1)
        if len(held) >= slots:
            raise AdapterConflict(f"the engine holds {len(held)} adapters, its max_loras is {slots}: unload one "
                                  "first", host.state)
        assignment = host.facts.assignment
        assert assignment is not None
        now = self._clock()
        self._put(AdapterFacts(req.model, req.uri, req.served_model_name, "loading", now, now), model=req.model)
        log.info("adapter_loading", model=req.model, uri=req.uri, base=assignment.model)
        host.spawn(self._load(req, assignment), name=f"adapter_load_{req.model}")
        return True

    def _dir(self, uri: str) -> Path:
        return self._host.settings.data_dir / "adapters" / short_id(uri)

    async def _load(self, req: AdapterRequest, assignment: Assignment) -> None:
        host = self._host
        t0 = self._clock()
        try:
            store, dest = host.settings.store, self._dir(req.uri)
            # boto3 builds its client in the thread too: it blocks for tens of milliseconds.
            path = await asyncio.to_thread(lambda: self._fetch(store.client(), req.uri, dest))
            engine = host.engine
            if engine is None:
                raise EngineError("the engine went away")
            await engine.load_lora(req.served_model_name, str(path))
        except Exception as exc:
            if host.facts.assignment == assignment and self._get(req.model) is not None:
                error = f"{type(exc).__name__}: {exc}"
                log.error("adapter_failed", model=req.model, error=error)
                self._put(AdapterFacts(req.model, req.uri, req.served_model_name, "failed", self._clock(), t0,
                                       error=error[:1500]), model=req.model)
            return
        cur = self._get(req.model)
        if host.facts.assignment != assignment or cur is None or cur.state != "loading":
            return
        self._put(replace(cur, state="ready", since=self._clock()), model=req.model)
        log.info("adapter_ready", model=req.model, seconds=round(self._clock() - t0, 3))

    def unload(self, model: str) -> bool:
        """Start unloading; False when the adapter is not here."""
        cur = self._get(model)
        if cur is None:
            return False
        if cur.state == "unloading":
            return True
        if cur.state == "failed":
            self._put(None, model=model)
            return True
        self._put(replace(cur, state="unloading", since=self._clock()), model=model)
        log.info("adapter_unloading", model=model)
        self._host.spawn(self._unload(cur), name=f"adapter_unload_{model}")
        return True

    async def _unload(self, a: AdapterFacts) -> None:
        host = self._host
        engine = host.engine
        deadline = self._clock() + UNLOAD_DRAIN_S
        idle = 0
        # Its requests first: two readings in a row with none of them running or waiting.
        while engine is not None and idle < 2 and self._clock() < deadline:
            busy = await engine.lora_busy()
            idle = idle + 1 if busy is not None and a.served_model_name not in busy else 0
            if idle < 2:
                await asyncio.sleep(host.settings.drain_poll_s)
        try:
            if engine is not None:
                await engine.unload_lora(a.served_model_name)
        except EngineError as exc:
            log.warning("adapter_unload_failed", model=a.model, error=str(exc))
        # Its files go before its record: while the record says "unloading" no load of it
        # starts, so nothing can fetch into the directory being removed, and "gone" means gone.
        await asyncio.to_thread(shutil.rmtree, self._dir(a.uri), True)
        cur = self._get(a.model)
        if cur is not None and cur.state == "unloading":
            self._put(None, model=a.model)
        log.info("adapter_unloaded", model=a.model)
