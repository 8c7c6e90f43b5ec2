"""The engine host: pays vLLM's imports ahead of time, then serves one model.

``python -m worker.engine_host`` is started by the agent (``worker.host``), in its
own process group. It

1. imports vLLM's engine core (``worker.engine_host.engine_core_entry``), forks a forkserver
   from itself that the engine core will be forked from, and meanwhile imports
   vLLM's OpenAI server;
2. writes ``{"event": "imported"}`` to stdout and waits for one
   :class:`~worker.launch.LaunchCommand` JSON line on stdin;
3. sets the launch's environment and runs vLLM's OpenAI-compatible server
   in-process until it is told to stop (SIGTERM);
4. for a ``swappable`` launch, keeps reading stdin: ``swap`` and ``park`` commands
   (``worker.engine_host.swap_server``) replace the model in the running engine or park it.

Events go to stdout (``worker.launch``); vLLM's logs go to stderr (the agent sets
``VLLM_LOGGING_STREAM``). Exit status 0 after a clean stop or an empty stdin, 1
after a failure (also reported as a ``failed`` event with the root cause).

Heavy imports stay inside functions: a forked engine core imports this module
again (as ``__mp_main__``) and must not pay for them.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import gc
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from multiprocessing.context import BaseContext
from typing import Any

from thaw.process import die_with_parent
from worker.launch import (
    EV_FAILED,
    EV_IMPORTED,
    EV_LAUNCHED,
    FORKSERVER_PRELOAD,
    LaunchCommand,
    emit_event,
    failure_kind,
    forkserver_probe,
    root_cause,
    vllm_argv,
)


def _start_forkserver() -> BaseContext:
    """Import vLLM's engine core (``worker.engine_host.engine_core_entry``), then start the
    forkserver as a fork of this process, which meanwhile goes on to import the API
    server.

    The forkserver used to be a fresh interpreter importing the engine core's modules
    again: about 9 s of CPU per engine host on top of this process's own, paid by
    every standby, spare and respawn. Forked, it shares those imports (and their
    pages). This process is still single-threaded and has run no kernels here, as a
    fresh forkserver would be; the child does the preload's one-off work
    (``engine_core_entry.prepare_forkserver``) and then runs multiprocessing's
    forkserver loop as a spawned one would.
    """
    # The heavy part (vLLM's engine core, torch, model code), and the patched engine
    # core target must be importable here under its own name for pickling.
    import worker.engine_host.engine_core_entry  # noqa: F401

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([FORKSERVER_PRELOAD])  # type: ignore[attr-defined]
    # Ensured before the swap below: the tracker must stay a spawned process.
    multiprocessing.resource_tracker.ensure_running()
    sys.stdout.flush()
    sys.stderr.flush()
    spawnv_passfds = multiprocessing.util.spawnv_passfds
    multiprocessing.util.spawnv_passfds = _fork_passfds
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        multiprocessing.util.spawnv_passfds = spawnv_passfds
    return ctx


def _fork_passfds(path: Any, args: Sequence[Any], passfds: Sequence[int]) -> int:
    """Stand-in for ``multiprocessing.util.spawnv_passfds`` while the forkserver starts:
    fork instead of exec, and run the same program (``args[-1]``, the forkserver's
    ``main(...)`` call) with only ``passfds`` open beside stdin, stdout and stderr, as
    in the spawned interpreter. Returns the child's pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        lo = 3
        for fd in sorted(passfds):
            os.closerange(lo, fd)
            lo = fd + 1
        os.closerange(lo, os.sysconf("SC_OPEN_MAX"))
        # The parent's multiprocessing state, as a spawned interpreter would have it:
        # the forkserver's lock was held at the fork, the tracker's pipe is closed.
        multiprocessing.forkserver._forkserver._lock = threading.Lock()  # type: ignore[attr-defined]
        tracker: Any = multiprocessing.resource_tracker._resource_tracker  # type: ignore[attr-defined]
        tracker._lock, tracker._fd, tracker._pid = threading.RLock(), None, None
        with contextlib.suppress(ImportError):  # a vLLM dependency; the name is for ps only
            import setproctitle

            setproctitle.setproctitle(f"thaw-forkserver (engine host {os.getppid()})")
        from worker.engine_host.engine_core_entry import prepare_forkserver

        try:
            prepare_forkserver()
        except Exception:  # an optimisation only: the forkserver must still serve
            traceback.print_exc()
        exec(args[-1], {"__name__": "__thaw_forkserver__"})  # noqa: S102 - multiprocessing's own program
        code = 0
    except SystemExit as exc:  # the forkserver's loop ends so when its last client is gone
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:  # noqa: BLE001 - report, then leave without running the parent's code
        traceback.print_exc()
    finally:
        os._exit(code)


