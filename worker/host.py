"""The agent's handle on one engine host process (``python -m worker.engine_host``).

The engine host runs in its own session, so it and everything it starts (vLLM's
forkserver, engine core, resource tracker) form one process group that
:meth:`EngineHostProcess.stop` signals as a whole. It also dies with the agent
(``PR_SET_PDEATHSIG``, set by the engine host itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from thaw.log import get_logger
from thaw.process import spawn_group_async, stop_group_async
from worker.allocator import with_preload
from worker.launch import LaunchCommand, ParkCommand, SwapCommand, decode_event

log = get_logger()

# Lines of engine host output kept for error messages.
TAIL_LINES = 200
# vLLM prints long lines (config dumps); the default 64 KiB limit would break reading.
STREAM_LIMIT_BYTES = 4 * 1024 * 1024

OnEvent = Callable[["EngineHost", dict[str, Any]], None]


class EngineHost(Protocol):
    """What the agent needs from an engine host (a fake one in the API tests)."""

    pid: int
    # A launch command was written: this host cannot take another one.
    launched: bool

    @property
    def returncode(self) -> int | None: ...
    async def launch(self, cmd: LaunchCommand) -> None: ...
    async def command(self, cmd: SwapCommand | ParkCommand) -> None: ...
    async def wait(self) -> int: ...
    async def stop(self, grace_s: float) -> None: ...
    def output_tail(self, lines: int = 20) -> str: ...


class EngineHostProcess:
    """A running ``worker.engine_host`` child: its events, its output, its group."""

    def __init__(self, proc: asyncio.subprocess.Process, on_event: OnEvent) -> None:
        self._proc = proc
        self.pid = proc.pid
        self.launched = False
        self.stopping = False
        self._on_event = on_event
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        assert proc.stdout is not None and proc.stderr is not None
        self._readers = [
            asyncio.create_task(self._read(proc.stdout, events=True)),
            asyncio.create_task(self._read(proc.stderr, events=False)),
        ]

    @classmethod
    async def spawn(
        cls, on_event: OnEvent, *, log_level: str = "info", python: str = sys.executable,
        cwd: Path | None = None, preload: Sequence[str] = (),
    ) -> EngineHostProcess:
        env = {
            **with_preload(os.environ, preload),
            # stdout carries events; vLLM's log lines go to stderr.
            "VLLM_LOGGING_STREAM": "ext://sys.stderr",
            "VLLM_LOGGING_LEVEL": "DEBUG" if log_level == "debug" else "INFO",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
            "THAW_AGENT_PID": str(os.getpid()),
        }
        # Not tied by the kernel: the host watches THAW_AGENT_PID itself.
        proc = await spawn_group_async([python, "-m", "worker.engine_host"], None, env=env, cwd=cwd, tied=False,
                                       limit=STREAM_LIMIT_BYTES)
        log.info("engine_host_started", pid=proc.pid)
        return cls(proc, on_event)

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def _read(self, stream: asyncio.StreamReader, *, events: bool) -> None:
        try:
            await self._read_lines(stream, events=events)
        except Exception:
            # A reader that dies unnoticed would leave the agent deaf to this host.
            log.exception("engine_host_reader_failed", host_pid=self.pid)
            raise

    async def _read_lines(self, stream: asyncio.StreamReader, *, events: bool) -> None:
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line over the limit: take what is there
                raw = await stream.read(STREAM_LIMIT_BYTES)
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            event = decode_event(line) if events else None
            if event is not None:
                log.info("engine_host_event", host_pid=self.pid, **{
                    ("host_event" if k == "event" else k): v for k, v in event.items()})
                try:
                    self._on_event(self, event)
                except Exception:
                    log.exception("engine_host_event_handler_failed", host_pid=self.pid)
                continue
            # vLLM's progress bars redraw with \r: keep the last frame.
            line = line.rsplit("\r", 1)[-1]
            if line.strip():
                self._tail.append(line)
                log.debug("engine_output", host_pid=self.pid, line=line)

    def output_tail(self, lines: int = 20) -> str:
        return "\n".join(list(self._tail)[-lines:])

    async def launch(self, cmd: LaunchCommand) -> None:
        assert self._proc.stdin is not None
        self.launched = True
        self._proc.stdin.write(cmd.model_dump_json().encode() + b"\n")
        await self._proc.stdin.drain()

    async def command(self, cmd: SwapCommand | ParkCommand) -> None:
        """A later command to a swappable engine (answered by an event)."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(cmd.model_dump_json().encode() + b"\n")
        await self._proc.stdin.drain()

    async def wait(self) -> int:
        code = await self._proc.wait()
        # Output written before exit is still in the pipes; read it before anyone
        # looks at output_tail (bounded: a grandchild could hold the pipe open).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*self._readers, return_exceptions=True), 2.0)
        return code

    async def stop(self, grace_s: float) -> None:
        """SIGTERM the whole group, wait up to ``grace_s`` for it to empty, then SIGKILL
        what is left; ``grace_s`` 0 kills at once (an engine that failed or is being
        aborted has nothing to finish, and vLLM can hang when SIGTERM arrives while
        it is already shutting down after a failed start)."""
        self.stopping = True
        if await stop_group_async(self._proc, grace_s, until_empty=True) and grace_s > 0:
            log.warning("engine_host_kill", host_pid=self.pid, after_s=grace_s)
        await self.wait()
        for task in self._readers:
            task.cancel()
        log.info("engine_host_stopped", host_pid=self.pid, returncode=self._proc.returncode)
