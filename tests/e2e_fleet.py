"""Thaw as separate processes on one machine for end-to-end tests: `thaw controller`,
`thaw activator`s and the local pool's `thaw worker`s, each started and stopped here."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil

from tests.redis_server import RedisServer
from tests.waiting import wait_until
from thaw.controllers import Controllers
from thaw.process import signal_group, spawn_group

KEY = "thaw-demo-key"


@dataclass
class Fleet:
    tmp: Path
    config: Path
    controller_url: str
    activators: dict[str, str]  # name -> base URL (…/v1)
    redis: RedisServer | None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        return self.tmp / "data"

    def token(self) -> str:
        return (self.data_dir / "cluster-token").read_text().strip()

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token()}"}

    def start(self, name: str, *argv: str) -> None:
        self.procs[name] = spawn_group([sys.executable, "-m", "thaw.cli.main", *argv, "--config", str(self.config)],
                                       self.tmp / f"{name}.log", cwd=self.tmp)

    def start_controller(self) -> None:
        port = self.controller_url.rsplit(":", 1)[1]
        self.start("controller", "controller", "--port", port)

    def state(self) -> dict[str, Any]:
        # ``controller_url`` may name several controllers (URL,URL): this finds the leader.
        r = Controllers(self.controller_url).request_sync("GET", "/v1/state", headers=self.auth(), timeout=5)
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]

    def wait(self, what: str, pred: Any, timeout_s: float = 180) -> dict[str, Any]:
        last: list[Any] = [None]

        def holds() -> dict[str, Any] | None:
            for name, p in self.procs.items():
                assert p.poll() is None, f"{name} exited ({p.returncode}):\n{self.log_tail(name)}"
            try:
                last[0] = self.state()
                return last[0] if pred(last[0]) else None
            except (httpx.HTTPError, OSError) as exc:  # not up yet (no token file yet)
                last[0] = repr(exc)
                return None

        got: dict[str, Any] = wait_until(what, holds, timeout_s, 0.3,
                                         detail=lambda: f"last: {json.dumps(last[0], indent=1)[:4000]}")
        return got

    def log_tail(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def client(self, name: str, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.activators[name], api_key=key, max_retries=0, timeout=120)

    def start_activator(self, name: str) -> None:
        port = self.activators[name].rsplit(":", 1)[1].removesuffix("/v1")
        self.start(f"activator-{name}", "activator", "--controller", self.controller_url, "--port", port,
                   "--id", name)

    def wait_healthy(self, base: str, timeout_s: float = 60) -> None:
        def connected() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return bool(httpx.get(base.removesuffix("/v1") + "/healthz", timeout=2).json()["pool_connected"])
            return False

        wait_until(f"{base} to come up", connected, timeout_s, 0.2)

    def thaw(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "thaw.cli.main", *args, "--config", str(self.config)],
                              capture_output=True, text=True, timeout=60, cwd=self.tmp)


def kill_local_workers(data_dir: Path) -> None:
    """The workers outlive a controller on purpose; the test removes them at the end."""
    for rec in (data_dir / "local-workers").glob("*.json"):
        info = json.loads(rec.read_text())
        signal_group(int(info["pid"]), signal.SIGTERM)
    pids = [int(json.loads(rec.read_text())["pid"]) for rec in (data_dir / "local-workers").glob("*.json")]

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    with contextlib.suppress(AssertionError):  # what is left after the grace is killed
        wait_until("the local workers gone on SIGTERM", lambda: all(gone(pid) for pid in pids), 40, 0.2)
    for pid in pids:
        signal_group(pid, signal.SIGKILL)


def chat(client: openai.OpenAI, model: str, max_tokens: int = 8) -> str:
    stream = client.chat.completions.create(model=model, stream=True, max_tokens=max_tokens,
                                            messages=[{"role": "user", "content": "hello"}])
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


# One request per activator at most every this many seconds: a load that is the same on a
# fast machine and a slow one (unpaced, a fast one sent 20 a second and met the tenant's limit).
LOAD_PACE_S = 0.25


class Load:
    """Streamed chat completions, one after another through each activator, paced (LOAD_PACE_S)."""

    def __init__(self, fleet: Fleet, model: str) -> None:
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(fleet.client(n), model), daemon=True)
                         for n in fleet.activators]

    def _run(self, client: openai.OpenAI, model: str) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                chat(client, model)
                self.ok += 1
            except Exception as exc:  # every failure is the test's business
                self.failures.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(max(0.0, began + LOAD_PACE_S - time.monotonic()))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(180)
