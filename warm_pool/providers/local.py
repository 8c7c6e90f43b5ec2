"""The ``local`` provider: `thaw worker` processes on this machine (the embedded default).

Each worker runs in a session of its own, not tied to the controller's life: a
controller restart must find them serving. The provider keeps one record per worker
in ``<data_dir>/local-workers/`` (pid, its start time, port, shape), which is its
``instances()`` after a restart; the start time tells a live worker from a recycled
pid. Workers are started with ``--exit-when-orphaned-s``, so a controller that is gone
for good leaves no process behind for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import psutil

from thaw.embedded_store import free_port
from thaw.log import get_logger
from thaw.process import spawn_group_async, stop_group_async
from warm_pool.providers.provider import Instance, InstanceState

log = get_logger()

RECORDS = "local-workers"


class ProviderError(RuntimeError):
    pass


class LocalProvider:
    kind = "local"

    def __init__(
        self,
        config_path: Path,
        data_dir: Path,
        *,
        controller_url: str,
        worker_env: dict[str, str] | None = None,
        log_level: str = "info",
        stop_timeout_s: float = 30.0,
        orphan_after_s: float | None = 120.0,
        python: str = sys.executable,
    ) -> None:
        """``worker_env``: added to each worker's environment (the store's credentials)."""
        self.config_path = Path(config_path).resolve()
        self.data_dir = Path(data_dir)
        self.controller_url = controller_url
        self._worker_env = dict(worker_env or {})
        self.log_level = log_level
        self.stop_timeout_s = stop_timeout_s
        self.orphan_after_s = orphan_after_s
        self.python = python
        self.records = self.data_dir / RECORDS
        # Workers this process started: their exit status (asyncio reaps them).
        self._children: dict[str, asyncio.subprocess.Process] = {}

    def __repr__(self) -> str:
        return f"LocalProvider(data_dir={str(self.data_dir)!r})"

    # -- records ----------------------------------------------------------------------
    def _record_path(self, worker_id: str) -> Path:
        return self.records / f"{worker_id}.json"

    def _read_records(self) -> list[dict[str, object]]:
        out = []
        for p in sorted(self.records.glob("*.json")) if self.records.exists() else []:
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(p.read_text()))
        return out

    def _instance(self, rec: dict[str, object]) -> Instance:
        wid = str(rec["worker_id"])
        pid = int(rec["pid"])  # type: ignore[call-overload]
        child = self._children.get(wid)
        code: int | None = None
        if child is not None and child.returncode is not None:
            state, code = InstanceState.EXITED, child.returncode
        elif _alive(pid, float(rec["create_time"])):  # type: ignore[arg-type]
            state = InstanceState.RUNNING
        else:
            state = InstanceState.EXITED
        return Instance(
            instance_id=str(rec["instance_id"]), worker_id=wid, shape=str(rec["shape"]),
            launched_at=float(rec["launched_at"]), state=state,  # type: ignore[arg-type]
            control_url=f"http://127.0.0.1:{rec['port']}", exit_code=code,
            detail=(("pid", str(pid)), ("port", str(rec["port"]))),
            term=int(rec["term"]) if rec.get("term") is not None else None,  # type: ignore[call-overload]
        )

    # -- the Provider protocol ----------------------------------------------------------
    async def launch(self, shape: str, worker_id: str, *, term: int | None = None) -> Instance:
        existing = self._record_path(worker_id)
        if existing.exists():
            return self._instance(json.loads(existing.read_text()))
        port = free_port()
        instance_id = f"local-{worker_id}"
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.records.mkdir(parents=True, exist_ok=True)
        cmd = [self.python, "-m", "worker", "--config", str(self.config_path), "--controller", self.controller_url,
               "--shape", shape, "--instance-id", instance_id, "--worker-id", worker_id, "--port", str(port),
               "--data-dir", str(self.data_dir / "workers" / worker_id), "--log-level", self.log_level]
        if self.orphan_after_s is not None:
            cmd += ["--exit-when-orphaned-s", str(self.orphan_after_s)]
        # Not tied to the controller: a restarted controller adopts its workers (an
        # orphaned one exits by itself after --exit-when-orphaned-s).
        proc = await spawn_group_async(cmd, logs / f"worker-{worker_id}.log", env={**os.environ, **self._worker_env},
                                       tied=False)
        self._children[worker_id] = proc
        rec = {"worker_id": worker_id, "instance_id": instance_id, "shape": shape, "pid": proc.pid, "port": port,
               "launched_at": time.time(), "create_time": psutil.Process(proc.pid).create_time(), "term": term}
        tmp = self._record_path(worker_id).with_suffix(".tmp")
        tmp.write_text(json.dumps(rec))
        tmp.replace(self._record_path(worker_id))
        log.info("worker_launched", worker_id=worker_id, shape=shape, pid=proc.pid, port=port)
        return self._instance(rec)

    async def instances(self) -> list[Instance]:
        return [self._instance(r) for r in await asyncio.to_thread(self._read_records)]

    async def terminate(self, instance_id: str) -> None:
        rec = next((r for r in self._read_records() if r["instance_id"] == instance_id), None)
        if rec is None:
            return
        wid, pid = str(rec["worker_id"]), int(rec["pid"])  # type: ignore[call-overload]
        if _alive(pid, float(rec["create_time"])):  # type: ignore[arg-type]
            # The worker drains and stops its engine on SIGTERM; its group goes after.
            if await stop_group_async(self._children.get(wid) or pid, self.stop_timeout_s):
                log.warning("worker_kill", worker_id=wid, after_s=self.stop_timeout_s)
        self._record_path(wid).unlink(missing_ok=True)
        self._children.pop(wid, None)
        log.info("worker_terminated", worker_id=wid, pid=pid)

    async def stop(self, instance_id: str) -> None:
        raise ProviderError("the local provider cannot stop an instance (only ec2 can)")

    async def start(self, instance_id: str) -> None:
        raise ProviderError("the local provider cannot start a stopped instance (only ec2 can)")

    async def terminate_all(self) -> None:
        """Stop every local worker (`thaw up` stopping, or `--stop-local-workers`)."""
        await asyncio.gather(*(self.terminate(str(r["instance_id"])) for r in self._read_records()))

    async def close(self) -> None:
        """Workers keep running: the next controller adopts them."""


def _alive(pid: int, create_time: float) -> bool:
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - create_time) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
