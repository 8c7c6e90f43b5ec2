"""Providers carry out Launch/Terminate: they own the machines, nothing else.

``local`` runs worker agents as child processes on this machine (the embedded
default). Each child gets PR_SET_PDEATHSIG so it dies with the manager even if the
manager is SIGKILLed, and its own process group so its engine goes with it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from thaw.embedded_store import free_port
from thaw.log import get_logger
from worker.pdeathsig import die_with_parent

log = get_logger()


@dataclass(frozen=True)
class WorkerHandle:
    id: str
    shape: str
    control_url: str


class Provider(Protocol):
    async def launch(self, shape: str) -> WorkerHandle: ...
    async def terminate(self, worker_id: str) -> None: ...
    def workers(self) -> list[WorkerHandle]: ...
    def exited(self, worker_id: str) -> int | None:
        """The exit status of a worker process that has died, else None."""
        ...
    async def close(self) -> None: ...


def _tie_to(parent: int) -> Callable[[], None]:
    """For ``preexec_fn`` (runs in the child between fork and exec): die with ``parent``,
    in a process group of its own."""
    def tie() -> None:
        die_with_parent(signal.SIGTERM, expected_parent=parent)
        os.setsid()
    return tie


class LocalProvider:
    """Worker agents as child processes (``python -m worker``) on loopback ports."""

    def __init__(self, data_dir: Path, log_level: str = "info", stop_timeout_s: float = 30.0) -> None:
        self.data_dir = Path(data_dir)
        self.log_level = log_level
        self.stop_timeout_s = stop_timeout_s
        self._procs: dict[str, tuple[WorkerHandle, asyncio.subprocess.Process]] = {}
        self._seq = 0

    async def launch(self, shape: str) -> WorkerHandle:
        self._seq += 1
        worker_id = f"w{os.getpid()}-{self._seq}"
        port = free_port()
        wdir = self.data_dir / "workers" / worker_id
        wdir.mkdir(parents=True, exist_ok=True)
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        # A local file open is fast; the child inherits the descriptor.
        logf = open(logs / f"worker-{worker_id}.log", "ab")  # noqa: SIM115, ASYNC230
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "worker", "--port", str(port), "--worker-id", worker_id,
                "--shape", shape, "--data-dir", str(wdir), "--log-level", self.log_level,
                stdin=asyncio.subprocess.DEVNULL, stdout=logf, stderr=logf,
                preexec_fn=_tie_to(os.getpid()),
            )
        finally:
            logf.close()
        handle = WorkerHandle(worker_id, shape, f"http://127.0.0.1:{port}")
        self._procs[worker_id] = (handle, proc)
        log.info("worker_launched", worker_id=worker_id, shape=shape, pid=proc.pid, url=handle.control_url)
        return handle

    async def terminate(self, worker_id: str) -> None:
        entry = self._procs.pop(worker_id, None)
        if entry is None:
            return
        handle, proc = entry
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                await asyncio.wait_for(proc.wait(), self.stop_timeout_s)
            except TimeoutError:
                log.warning("worker_kill", worker_id=worker_id, after_s=self.stop_timeout_s)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                await proc.wait()
        # The agent stops its engine; anything left in its group goes now.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        log.info("worker_terminated", worker_id=worker_id, returncode=proc.returncode)

    def workers(self) -> list[WorkerHandle]:
        return [h for h, _ in self._procs.values()]

    def exited(self, worker_id: str) -> int | None:
        entry = self._procs.get(worker_id)
        return entry[1].returncode if entry else None

    async def close(self) -> None:
        await asyncio.gather(*(self.terminate(w) for w in list(self._procs)))
