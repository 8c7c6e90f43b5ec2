"""A real PostgreSQL for tests: Debian's `postgresql` binaries, a private data directory
initialised for the test (`initdb`), the server on a free loopback port (`pg_ctl`), run
as the `postgres` user when the tests run as root (PostgreSQL refuses root). Without
the binaries the test fails (it does not skip)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

from tests.waiting import wait_until
from thaw.embedded_store import free_port

MISSING = ("PostgreSQL is not installed, and these tests need a real one: install it with "
           "'apt-get install postgresql' (scripts/test installs it when it can)")


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or ([p] if (p := shutil.which(name)) else [])
    if not found:
        pytest.fail(MISSING, pytrace=False)
    return found[-1]


class PostgresServer:
    """One PostgreSQL server; ``url`` names its ``postgres`` database (trust auth on
    loopback only). ``stop`` and ``start`` again keep its data."""

    def __init__(self) -> None:
        self.initdb, self.pg_ctl = _bin("initdb"), _bin("pg_ctl")
        self.port = free_port()
        # Its own directory, which the postgres user owns (a test's tmp_path is root's).
        self.dir = Path(tempfile.mkdtemp(prefix="thaw-pg-"))
        self._as: list[str] = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run(self.initdb, "-D", str(self.dir / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        done = subprocess.run([*self._as, *argv], capture_output=True, text=True, timeout=120, cwd=self.dir)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(argv[:2])} failed ({done.returncode}): {done.stdout[-1500:]}{done.stderr[-1500:]}",
                        pytrace=False)

    def start(self) -> None:
        self._run(self.pg_ctl, "-D", str(self.dir / "data"), "-l", str(self.dir / "server.log"), "-w", "-t", "60",
                  "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        refused: list[str] = [""]

        def accepts() -> bool:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return True
            except psycopg.OperationalError as exc:
                refused[0] = str(exc)
                return False

        wait_until("PostgreSQL to accept a connection", accepts, 30, 0.1, detail=lambda: refused[0])

    def stop(self) -> None:
        self._run(self.pg_ctl, "-D", str(self.dir / "data"), "-m", "fast", "-w", "-t", "60", "stop")

    def database(self, name: str) -> str:
        """A new empty database's URL (one per test: each test sets up its own state)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
