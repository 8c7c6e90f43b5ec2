"""A real ``redis-server`` for tests: on a free loopback port, without persistence, in a
directory of the test's. Without one on PATH the test fails (it does not skip)."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from tests.waiting import wait_until
from thaw.embedded_store import free_port

MISSING = ("redis-server is not installed, and these tests need a real one: install it with "
           "'apt-get install redis-server' (scripts/test installs it when it can)")


class RedisServer:
    """One ``redis-server`` on loopback, without persistence; stop and start it again
    on the same port to play an outage."""

    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail(MISSING, pytrace=False)
        self.exe = exe
        self.dir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = (self.dir / "redis.log").open("ab")
        self.proc = proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir)],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.dir,
        )
        log.close()
        client = redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)

        def answers() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"redis-server exited ({proc.returncode}): {self.log_tail()}", pytrace=False)
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        try:
            wait_until("redis-server to answer PING", answers, 10, 0.02)
        except AssertionError:
            self.stop()
            pytest.fail(f"redis-server did not answer PING within 10 s: {self.log_tail()}", pytrace=False)
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def log_tail(self) -> str:
        p = self.dir / "redis.log"
        return p.read_text(errors="replace")[-500:] if p.exists() else ""
