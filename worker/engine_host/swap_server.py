"""The engine host's side of weight swaps: a gate in front of vLLM's API, and the
``swap`` and ``park`` commands the agent sends on stdin after the launch.

An engine launched ``swappable`` (``worker.launch.LaunchCommand``) keeps reading its
stdin after the launch line; each command runs on the server's event loop, one at a
time, and is answered by an event on stdout.

``swap`` (:class:`~worker.launch.SwapCommand`), the steps in order:

1. the gate closes: every ``/v1`` request is refused (503) until the swap is done, so
   none is tokenized or named by the previous model's front end;
2. the engine pauses, after what is running (the agent drained it);
3. the weights (``worker.engine_host.swap_core`` in the engine core, ``collective_rpc``);
4. the prefix cache is emptied (``reset_prefix_cache`` must say every block went:
   no KV computed with the previous model's weights, or for its tenants, can be hit);
5. the front end is rebuilt for the new model: its ``ModelConfig`` (config and
   tokenizer files, from the agent's local copy, ``worker.front_end_files``, or else
   pulled from the store as vLLM does for an ``s3://`` model), its
   renderer (tokenizer, chat template), input processor (generation defaults, eos)
   and the detokenizer's tokenizer, then vLLM's own ``init_app_state`` again (served
   name, every serving object with the new defaults);
6. the engine resumes and the gate opens.

A failure at any step leaves the engine **dirty**: the gate stays closed for good, the
``swap_failed`` event says which step (a typed kind), and the agent replaces the
engine. ``park`` closes the gate and empties the prefix cache (a release that keeps
the engine for the next swap).

What stays the previous model's: the engine core's own config (the engine class
guarantees it is the same in everything that shapes the engine), the tokenizer the
engine core uses for structured output (the agent swaps only between models whose
tokenizer files are identical), and the ``model_name`` label of vLLM's metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import threading
import time
from typing import Any

from pydantic import ValidationError

from thaw.wire import FailureKind
from worker.launch import (
    EV_PARKED,
    EV_SWAP_FAILED,
    EV_SWAPPED,
    HOST_COMMAND,
    ParkCommand,
    SwapCommand,
    SwapFailure,
    emit_event,
    failure_kind,
    root_cause,
)

# How long a pause may wait for running requests (the agent drained the engine first).
PAUSE_TIMEOUT_S = 60.0


class _StepFailed(Exception):
    def __init__(self, kind: SwapFailure, error: str, cause: BaseException | FailureKind | None = None) -> None:
        super().__init__(error)
        self.kind = kind
        # What kind of failure it was (worker.launch.failure_kind of the exception).
        self.cause: FailureKind = failure_kind(cause) if isinstance(cause, BaseException) else cause or "engine"


class _Gate:
    """ASGI middleware: refuses ``/v1`` requests while the engine is not serving."""

    def __init__(self, app: Any, server: SwapServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self.server.open and scope["path"].startswith("/v1/"):
            from starlette.responses import JSONResponse

            why = ("this engine failed a model swap and is being replaced" if self.server.dirty
                   else "this engine is not serving a model now (between models)")
            body = {"error": {"message": why, "type": "service_unavailable", "param": None, "code": 503}}
            await JSONResponse(body, status_code=503)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class SwapServer:
    """Installed in the engine host before vLLM's server starts (:meth:`install`), fed
    by :meth:`read_commands` after the launch."""

    def __init__(self, *, serving: bool) -> None:
        self.open = serving
        self.dirty = False
        self._app: Any = None
        self._args: argparse.Namespace | None = None
        self._tasks: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._lock: asyncio.Lock | None = None

    # -- in the server ------------------------------------------------------------

    def install(self, entry: Any) -> None:
        """Wrap vLLM's ``build_app`` (looked up in ``entry``'s globals by its
        ``build_and_serve``): keep the app, its arguments and tasks, add the gate."""
        original = entry.build_app

        def build_app(args: argparse.Namespace, supported_tasks: Any, model_config: Any) -> Any:
            app = original(args, supported_tasks, model_config)
            self._app, self._args, self._tasks = app, args, supported_tasks
            self._loop = asyncio.get_running_loop()
            self._lock = asyncio.Lock()
            self._add_gate(app)
            self._ready.set()
            return app

        entry.build_app = build_app

    def _add_gate(self, app: Any) -> None:
        from starlette.middleware import Middleware

        # vLLM's build_app has built the middleware stack already (add_middleware would
        # refuse): put the gate first and let Starlette build the stack again on the
        # first request (nothing has been served yet).
        app.user_middleware.insert(0, Middleware(_Gate, server=self))
        app.middleware_stack = None

    # -- commands -----------------------------------------------------------------

    def read_commands(self) -> None:
        """Read commands from stdin in a daemon thread, each run on the server's loop."""
        threading.Thread(target=self._read_loop, name="thaw-swap-commands", daemon=True).start()

    def _read_loop(self) -> None:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                cmd = HOST_COMMAND.validate_json(line)
            except ValidationError as exc:
                emit_event(EV_SWAP_FAILED, swap_id=None, kind="engine", error=f"unreadable command: {exc}")
                continue
            self._ready.wait()
            assert self._loop is not None
            asyncio.run_coroutine_threadsafe(self._run(cmd), self._loop)

    async def _run(self, cmd: SwapCommand | ParkCommand) -> None:
        assert self._lock is not None
        async with self._lock:
            if self.dirty:
                emit_event(EV_SWAP_FAILED, swap_id=cmd.swap_id, kind="engine",
                           error="the engine is dirty after a failed swap")
                return
            try:
                if isinstance(cmd, SwapCommand):
                    seconds, load = await self._swap(cmd)
                    emit_event(EV_SWAPPED, swap_id=cmd.swap_id, load=load, seconds=seconds)
                else:
                    seconds = await self._park()
                    emit_event(EV_PARKED, swap_id=cmd.swap_id, seconds=seconds)
            except _StepFailed as exc:
                self.dirty, self.open = True, False
                emit_event(EV_SWAP_FAILED, swap_id=cmd.swap_id, kind=exc.kind, error=str(exc), cause=exc.cause)

    async def _park(self) -> dict[str, float]:
        self.open = False
        t0 = time.perf_counter()
        await self._drop_prefix_cache(self._app.state.engine_client)
        s = time.perf_counter() - t0
        return {"prefix_cache_s": round(s, 4), "total_s": round(s, 4)}

    async def _drop_prefix_cache(self, ec: Any) -> None:
        try:
            ok = await ec.reset_prefix_cache()
        except Exception as exc:
            raise _StepFailed("prefix_cache", root_cause(exc), exc) from exc
        if not ok:
            raise _StepFailed("prefix_cache", "the engine still holds blocks in use; its prefix cache was not emptied")

    async def _swap(self, cmd: SwapCommand) -> tuple[dict[str, float], dict[str, Any] | None]:
        self.open = False
        ec = self._app.state.engine_client
        t: dict[str, float] = {}
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(ec.pause_generation(mode="wait", clear_cache=False), PAUSE_TIMEOUT_S)
        except Exception as exc:
            raise _StepFailed("engine", f"pausing the engine: {root_cause(exc)}", exc) from exc
        t["pause_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        try:
            [result] = await ec.collective_rpc("thaw_swap_weights", kwargs={
                "uri": cmd.uri, "loader_options": cmd.loader_options})
        except Exception as exc:
            raise _StepFailed("weights", root_cause(exc), exc) from exc
        if result.get("failed"):
            raise _StepFailed("weights", str(result["failed"]), result.get("kind") or "engine")
        t["weights_s"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        await self._drop_prefix_cache(ec)
        t["prefix_cache_s"] = time.perf_counter() - t2
        t3 = time.perf_counter()
        try:
            await self._rebuild_front_end(ec, cmd)
        except Exception as exc:
            raise _StepFailed("frontend", root_cause(exc), exc) from exc
        t["frontend_s"] = time.perf_counter() - t3
        try:
            await ec.resume_generation()
        except Exception as exc:
            raise _StepFailed("engine", f"resuming the engine: {root_cause(exc)}", exc) from exc
        t["total_s"] = time.perf_counter() - t0
        self.open = True
        load = result.get("load") if isinstance(result, dict) else None
        # Of weights_s: reading the files and checking their tensors, on the loader's
        # read-ahead thread (overlapping the engine's reload), and the time the reload
        # waited for them (weights_s less wait_s is the engine's own).
        for part in ("read_s", "verify_s", "wait_s"):
            if isinstance(load, dict) and isinstance(load.get(part), int | float):
                t[part] = load[part]
        return {k: round(v, 4) for k, v in t.items()}, load

    async def _rebuild_front_end(self, ec: Any, cmd: SwapCommand) -> None:
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.renderers.registry import renderer_from_config
        from vllm.v1.engine.input_processor import InputProcessor

        old = ec.model_config
        # vLLM's config.utils.replace fails on ModelConfig in 0.32 (a private field):
        # build a new one from the init fields. From the agent's local copy of the
        # model's files when it sent one (model_weights set: vLLM pulls nothing);
        # else for an s3:// model its __post_init__ pulls the config and tokenizer
        # files (boto3: blocking), hence the thread.
        kw = {f.name: getattr(old, f.name) for f in dataclasses.fields(old) if f.init}
        if cmd.files_dir:
            kw.update(model=cmd.files_dir, tokenizer=cmd.files_dir, model_weights=cmd.uri)
        else:
            kw.update(model=cmd.uri, tokenizer=cmd.uri, model_weights="")
        kw.update(served_model_name=cmd.served_model_name)
        new = await asyncio.to_thread(type(old), **kw)
        ec.vllm_config.model_config = new
        ec.model_config = new
        previous = ec.renderer
        ec.renderer = renderer_from_config(ec.vllm_config)
        ec.input_processor = InputProcessor(ec.vllm_config, ec.renderer)
        ec.output_processor.tokenizer = ec.renderer.tokenizer
        previous.shutdown()
        assert self._args is not None
        args = argparse.Namespace(**vars(self._args))
        args.model, args.tokenizer, args.served_model_name = cmd.uri, cmd.uri, [cmd.served_model_name]
        await init_app_state(ec, self._app.state, args, self._tasks)
        self._args = args
