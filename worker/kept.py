"""Engines kept across models (``pools[].prebuild``): built ahead, swapped into, parked.

Standing by, the worker builds an engine of a class it is asked for (``prebuild``); an
assignment of a model of that class (``worker.identity``: same class and vocabulary)
swaps its weights into that engine (``worker.engine_host.swap_server`` in the engine host,
``worker.engine_host.swap_core`` in the engine core) instead of launching one; a release parks the
drained engine (serving nothing, prefix cache dropped) rather than stopping it, when
the controller's assignment named its class. A swap or park that fails marks the engine
dirty: it is stopped and a fresh host started, as for any failure.

Swap and park are commands to the engine host; each waits for its answering event
(:meth:`KeptEngines.answer`), or for the host to go (:meth:`KeptEngines.host_gone`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, Protocol

from thaw.config import EngineArgs
from thaw.embedded_store import free_port
from thaw.log import get_logger
from thaw.objstore import S3Endpoint, read_model_config
from thaw.wire import AssignRequest, FailureKind, PrebuildRequest, WorkerState
from weight_streaming.push import read_manifest
from worker.caches import WeightCaches
from worker.engine_start import CurrentEngine, launch_command, wait_healthy
from worker.errors import Conflict
from worker.front_end_files import FrontEndFetch, front_end_dir
from worker.identity import ModelIdentity, identity_of
from worker.launch import (
    EV_PARKED,
    EV_SWAP_FAILED,
    EV_SWAPPED,
    ParkCommand,
    SwapCommand,
    reported_kind,
)
from worker.metrics import WorkerMetrics
from worker.settings import AgentSettings
from worker.state import Assignment, Facts, Prebuilt, load_view
from worker.supervisor import HostSupervisor

log = get_logger()

# Synchronous (boto3); run in a thread. Returns None when there is no manifest.
ManifestReader = Callable[[S3Endpoint, str], object | None]
# The model's config.json (None: none). Synchronous, like the manifest reader.
ConfigReader = Callable[[S3Endpoint, str], dict[str, Any] | None]


def read_store_manifest(store: S3Endpoint, uri: str) -> object | None:
    return read_manifest(store.client(), uri)


def read_store_config(store: S3Endpoint, uri: str) -> dict[str, Any] | None:
    return read_model_config(store.client(), uri)


class KeptAgent(Protocol):
    """What the kept engines need from the agent."""

    settings: AgentSettings
    metrics: WorkerMetrics

    @property
    def facts(self) -> Facts: ...
    @property
    def state(self) -> WorkerState: ...
    def record(self, **changes: Any) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, object], name: str) -> asyncio.Task[Any]: ...
    def fail(self, reason: str, kind: FailureKind = "engine") -> None: ...
    def host_unwell(self, reason: str) -> None: ...
    async def until(self, done: Callable[[], bool], timeout_s: float) -> bool: ...
    async def scan_caches(self) -> list[Any]: ...


class KeptEngines:
    def __init__(self, agent: KeptAgent, *, supervisor: HostSupervisor, engine: CurrentEngine,
                 caches: WeightCaches, clock: Callable[[], float], manifest_reader: ManifestReader,
                 config_reader: ConfigReader, front_end_fetch: FrontEndFetch) -> None:
        self._agent = agent
        self._supervisor = supervisor
        self._engine = engine
        self._caches = caches
        self._clock = clock
        self._manifest_reader = manifest_reader
        self._config_reader = config_reader
        self._front_end_fetch = front_end_fetch
        # Swap and park commands waiting for their event, by swap id.
        self._waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}

    async def identity(self, uri: str, manifest: object, engine: EngineArgs,
                       max_model_len: int) -> ModelIdentity | None:
        """What the model is to a kept engine; None (no swap, nothing kept) when its
        config cannot be read: the model is then built as any other."""
        try:
            config = await asyncio.to_thread(self._config_reader, self._agent.settings.store, uri)
            return identity_of(manifest, config, engine, max_model_len)
        except Exception as exc:
            log.warning("engine_class_unknown", uri=uri, error=f"{type(exc).__name__}: {exc}")
            return None

    # -- pre-built --------------------------------------------------------------------

    async def prebuild(self, req: PrebuildRequest) -> bool:
        """Build an engine of ``req.model``'s class while standing by; False when this
        worker already keeps one of that class. Raises :class:`Conflict` unless
        standing by with no engine (the caller checks the URI first: ``check_uri``)."""
        agent = self._agent
        f = agent.facts
        if f.prebuilt is not None and f.prebuilt.engine_class == req.engine_class:
            return False
        host = self._supervisor.host
        if agent.state is not WorkerState.STANDBY or f.prebuilt is not None or host is None or host.launched:
            raise Conflict(f"worker is {agent.state.value}"
                           + (" and keeps an engine already" if f.prebuilt is not None else "")
                           + "; it builds an engine only standing by with none", agent.state)
        agent.record(prebuilt=Prebuilt(req.engine_class, "", req.model, req.uri, 0, None))
        log.info("prebuild_accepted", model=req.model, engine_class=req.engine_class)
        agent.spawn(self._run_prebuild(req), name="prebuild")
        return True

    async def _run_prebuild(self, req: PrebuildRequest) -> None:
        agent = self._agent
        s = agent.settings
        t0 = self._clock()
        try:
            manifest = await asyncio.to_thread(self._manifest_reader, s.store, req.uri)
        except Exception as exc:
            manifest = None
            log.warning("prebuild_manifest_unreadable", uri=req.uri, error=str(exc))
        ident = await self.identity(req.uri, manifest, req.engine, req.max_model_len) if manifest else None
        host = self._supervisor.host
        p = agent.facts.prebuilt
        if ident is None or host is None or host.launched or p is None or p.built_at is not None:
            agent.record(prebuilt=None)
            agent.host_unwell(f"cannot build an engine for {req.model}: "
                              + ("its manifest or config.json could not be read" if ident is None
                                 else "the engine host is not standing by"))
            return
        if ident.engine_class.id != req.engine_class:
            # The controller's view of the model is older than the store's: ours counts.
            log.warning("engine_class_differs", model=req.model, controller=req.engine_class,
                        worker=ident.engine_class.id)
        port = free_port()
        cmd = launch_command(s, self._caches, req.uri, f"thaw-prebuilt-{ident.engine_class.id}", req.max_model_len,
                             req.engine, port, cache_root_of=req.model, swappable=True, serving=False)
        agent.record(prebuilt=replace(p, engine_class=ident.engine_class.id, vocab=ident.vocab, port=port))
        engine = self._engine.at(port)
        try:
            await host.launch(cmd)
        except (BrokenPipeError, ConnectionResetError):
            return  # the engine host died: its watcher reports why
        if not await wait_healthy(engine, timeout_s=s.load_timeout_s, poll_s=s.ready_poll_s, clock=self._clock):
            if agent.facts.prebuilt is not None:
                agent.host_unwell(f"the engine built for {req.model} did not answer /health within "
                                  f"{s.load_timeout_s:.0f} s")
                self._supervisor.replace(graceful=False)
            return
        p = agent.facts.prebuilt
        if p is not None and p.port == port:
            now = self._clock()
            agent.record(prebuilt=replace(p, built_at=now))
            agent.metrics.engine_start.observe(now - t0)
            log.info("engine_prebuilt", model=req.model, engine_class=ident.engine_class.id,
                     seconds=round(now - t0, 3))

    # -- swapped into -------------------------------------------------------------------

    async def swap_if_it_fits(self, a: Assignment, req: AssignRequest, ident: ModelIdentity | None,
                              manifest: object = None) -> bool:
        """Swap the model into the kept engine when it is of its class (waiting for one
        still being built); else stop that engine (a fresh engine host follows) and
        return False. A swap that fails fails the assignment (returns False)."""
        agent = self._agent
        s = agent.settings
        await agent.until(lambda: agent.facts.prebuilt is None or agent.facts.prebuilt.built_at is not None,
                          s.load_timeout_s)
        p = agent.facts.prebuilt
        if p is None:
            return False
        fits = (ident is not None and p.built_at is not None
                and (ident.engine_class.id, ident.vocab) == (p.engine_class, p.vocab))
        if not fits:
            why = ("its class is unknown" if ident is None else "the engine is not built" if p.built_at is None
                   else f"vocabulary files differ from {p.model}'s" if ident.engine_class.id == p.engine_class
                   else f"another engine class ({ident.engine_class.id} != {p.engine_class})")
            log.info("kept_engine_replaced", assignment_id=a.assignment_id, model=a.model, kept=p.model, reason=why)
            await self._supervisor.replace(graceful=False)
            return False
        engine = self._engine.at(p.port, reuse=True)
        now = self._clock()
        agent.record(snapshot_restored_at=now, launched_at=now)
        extra = self._caches.loader_args(req.engine).extra.get("model_loader_extra_config") or {}
        files = await front_end_dir(s.data_dir / "model-files", self._front_end_fetch, req.uri, manifest)
        ev = await self._command(SwapCommand(swap_id=a.assignment_id, uri=req.uri,
                                             served_model_name=req.served_model_name, loader_options=extra,
                                             files_dir=files))
        if ev.get("event") != EV_SWAPPED:
            agent.fail(f"swapping the model into the engine failed ({ev.get('kind', 'engine')}): "
                       f"{ev.get('error') or 'no reason given'}", reported_kind(ev.get("cause")))
            return False
        report, steps = ev.get("load"), ev.get("seconds")
        lv = load_view(req.uri, report if isinstance(report, dict) else None,
                       swap_steps=steps if isinstance(steps, dict) else {})
        self._caches.note_load(lv)
        agent.spawn(agent.scan_caches(), name="scan_caches_after_swap")
        agent.record(weights_loaded_at=float(ev.get("t") or self._clock()), load=lv,
                     prebuilt=replace(p, model=req.model, uri=req.uri))
        if not await wait_healthy(engine, timeout_s=s.load_timeout_s, poll_s=s.ready_poll_s, clock=self._clock):
            agent.fail("the engine did not answer /health after the swap")
            return False
        now = self._clock()
        agent.record(engine_ready_at=now)
        agent.metrics.engine_start.observe(now - a.assigned_at)
        log.info("engine_ready", assignment_id=a.assignment_id, model=a.model, engine_url=self._engine.url,
                 total_s=round(now - a.assigned_at, 3), swap=True, tier=lv.tier, steps_s=ev.get("seconds"))
        return True

    # -- parked ---------------------------------------------------------------------------

    async def park(self) -> bool:
        """Keep a drained engine that can take another model (it came from a kept
        engine or was started swappable): it stops serving and drops its prefix cache.
        False when there is none to keep, or parking failed (the engine then goes)."""
        agent = self._agent
        f, host = agent.facts, self._supervisor.host
        p = f.prebuilt
        if p is None or p.built_at is None or f.assignment is None or host is None or host.returncode is not None:
            return False
        ev = await self._command(ParkCommand(swap_id=f"park-{f.assignment.assignment_id}"))
        if ev.get("event") != EV_PARKED:
            log.warning("park_failed", assignment_id=f.assignment.assignment_id, kind=ev.get("kind"),
                        error=ev.get("error"))
            return False
        steps = ev.get("seconds") if isinstance(ev.get("seconds"), dict) else None
        agent.record(prebuilt=replace(p, park_steps_s=steps))
        log.info("engine_parked", assignment_id=f.assignment.assignment_id, model=p.model,
                 engine_class=p.engine_class, steps_s=steps)
        return True

    # -- the engine host's answers ----------------------------------------------------------

    async def _command(self, cmd: SwapCommand | ParkCommand) -> dict[str, Any]:
        """Send a command to the engine host; its answering event (a swap_failed of kind
        "engine" when the host is gone or does not answer within the load timeout)."""
        host = self._supervisor.host
        if host is None or host.returncode is not None:
            return {"event": EV_SWAP_FAILED, "kind": "engine", "error": "no engine host"}
        timeout_s = self._agent.settings.load_timeout_s
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters[cmd.swap_id] = waiter
        try:
            await host.command(cmd)
            return await asyncio.wait_for(waiter, timeout_s)
        except (BrokenPipeError, ConnectionResetError):
            return {"event": EV_SWAP_FAILED, "kind": "engine", "error": "the engine host exited"}
        except TimeoutError:
            return {"event": EV_SWAP_FAILED, "kind": "engine", "error": f"no answer within {timeout_s:.0f} s"}
        finally:
            self._waiters.pop(cmd.swap_id, None)

    def answer(self, event: dict[str, Any]) -> None:
        """A swapped, swap_failed or parked event: the answer to the command of its swap id."""
        waiter = self._waiters.pop(str(event.get("swap_id")), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(event)

    def host_gone(self) -> None:
        """The engine host stopped or exited: the engine it kept goes with it, and a
        swap or park waiting for it gets its answer now."""
        if self._agent.facts.prebuilt is not None:
            self._agent.record(prebuilt=None)
        for swap_id, waiter in list(self._waiters.items()):
            if not waiter.done():
                waiter.set_result({"event": EV_SWAP_FAILED, "swap_id": swap_id, "kind": "engine",
                                   "error": "the engine host exited"})
        self._waiters.clear()
