"""A private PostgreSQL, for tests and benchmarks: Debian's `postgresql` binaries, a data
directory initialised for the run (`initdb`), the server on a free loopback port
(`pg_ctl`), run as the `postgres` user when we run as root (PostgreSQL refuses root).
A missing binary or a failed command raises :class:`PostgresUnavailable` with the reason."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from thaw.embedded_store import free_port

MISSING = ("PostgreSQL is not installed, and this needs a real one: install it with "
           "'apt-get install postgresql' (scripts/test installs it when it can)")


class PostgresUnavailable(RuntimeError):
    """PostgreSQL could not be found, initialised, started or stopped (the message says which)."""


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or ([p] if (p := shutil.which(name)) else [])
    if not found:
        raise PostgresUnavailable(MISSING)
    return found[-1]


class PostgresServer:
    """One PostgreSQL server; ``url`` names its ``postgres`` database (trust auth on
    loopback only). ``stop`` and ``start`` again keep its data."""

    def __init__(self, *, host: str = "127.0.0.1", netns: str | None = None, port: int | None = None) -> None:
        """``host``: the address it listens on; ``netns``: the network namespace it runs in
        (a fault harness's host, which admits its subnet's /24 too)."""
        self.initdb, self.pg_ctl = _bin("initdb"), _bin("pg_ctl")
        self.host, self.netns = host, netns
        self.port = port or free_port()
        # Its own directory, which the postgres user owns (a test's tmp_path is root's).
        self.dir = Path(tempfile.mkdtemp(prefix="thaw-pg-"))
        self._as: list[str] = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run(self.initdb, "-D", str(self.dir / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync")
        if host != "127.0.0.1":
            subnet = host.rsplit(".", 1)[0] + ".0/24"
            with (self.dir / "data" / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {subnet} trust\n")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        where = ["ip", "netns", "exec", self.netns] if self.netns else []
        done = subprocess.run([*where, *self._as, *argv], capture_output=True, text=True, timeout=120, cwd=self.dir)
        if done.returncode != 0:
            raise PostgresUnavailable(f"{' '.join(argv[:2])} failed ({done.returncode}): "
                                      f"{done.stdout[-1500:]}{done.stderr[-1500:]}")

    def start(self) -> None:
        self._run(self.pg_ctl, "-D", str(self.dir / "data"), "-l", str(self.dir / "server.log"), "-w", "-t", "60",
                  "-o", f"-p {self.port} -k {self.dir} -c listen_addresses={self.host} -c fsync=off", "start")
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise PostgresUnavailable(f"PostgreSQL did not accept a connection in 30 s: {exc}") from None
            time.sleep(0.1)

    def stop(self) -> None:
        self._run(self.pg_ctl, "-D", str(self.dir / "data"), "-m", "fast", "-w", "-t", "60", "stop")

    def database(self, name: str) -> str:
        """A new empty database's URL (one per test or run: each sets up its own state)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