def _forkserver_ready(ctx: BaseContext) -> bool:
    """Wait for the forkserver's preload and tell whether it worked.

    The forkserver accepts its first request only after its preload, so this also
    waits for it to finish importing.
    """
    p = ctx.Process(target=forkserver_probe, name="thaw-forkserver-probe")  # type: ignore[attr-defined]
    p.start()
    p.join()
    return p.exitcode == 0


def _import_server() -> Any:
    """Import vLLM's OpenAI server; returns the module with ``run_server``."""
    import uvloop  # noqa: F401
    import vllm.entrypoints.launchers.api_server.entry as entry
    import vllm.entrypoints.launchers.cli_args  # noqa: F401
    import vllm.utils.argparse_utils  # noqa: F401

    from weight_streaming import vllm_loader

    # --load-format thaw: the config built in this process must accept it.
    vllm_loader.register()
    # vLLM pulls an s3:// model's config and tokenizer files here, with boto3.
    vllm_loader.prewarm()
    return entry


def _parse_server_args(argv: list[str]) -> Any:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(description="Thaw engine host"))

    def error(message: str) -> Any:
        # argparse would print usage and exit(2): report the reason instead.
        raise ValueError(f"invalid engine arguments: {message}")

    parser.error = error  # type: ignore[method-assign]
    args = parser.parse_args(argv)
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)
    return args


def _route_engine_core(ctx: BaseContext | None, env: dict[str, str]) -> None:
    """Make vLLM start its engine core through Thaw's entry point (environment,
    events) and, when the forkserver preloaded it, from the forkserver; vLLM's
    model-class inspection then runs in a forkserver child too."""
    import vllm.model_executor.models.registry as registry
    import vllm.v1.engine.utils as engine_utils
    from vllm.v1.engine.core import EngineCoreProc

    from worker.engine_host import engine_core_entry

    EngineCoreProc.run_engine_core = staticmethod(  # type: ignore[method-assign]
        functools.partial(engine_core_entry.run_engine_core, thaw_env=env)
    )
    if ctx is None:
        return
    # Only the engine core launcher's context: vLLM's executors keep theirs.
    engine_utils.get_mp_context = lambda: ctx  # type: ignore[attr-defined]
    registry._run_in_subprocess = functools.partial(_run_in_forkserver_child, ctx)  # type: ignore[attr-defined]


def _run_in_forkserver_child(ctx: BaseContext, fn: Any) -> Any:
    """Drop-in for vLLM's ``registry._run_in_subprocess``: same isolation (the model
    class is imported in a child, so this process initialises no device), without a
    fresh interpreter paying vLLM's imports."""
    import pickle
    import tempfile

    import cloudpickle

    from worker.engine_host import engine_core_entry

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pkl")
        p = ctx.Process(  # type: ignore[attr-defined]
            target=engine_core_entry.run_pickled, args=(cloudpickle.dumps(fn), out),
            name="thaw-model-inspect",
        )
        p.start()
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"model class inspection failed in a forkserver child (exit status {p.exitcode})")
        with open(out, "rb") as f:
            return pickle.load(f)


def main() -> int:
    agent_pid = os.environ.get("THAW_AGENT_PID")
    die_with_parent(signal.SIGTERM, expected_parent=int(agent_pid) if agent_pid else None)
    # `kill -USR1 <pid>` prints every thread's stack to stderr (the agent's log at debug).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    t0 = time.monotonic()
    ctx = _start_forkserver()
    entry = _import_server()
    preloaded = _forkserver_ready(ctx)
    # Keep vLLM's collections during the launch (and its lifespan's) off the
    # imported heap: each full collection would walk it (~0.3 s here).
    gc.collect()
    gc.freeze()
    emit_event(EV_IMPORTED, import_s=round(time.monotonic() - t0, 3), preloaded=preloaded)

    line = sys.stdin.readline()
    if not line.strip():
        return 0  # the agent closed stdin: stand down
    try:
        cmd = LaunchCommand.model_validate_json(line)
        os.environ.update(cmd.env)
        args = _parse_server_args(vllm_argv(cmd))
        _route_engine_core(ctx if preloaded else None, cmd.env)
        if cmd.swappable:
            from worker.engine_host.swap_server import SwapServer

            swaps = SwapServer(serving=cmd.serving)
            swaps.install(entry)
            swaps.read_commands()
        emit_event(EV_LAUNCHED, port=cmd.port)
        import uvloop

        uvloop.run(entry.run_server(args))
    except KeyboardInterrupt:
        # vLLM turns a SIGTERM during start-up into KeyboardInterrupt: we were stopped.
        return 1
    except BaseException as exc:  # noqa: BLE001 - report anything before dying
        if isinstance(exc, SystemExit) and exc.code in (None, 0):
            return 0
        traceback.print_exc()
        emit_event(EV_FAILED, error=root_cause(exc), where="engine_host", kind=failure_kind(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
