"""A worker agent as a real process (`python -m worker`) for the engine tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from tests.conftest import BUCKET
from tests.waiting import wait_until
from thaw.embedded_store import free_port
from thaw.objstore import S3Endpoint
from thaw.process import spawn_group

STANDBY_TIMEOUT_S = 120.0
TOKEN = "agent-test-cluster-token"


@dataclass
class Agent:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    started_at: float
    # Every process the agent started, as (pid, create_time), seen while it ran.
    descendants: set[tuple[int, float]] = field(default_factory=set)
    times: dict[str, float] = field(default_factory=dict)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10.0, trust_env=False,
                            headers={"Authorization": f"Bearer {TOKEN}"})

    def state(self) -> dict[str, Any]:
        with self.http() as c:
            return c.get("/state").json()  # type: ignore[no-any-return]

    def record_descendants(self) -> None:
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                self.descendants.add((p.pid, p.create_time()))
            except psutil.NoSuchProcess:
                pass

    def wait_state(self, *states: str, timeout_s: float) -> tuple[dict[str, Any], list[str]]:
        """Poll /state until one of ``states``; returns the body and the states seen."""
        seen: list[str] = []
        last: list[dict[str, Any]] = [{}]
        with self.http() as c:
            def reached() -> dict[str, Any] | None:
                assert self.proc.poll() is None, f"agent exited ({self.proc.returncode}):\n{self.log_tail()}"
                try:
                    body = c.get("/state").json()
                except httpx.TransportError:
                    body = {"state": "(not answering)"}
                if not seen or seen[-1] != body["state"]:
                    seen.append(body["state"])
                last[0] = body
                return body if body["state"] in states else None

            body = wait_until(f"the agent in {states}", reached, timeout_s, 0.1,
                              detail=lambda: f"saw {seen}: {last[0]}\n{self.log_tail()}")
            return body, seen

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def alive(pid: int, created: float) -> bool:
    try:
        p = psutil.Process(pid)
        return p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextmanager
def running_agent(root: Path, worker_id: str, s3: S3Endpoint, *, host_cache_gib: float = 0.0) -> Iterator[Agent]:
    """An agent process on a free port, with the store's keys in its environment (as the
    local provider starts it) and no controller listening; on the way out, it and
    everything it started go. ``host_cache_gib``: its host-memory tier, in
    ``root/host-cache``."""
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    log_path = root / f"agent-{worker_id}.log"
    config = root / f"thaw-{worker_id}.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(root), "cluster": {"token": TOKEN, "heartbeat_interval_s": 5},
        "controller": {"url": f"http://127.0.0.1:{free_port()}"},
        "object_store": {"kind": "s3", "endpoint_url": s3.endpoint_url, "bucket": BUCKET,
                         "credentials": {"source": "env"}},
        "shapes": [{"name": "cpu-small", "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8,
                    "price_per_hour_usd": 0, "host_cache_gib": host_cache_gib}],
    }))
    env = {**os.environ, "AWS_ACCESS_KEY_ID": s3.access_key or "", "AWS_SECRET_ACCESS_KEY": s3.secret_key or ""}
    proc = spawn_group([sys.executable, "-m", "worker", "--config", str(config), "--port", str(port),
                        "--worker-id", worker_id, "--shape", "cpu-small", "--data-dir", str(root / "data"),
                        "--host-cache-dir", str(root / "host-cache"), "--log-level", "debug"], log_path, env=env)
    a = Agent(proc, f"http://127.0.0.1:{port}", log_path, time.monotonic())
    try:
        yield a
    finally:
        if proc.poll() is None:
            a.record_descendants()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid, created in a.descendants:
            if alive(pid, created):
                os.kill(pid, signal.SIGKILL)


