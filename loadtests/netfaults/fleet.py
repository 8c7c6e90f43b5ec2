"""Thaw as a fleet across hosts: every service in its own network namespace with its own
address on one bridge (``loadtests.netfaults.net``), started and torn down here.

Hosts: ``pg`` (PostgreSQL), ``redis``, ``store`` (SeaweedFS), ``c1`` and ``c2`` (two
controllers on that PostgreSQL: one leads), ``a1`` and ``a2`` (activators, limits in
Redis), ``w1``... (workers of a static pool, real vLLM on the CPU, registering
themselves), and ``client``: the one the caller's thread enters (:meth:`NetFleet.inside`)
to reach the others, as the load client and the checks do. Each service has its own
config file and data directory, as on its own machine; they share only the cluster
token, the store's credentials file and one clock.

The store's link can be rate-limited (``FleetOptions.store_rate``, ``tc tbf``), and its
traffic from the workers goes through a delay proxy on the store host
(``loadtests.netfaults.delay``), so a run can add delay spikes to it
(:meth:`NetFleet.store_delay`). The controllers reach PostgreSQL through another, with
``FleetOptions.zone_delay_s`` each way (1 ms: the database in another zone). The other
links have no added delay (a proxy per link would be a process per pair of hosts).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml

from loadtests.netfaults import aws_host
from loadtests.netfaults.net import Net
from loadtests.netfaults.store_host import S3_PORT
from loadtests.postgres import PostgresServer
from thaw.objstore import S3Endpoint
from weight_streaming.push import push_model

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "thaw"
MODEL = "thaw-demo"  # the served name of the demo model
# A second model of the same weights, at zero until a run sends to it (a cold start
# through a faulty store link).
COLD_MODEL = "thaw-demo-2"
KEY = "thaw-demo-key"
CONTROLLER_PORT, ACTIVATOR_PORT, WORKER_PORT, REDIS_PORT, PG_PORT = 8100, 8000, 8200, 6379, 5432
# Where the workers reach the store: the delay proxy in front of its S3 port.
STORE_PROXY_PORT = 8334
# Where the controllers reach PostgreSQL: a delay proxy (the link between zones).
PG_PROXY_PORT = 5433


@dataclass(frozen=True)
class FleetOptions:
    workers: int = 2
    lease_s: float = 3.0  # the controllers' lease (takeover within two heartbeats of it)
    heartbeat_s: float = 2.0  # the default; the lease is 1.5 of it (takeover within two)
    worker_timeout_s: float = 10.0
    store_rate: str | None = None  # e.g. "400mbit": the store host's link
    # Each way on the controllers' link to PostgreSQL (another zone; None: no proxy).
    zone_delay_s: float | None = 0.001
    # An EC2 pool on moto (host ``aws``) whose instances never boot: launches and
    # terminations all run long (loadtests.netfaults.aws_host).
    ec2: bool = True
    activation_timeout_s: float = 240.0


class FleetError(RuntimeError):
    pass


def wait_for(what: str, pred: Callable[[], Any], timeout_s: float, interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError, OSError, ValueError, KeyError):
            got = pred()
            if got:
                return got
        if time.monotonic() > deadline:
            raise FleetError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


class NetFleet:
    """Start with :meth:`start` (from inside :meth:`inside`), stop with :meth:`close`."""

    def __init__(self, root: Path, model_dir: Path, options: FleetOptions | None = None) -> None:
        self.root = root
        self.model_dir = model_dir
        self.opts = options or FleetOptions()
        self.token = secrets.token_hex(16)
        self.net = Net()
        self.procs: dict[str, subprocess.Popen[Any]] = {}
        self.pg: PostgresServer | None = None
        self._store: subprocess.Popen[str] | None = None
        self._proxy: subprocess.Popen[str] | None = None  # the store's
        self._proxies: list[subprocess.Popen[str]] = []
        names = ["pg", "redis", "store", "c1", "c2", "a1", "a2", *self.workers, "client"]
        if self.opts.ec2:
            names.append("aws")
        self._ec2: tuple[dict[str, Any], dict[str, Any]] | None = None
        for n in names:
            self.net.host(n)

    # -- names and addresses -------------------------------------------------------------
    @property
    def workers(self) -> list[str]:
        return [f"w{i + 1}" for i in range(self.opts.workers)]

    def ip(self, host: str) -> str:
        return self.net.hosts[host].ip

    @property
    def aws_url(self) -> str:
        return f"http://{self.ip('aws')}:{aws_host.PORT}"

    def controller_url(self, name: str) -> str:
        return f"http://{self.ip(name)}:{CONTROLLER_PORT}"

    @property
    def controller_urls(self) -> list[str]:
        return [self.controller_url("c1"), self.controller_url("c2")]

    def activator_url(self, name: str) -> str:
        return f"http://{self.ip(name)}:{ACTIVATOR_PORT}/v1"

    def _pool_connected(self, name: str) -> bool:
        health = httpx.get(self.activator_url(name).removesuffix("/v1") + "/healthz", timeout=2).json()
        return bool(health["pool_connected"])

    @property
    def state_url(self) -> str:
        """PostgreSQL as the checker reads it (directly)."""
        return f"postgresql://postgres@{self.ip('pg')}:{PG_PORT}/postgres"

    @property
    def controllers_state_url(self) -> str:
        """PostgreSQL as the controllers reach it (through the zone's delay, if any)."""
        port = PG_PORT if self.opts.zone_delay_s is None else PG_PROXY_PORT
        return f"postgresql://postgres@{self.ip('pg')}:{port}/postgres"

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def inside(self) -> contextlib.AbstractContextManager[None]:
        """The calling thread on the client host (the only way to reach the fleet)."""
        return self.net.inside("client")

    # -- start ---------------------------------------------------------------------------
    def start(self) -> None:
        """Every service, then a ready route for the demo model is not waited for (the
        first request cold-starts it). Call from inside :meth:`inside`."""
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self.pg = PostgresServer(host=self.ip("pg"), netns=self.net.hosts["pg"].name, port=PG_PORT)
        self.pg.start()
        if self.opts.zone_delay_s is not None:
            self._delay_proxy("pg", PG_PROXY_PORT, PG_PORT, self.opts.zone_delay_s)
        self._spawn("redis", "redis", ["redis-server", "--bind", self.ip("redis"), "--port", str(REDIS_PORT),
                                       "--save", "", "--appendonly", "no", "--protected-mode", "no"], python=False)
        self._start_store()
        if self.opts.ec2:
            self._spawn("aws", "aws", [sys.executable, "-m", "moto.server", "-H", self.ip("aws"), "-p",
                                       str(aws_host.PORT)], python=False)
            wait_for("moto", lambda: httpx.get(f"{self.aws_url}/moto-api/", timeout=1).status_code == 200, 60)
            self._ec2 = aws_host.config(self.aws_url)
        uri = f"s3://{BUCKET}/models/demo"
        for u in (uri, uri + "-2"):
            push_model(self._s3().client(), self.model_dir, u)
        if self.opts.store_rate:
            self.net.rate("store", self.opts.store_rate)
        for c in ("c1", "c2"):
            self._spawn(c, c, ["controller", "--config", str(self._config(c, uri)), "--host", self.ip(c),
                               "--port", str(CONTROLLER_PORT), "--url", self.controller_url(c)])
        wait_for("a leading controller", self.leader, 60)
        urls = ",".join(self.controller_urls)
        for a in ("a1", "a2"):
            self._spawn(a, a, ["activator", "--config", str(self._config(a, uri)), "--controller", urls,
                               "--host", self.ip(a), "--port", str(ACTIVATOR_PORT), "--id", a])
        for w in self.workers:
            self._spawn(w, w, ["worker", "--config", str(self._config(w, uri)), "--controller", urls,
                               "--shape", "cpu-local", "--host", self.ip(w), "--port", str(WORKER_PORT),
                               "--worker-id", w, "--instance-id", w,
                               "--data-dir", str(self.root / w / "engine"),
                               "--host-cache-dir", str(self.root / w / "host-cache")])
        for a in ("a1", "a2"):
            wait_for(f"activator {a}", partial(self._pool_connected, a), 60)
        wait_for("every worker registered", lambda: len([
            w for w in self.state()["workers"] if w["id"] in self.workers]) == len(self.workers), 120)

    def _start_store(self) -> None:
        root = self.root / "store"
        root.mkdir(parents=True, exist_ok=True)
        self._store = self.net.popen("store", [sys.executable, "-m", "loadtests.netfaults.store_host", str(root),
                                               self.ip("store"), BUCKET],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log("store").open("w"), text=True, cwd=ROOT)
        assert self._store.stdout is not None
        said = []
        for line in self._store.stdout:  # its log lines, then ``ready``
            said.append(line)
            if line.strip() == "ready":
                break
        else:
            raise FleetError(f"the store did not start: {''.join(said)[-2000:]}{self.log('store').read_text()[-2000:]}")
        self._proxy = self._delay_proxy("store", STORE_PROXY_PORT, S3_PORT, 0.0)

    def _delay_proxy(self, host: str, listen: int, target: int, delay_s: float) -> subprocess.Popen[str]:
        """A delay proxy on ``host`` from port ``listen`` to its ``target`` port."""
        proxy = self.net.popen(host, [sys.executable, "-m", "loadtests.netfaults.delay", str(listen), self.ip(host),
                                      str(target)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               cwd=ROOT)
        assert proxy.stdout is not None and proxy.stdin is not None
        if proxy.stdout.readline().strip() != "listening":
            raise FleetError(f"the delay proxy on {host} did not start")
        if delay_s:
            proxy.stdin.write(f"delay {delay_s}\n")
            proxy.stdin.flush()
        self._proxies.append(proxy)
        return proxy

    def _s3(self, port: int = S3_PORT) -> S3Endpoint:
        creds = json.loads((self.root / "store" / "credentials.json").read_text())
        return S3Endpoint(f"http://{self.ip('store')}:{port}", creds["access_key"], creds["secret_key"])

    def _config(self, host: str, uri: str) -> Path:
        """This host's config file: the example's, pointed at the fleet's services."""
        cfg = yaml.safe_load((ROOT / "examples" / "thaw.yaml").read_text())
        port = STORE_PROXY_PORT if host.startswith("w") else S3_PORT
        cfg.update({
            "data_dir": str(self.root / host / "data"),
            "cluster": {"name": aws_host.CLUSTER, "heartbeat_interval_s": self.opts.heartbeat_s,
                        "worker_timeout_s": self.opts.worker_timeout_s},
            "controller": {"urls": self.controller_urls, "lease_s": self.opts.lease_s},
            "state": {"backend": "postgres", "url": self.controllers_state_url},
            "object_store": {"kind": "s3", "endpoint_url": f"http://{self.ip('store')}:{port}", "bucket": BUCKET,
                             "credentials": {"source": "file", "file": str(self.root / "store" / "credentials.json")}},
            "limits": {"backend": "redis", "url": f"redis://{self.ip('redis')}:{REDIS_PORT}/0", "timeout_ms": 2000},
            "ledger": {"ship": False},
        })
        cfg["tenants"][0]["limits"] = {}
        cfg["models"][0].update({"uri": uri, "demo_if_missing": False})
        cfg["models"][0]["autoscaling"].update({"idle_grace_s": 3600,
                                                "activation_timeout_s": self.opts.activation_timeout_s})
        cfg["models"].append({**cfg["models"][0], "name": "demo-2", "uri": uri + "-2", "served_name": COLD_MODEL})
        cfg["pools"][0].update({"provider": "static", "standby_min": 1, "standby_max": self.opts.workers,
                                "max_instances": self.opts.workers})
        if self._ec2 is not None and host.startswith("c"):
            shape, pool = self._ec2
            cfg["shapes"].append(shape)
            cfg["pools"].append(pool)
            cfg["cluster"]["token_ssm_parameter"] = "/thaw/netfaults/token"  # named in user data only
        path = self.root / host / "thaw.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(cfg))
        return path

    def _spawn(self, name: str, host: str, argv: list[str], *, python: bool = True) -> None:
        cmd = [sys.executable, "-m", "thaw.cli.main", *argv] if python else argv
        env = {**os.environ, "THAW_CLUSTER_TOKEN": self.token}
        if host.startswith("c") and self.opts.ec2:
            env.update(aws_host.CREDS)
        if host.startswith("w"):
            # A worker's store keys come from its own environment (an instance role on
            # AWS), never over the wire; it reaches the store through the delay proxy.
            env.update(self._s3(STORE_PROXY_PORT).env())
        self.procs[name] = self.net.popen(host, cmd, stdout=self.log(name).open("w"), stderr=subprocess.STDOUT,
                                          cwd=self.root, env=env)

    # -- what the fleet says ---------------------------------------------------------------
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def leader(self) -> str | None:
        """Which controller leads by its own word (None: none answers that it does)."""
        for c in ("c1", "c2"):
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if httpx.get(f"{self.controller_url(c)}/healthz", timeout=1).json().get("role") == "leader":
                    return c
        return None

    def state(self) -> dict[str, Any]:
        """The leader's ``/v1/state``."""
        leader = self.leader()
        if leader is None:
            raise FleetError("no controller leads")
        r = httpx.get(f"{self.controller_url(leader)}/v1/state", headers=self.auth(), timeout=5)
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]

    def exited(self) -> dict[str, int]:
        """Services that ended (name -> exit status): none should, until :meth:`close`."""
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def store_delay(self, seconds: float) -> None:
        """Hold every chunk on the workers' link to the store this long (0: none)."""
        assert self._proxy is not None and self._proxy.stdin is not None
        self._proxy.stdin.write(f"delay {seconds}\n")
        self._proxy.stdin.flush()

    def pause(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGCONT)

    @property
    def ledgers(self) -> list[Path]:
        return [self.root / a / "data" / "activators" / a / "usage.db" for a in ("a1", "a2")]

    def instances(self) -> list[Any]:
        """What the EC2 provider holds (``loadtests.netfaults.checker.Launched``; none
        without the EC2 pool)."""
        return aws_host.instances(self.aws_url) if self.opts.ec2 else []

    def worker_logs(self) -> dict[str, Path]:
        return {w: self.log(w) for w in self.workers}

    # -- stop ------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every service (activators first, so their ledgers are whole), then the net."""
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGCONT)  # a paused one must hear the SIGTERM
        for names in (["a1", "a2"], ["c1", "c2"], self.workers):
            for n in names:
                if n in self.procs and self.procs[n].poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.procs[n].pid, signal.SIGTERM)
            for n in names:
                if n in self.procs:
                    try:
                        self.procs[n].wait(30)
                    except subprocess.TimeoutExpired:
                        os.killpg(self.procs[n].pid, signal.SIGKILL)
        for proxy in [*self._proxies, self._store]:
            if proxy is not None and proxy.poll() is None and proxy.stdin is not None:
                with contextlib.suppress(BrokenPipeError):
                    proxy.stdin.close()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proxy.wait(30)
        if self.pg is not None:
            with contextlib.suppress(Exception):
                self.pg.stop()
            self.pg.remove()
        self.net.close()


@contextlib.contextmanager
def running(root: Path, model_dir: Path, options: FleetOptions | None = None) -> Iterator[NetFleet]:
    """A started fleet, the caller's thread inside its client host; closed at the end."""
    fleet = NetFleet(root, model_dir, options)
    try:
        with fleet.inside():
            fleet.start()
            yield fleet
    finally:
        fleet.close()
