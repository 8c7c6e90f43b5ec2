"""`thaw bench control-plane`: the controller, its route feed and the activators at fleet
size, with every worker simulated (:mod:`loadtests.sim_fleet`).

    thaw bench control-plane --out bench_control_plane.json [--sizes 100x10 1000x100 10000x1000]
                             [--activators 4] [--burst 1000] [--state sqlite|postgres]

At each size (models x workers), on loopback, it starts:

- an embedded store holding the demo model (every model's weights: the registry checks
  each deploy against the store's manifest);
- the real controller (`thaw controller`) on SQLite, or two on a private PostgreSQL
  (``--state postgres``: one leads, the other follows), with one static pool of the
  simulated workers' shape (workers that register themselves: it launches nothing),
  its standby band and cap the fleet's size, so every worker stands by;
- the simulated fleet (one process, each worker heartbeating and answering the control
  API; an engine is ready ``--load-s`` after its assignment);
- ``--activators`` real activators (`thaw activator`).

Then it measures, in this order:

- **deploy**: the models through the registry's API: above ``--deploy-sample`` (1,000),
  the rest first in one ``POST /v1/admin/apply``, then the sample one by one through
  ``POST /v1/admin/models`` (8 at a time): the seconds each took with the registry
  (nearly) full, and how that grows from the first tenth to the last;
- **idle**: the controller's turn of the loop (``thaw_pool_step_seconds``) over
  ``--idle-s`` with nothing to do, and every process's memory (RSS) and CPU;
- **burst**: ``--burst`` models at zero (each its own), one streaming request each, all
  sent within one second, spread over the activators: each request's status and time to
  first token; from the controller's decision log, each model's demand to its
  assignment and when the last was placed; the loop's turns meanwhile; and, polled
  every 25 ms from each service's ``/healthz``, how long each new route table took to
  reach every activator;
- **latency**: what an activator adds to a hot request, with every model in its tables:
  ``--latency-pairs`` streamed completions of a ready model straight to its replica and
  through an activator, one pair at a time;
- **churn**: ``--churn-per-min`` deploys, updates and removes a minute for ``--churn-s``,
  while ``--traffic-rps`` requests a second stream to the models the burst made ready:
  each change's time, when every activator had the catalog it made, the loop's turns;
- **operators**: ``thaw models ls`` and ``thaw pool status --json`` at full size;
- **takeover**: the leader SIGKILLed under the same traffic; the follower (PostgreSQL)
  or a new controller on the same SQLite file takes over: until it leads, has adopted
  the fleet, routes every replica the old one routed, and every activator follows it;
  the workers assigned or released meanwhile (none should be).

Growth between sizes is reported as exponents (``log(b/a) / log(size_b/size_a)``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadtests import plane_scenarios
from loadtests.plane_measures import (
    API_KEY,
    Versions,
    exponent,
    histogram,
    loop_figures,
    percentile,
)

SHAPE = "sim"
DEPLOY_CONCURRENCY = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="write the JSON report here")
    p.add_argument("--sizes", nargs="+", default=["100x10", "1000x100", "10000x1000"],
                   help="MODELSxWORKERS at each size (default 100x10 1000x100 10000x1000)")
    p.add_argument("--activators", type=int, default=4, help="activator processes (default 4)")
    p.add_argument("--burst", type=int, default=1000,
                   help="models at zero that each get one request within a second (at most the workers; default 1000)")
    p.add_argument("--deploy-sample", type=int, default=1000,
                   help="models deployed one by one at each size, after the rest in one apply (default 1000)")
    p.add_argument("--load-s", type=float, default=1.0, help="a simulated engine's load, seconds (default 1)")
    p.add_argument("--idle-s", type=float, default=10.0, help="seconds of the idle sample (default 10)")
    p.add_argument("--state", choices=["sqlite", "postgres"], default="sqlite",
                   help="the controller's state: SQLite (one controller; the takeover is a restart) or a private "
                        "PostgreSQL (two controllers, one following; default sqlite)")
    p.add_argument("--latency-pairs", type=int, default=300,
                   help="hot requests straight to a replica and through an activator, one pair at a time (default 300)")
    p.add_argument("--churn-s", type=float, default=60.0, help="seconds of churn (default 60; 0: none)")
    p.add_argument("--churn-per-min", type=float, default=100.0,
                   help="deploys, updates and removes a minute in the churn (default 100)")
    p.add_argument("--traffic-rps", type=float, default=20.0,
                   help="requests a second to the ready models during the churn and the takeover (default 20)")
    p.add_argument("--no-takeover", action="store_true", help="skip the controller takeover")
    p.add_argument("--work-dir", type=Path, default=None, help="keep the run's files here (default: a temp dir)")


def _log(msg: str) -> None:
    print(f"[bench control-plane] {msg}", file=sys.stderr, flush=True)


def heartbeat_s(workers: int) -> float:
    """The heartbeat interval for a fleet of ``workers``: 2 s, or as long as keeps the
    controller's heartbeats to 200 a second."""
    return max(2.0, workers / 200)


def parse_size(text: str) -> tuple[int, int]:
    try:
        models, workers = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--sizes: {text!r} is not MODELSxWORKERS (e.g. 1000x100)") from None
    if models < 1 or workers < 1:
        raise SystemExit(f"--sizes: {text!r} needs at least one model and one worker")
    return models, workers


class Plane:
    """One size's processes and the clients to them."""

    def __init__(self, work: Path, store: Any, model_uri: str, models: int, workers: int, activators: int,
                 load_s: float, state_url: str | None = None) -> None:
        import yaml

        from thaw.config import hash_api_key, parse_config
        from thaw.embedded_store import free_port

        self.work, self.models, self.workers = work, models, workers
        self.model_uri, self.load_s = model_uri, load_s
        # SQLite: one controller (a takeover is a restart). PostgreSQL (``state_url``):
        # two sharing it, "a" leading and "b" following until a's lease runs out.
        self.controller_ports = {"a": free_port()} if state_url is None else {"a": free_port(), "b": free_port()}
        self.controller_port, self.fleet_port = self.controller_ports["a"], free_port()
        self.controller_urls = {n: f"http://127.0.0.1:{p}" for n, p in self.controller_ports.items()}
        self.activator_ports = [free_port() for _ in range(activators)]
        self.data_dir = work / "data"
        self.token = "bench-control-plane-token"
        cfg = {
            "data_dir": str(self.data_dir), "log_level": "warning",
            # Heartbeats every 2 s up to 400 workers, then spaced to 200 a second: a worker
            # is found dead within six intervals (docs/BENCHMARKS.md: what one controller
            # process takes in heartbeats).
            "cluster": {"token": self.token, "heartbeat_interval_s": heartbeat_s(workers),
                        "worker_timeout_s": 6 * heartbeat_s(workers)},
            "controller": {"host": "127.0.0.1", "port": self.controller_port}
            if state_url is None else {"host": "127.0.0.1", "urls": list(self.controller_urls.values())},
            **({} if state_url is None else {"state": {"backend": "postgres", "url": state_url}}),
            "object_store": {"kind": "s3", "endpoint_url": store.endpoint_url, "bucket": store.bucket,
                             "region": store.region,
                             "credentials": {"source": "file", "file": str(store.credentials_file)}},
            "ledger": {"ship": False},
            "shapes": [{"name": SHAPE, "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8,
                        "price_per_hour_usd": 0.0, "boot_timeout_s": 600}],
            "pools": [{"shape": SHAPE, "provider": "static", "standby_min": workers, "standby_max": workers,
                       "max_instances": workers}],
            "models": [],
            "tenants": [{"name": "bench", "api_key_hashes": [hash_api_key(API_KEY)], "allowed_models": ["*"]}],
        }
        parse_config(cfg)
        work.mkdir(parents=True, exist_ok=True)
        self.config_path = work / "thaw-control-plane.yaml"
        self.config_path.write_text(yaml.safe_dump(cfg))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.leader = "a"
        self.controller_url = self.controller_urls["a"]
        # Every client is given the followers first: each finds the leader itself.
        self.controllers_arg = ",".join(reversed(self.controller_urls.values()))
        self.activator_urls = [f"http://127.0.0.1:{p}" for p in self.activator_ports]
        self.headers = {"Authorization": f"Bearer {self.token}"}

    # -- processes ----------------------------------------------------------------------
    def _start(self, name: str, cmd: list[str], ready_url: str, timeout_s: float = 120.0) -> None:
        import httpx

        from loadtests.procs import tail
        from thaw.process import spawn_group

        log = self.work / f"{name}.log"
        proc = self.procs[name] = spawn_group(cmd, log)
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}): {tail(log)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready_url, timeout=2).status_code < 500:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready after {timeout_s:.0f} s: {tail(log)}")
            time.sleep(0.2)

    def start_controller(self, name: str) -> None:
        port = self.controller_ports[name]
        self._start(f"controller-{name}", [sys.executable, "-m", "thaw.cli.main", "controller", "--config",
                                           str(self.config_path), "--port", str(port),
                                           "--url", self.controller_urls[name]],
                    f"{self.controller_urls[name]}/healthz")

    def start_controller_and_fleet(self) -> None:
        # The fleet first: its workers register within the controller's adoption grace.
        self._start("fleet", [sys.executable, "-m", "loadtests.sim_fleet", "--port", str(self.fleet_port),
                              "--controller", self.controllers_arg, "--token", self.token,
                              "--workers", str(self.workers), "--shape", SHAPE, "--load-s", str(self.load_s)],
                    f"http://127.0.0.1:{self.fleet_port}/stats")
        self.start_controller("a")
        if "b" in self.controller_urls:  # b follows: a leads, it asked first
            self.wait("controller a leading", lambda: self.health(self.controller_urls["a"])["role"] == "leader", 60)
            self.start_controller("b")

        def standing_by() -> bool:
            state = self.state()
            return bool(state["adopted"]) and sum(1 for w in state["workers"] if w["state"] == "standby") == self.workers

        self.wait("every simulated worker standing by", standing_by, 300, every_s=1.0)

    def start_activators(self) -> None:
        thaw = [sys.executable, "-m", "thaw.cli.main"]
        for i, port in enumerate(self.activator_ports):
            self._start(f"activator-{i}", [*thaw, "activator", "--config", str(self.config_path), "--port", str(port),
                                           "--controller", self.controllers_arg, "--id", f"bench-a{i}"],
                        f"http://127.0.0.1:{port}/healthz")
        version = self.health(self.controller_url)["routes_version"]
        self.wait("every activator on the controller's route table",
                  lambda: all(self.health(u)["routes_version"] >= version for u in self.activator_urls), 120)

    def stop(self) -> None:
        from thaw.process import stop_group

        for name in reversed(list(self.procs)):
            stop_group(self.procs[name], 20)

    # -- reading the services --------------------------------------------------------------
    def get(self, url: str, **params: Any) -> Any:
        import httpx

        r = httpx.get(url, params=params, headers=self.headers, timeout=120)
        r.raise_for_status()
        return r.json()

    def state(self) -> dict[str, Any]:
        return self.get(f"{self.controller_url}/v1/state")  # type: ignore[no-any-return]

    def health(self, url: str) -> dict[str, Any]:
        return self.get(f"{url}/healthz")  # type: ignore[no-any-return]

    def scrape(self) -> str:
        import httpx

        return httpx.get(f"{self.controller_url}/metrics", headers=self.headers, timeout=60).text

    def step_histogram(self) -> dict[float, float]:
        return histogram(self.scrape(), "thaw_pool_step_seconds")

    def wait(self, what: str, pred: Any, timeout_s: float, every_s: float = 0.25) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():  # noqa: ASYNC110 - a benchmark's wait on other processes
            if time.monotonic() > deadline:
                raise RuntimeError(f"not {what} after {timeout_s:.0f} s (see {self.work})")
            time.sleep(every_s)

    def resources(self) -> dict[str, Any]:
        import psutil

        out = {}
        for name, proc in self.procs.items():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(proc.pid)
                t = p.cpu_times()
                out[name] = {"rss_mib": round(p.memory_info().rss / 2**20, 1), "cpu_s": round(t.user + t.system, 2)}
        return out

    # -- the scenarios -----------------------------------------------------------------------
    def spec(self) -> dict[str, Any]:
        return {"uri": self.model_uri, "shape": SHAPE, "max_context_tokens": 256,
                "autoscaling": {"idle_grace_s": 3600, "activation_timeout_s": 120}}

    def deploy(self, sample: int) -> dict[str, Any]:
        """The models through the registry's API: all but the last ``sample`` in one
        ``POST /v1/admin/apply`` (a whole file of models), then those one by one through
        ``POST /v1/admin/models``, ``DEPLOY_CONCURRENCY`` at a time: each deploy's cost
        with the registry (nearly) full."""
        import httpx

        names = [f"m{i:05d}" for i in range(self.models)]
        bulk, names = names[:max(len(names) - sample, 0)], names[max(len(names) - sample, 0):]
        out: dict[str, Any] = {}
        if bulk:
            t0 = time.perf_counter()
            r = httpx.post(f"{self.controller_url}/v1/admin/apply", headers=self.headers, timeout=1800,
                           json={"models": [{"name": n, **self.spec()} for n in bulk]})
            r.raise_for_status()
            out["applied"] = {"models": len(bulk), "wall_s": round(time.perf_counter() - t0, 2)}
        took = [0.0] * len(names)
        failed: list[str] = []

        async def one(client: httpx.AsyncClient, i: int, gate: asyncio.Semaphore) -> None:
            body = {"name": names[i], "spec": self.spec()}
            async with gate:
                t0 = time.perf_counter()
                r = await client.post("/v1/admin/models", json=body)
                took[i] = time.perf_counter() - t0
            if r.status_code != 201:
                failed.append(f"{names[i]}: {r.status_code} {r.text[:200]}")

        async def all_of_them() -> None:
            gate = asyncio.Semaphore(DEPLOY_CONCURRENCY)
            async with httpx.AsyncClient(base_url=self.controller_url, headers=self.headers, timeout=600) as c:
                await asyncio.gather(*(one(c, i, gate) for i in range(len(names))))

        t0 = time.perf_counter()
        asyncio.run(all_of_them())
        wall = time.perf_counter() - t0
        if failed:
            raise RuntimeError(f"{len(failed)} deploys failed, e.g. {failed[:3]}")
        tenth = max(1, len(took) // 10)
        return {**out, "models": len(names), "wall_s": round(wall, 2), "per_s": round(len(names) / wall, 1),
                "p50_s": percentile(took, 50), "p99_s": percentile(took, 99),
                "first_tenth_p50_s": percentile(took[:tenth], 50), "last_tenth_p50_s": percentile(took[-tenth:], 50)}

    def idle(self, seconds: float) -> dict[str, Any]:
        before = self.scrape()
        res0 = self.resources()
        time.sleep(seconds)
        after = self.scrape()
        res1 = self.resources()
        return {"seconds": seconds, **loop_figures(before, after),
                "cpu_share": {k: round((res1[k]["cpu_s"] - res0[k]["cpu_s"]) / seconds, 3) for k in res1 if k in res0},
                "resources": res1}

    def burst(self, n: int) -> dict[str, Any]:
        """``n`` models at zero, one streaming request each within a second."""
        from loadtests.bare_client import first_event

        names = [f"m{i:05d}" for i in range(n)]
        sent: dict[str, float] = {}
        results: list[dict[str, Any]] = []
        versions = Versions(self)
        before = self.scrape()

        async def one(i: int, at: float) -> None:
            await asyncio.sleep(max(at - time.time(), 0.0))
            url = self.activator_urls[i % len(self.activator_urls)]
            body = json.dumps({"model": names[i], "stream": True, "max_tokens": 4,
                               "messages": [{"role": "user", "content": "hi"}]}).encode()
            sent[names[i]] = time.time()
            # Each on its own connection (loadtests.bare_client): through one httpx pool,
            # a thousand streams at once waited seconds in the client before being sent.
            status, ttft, error = await first_event(f"{url}/v1/chat/completions", body, {
                "Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
            row: dict[str, Any] = {"model": names[i], "status": status,
                                   "ttft_s": None if ttft is None else round(ttft, 4)}
            if error is not None:
                row["error"] = error
            results.append(row)

        async def all_of_them() -> None:
            start = time.time() + 0.5
            await asyncio.gather(*(one(i, start + i / n) for i in range(n)))

        with versions:
            asyncio.run(all_of_them())
        after = self.scrape()
        events = self.get(f"{self.controller_url}/v1/events", since=min(sent.values()) - 1)["events"]
        assigned, signalled = {}, {}
        for e in events:
            if e["kind"] == "assign" and e["model"] in sent and e["model"] not in assigned:
                assigned[e["model"]] = e["at"]
                # The demand signal's arrival at the controller (the first word of a
                # request for a model at zero) is the activity's last request then.
                at = (e.get("inputs") or {}).get("activity", {}).get("last_request_at")
                if at is not None:
                    signalled[e["model"]] = e["at"] - at
        to_assign = [assigned[m] - sent[m] for m in assigned]
        ok = [r for r in results if r["status"] == 200 and r["ttft_s"] is not None]
        return {
            "models": n, "answered": len(ok), "failed": [r for r in results if r not in ok][:20],
            "ttft_p50_s": percentile([r["ttft_s"] for r in ok], 50),
            "ttft_p99_s": percentile([r["ttft_s"] for r in ok], 99),
            "assigned": len(assigned),
            # From the client's send (through an activator and its demand signal) ...
            "request_to_assignment_p50_s": percentile(to_assign, 50),
            "request_to_assignment_p99_s": percentile(to_assign, 99),
            # ... and from the signal's arrival at the controller.
            "demand_to_assignment_p50_s": percentile(list(signalled.values()), 50),
            "demand_to_assignment_p99_s": percentile(list(signalled.values()), 99),
            "all_placed_after_last_request_s": round(max(assigned.values()) - max(sent.values()), 3)
            if len(assigned) == n else None,
            **loop_figures(before, after),
            "route_propagation": versions.report(),
        }

    def ready_models(self) -> dict[str, str]:
        """Each model with a ready replica in the leader's route table: its replica's URL."""
        table = self.get(f"{self.controller_url}/v1/routes")
        return {name: route["replicas"][0]["url"] for name, route in sorted(table["models"].items())
                if route.get("replicas")}

    def operators(self) -> dict[str, Any]:
        out: dict[str, dict[str, Any]] = {}
        for name, args in (("models_ls", ["models", "ls", "--json"]), ("pool_status", ["pool", "status", "--json"])):
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "thaw.cli.main", *args, "--config", str(self.config_path)],
                               capture_output=True, text=True, timeout=600,
                               env={**os.environ, "THAW_CLUSTER_TOKEN": self.token})
            out[name] = {"seconds": round(time.perf_counter() - t0, 2), "rc": r.returncode,
                         "bytes": len(r.stdout)}
            if r.returncode != 0:
                out[name]["stderr"] = r.stderr[-500:]
        return out


@contextlib.contextmanager
def _work_dir(args: argparse.Namespace) -> Iterator[Path]:
    own = args.work_dir is None
    work = Path(tempfile.mkdtemp(prefix="thaw-bench-control-plane-")) if own else args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        yield work
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    from loadtests.bench_cold_start import _ensure_model, _environment, _store

    sizes = [parse_size(s) for s in args.sizes]
    if args.activators < 1:
        raise SystemExit("--activators must be at least 1")
    started = time.time()
    runs = []
    with contextlib.ExitStack() as stack:
        work = stack.enter_context(_work_dir(args))
        store = stack.enter_context(_store(argparse.Namespace(s3_endpoint_url=None, s3_credentials_file=None,
                                                              bucket="thaw"), work))
        pg = stack.enter_context(_postgres()) if args.state == "postgres" else None
        uri, model = _ensure_model(store, "tiny", work)
        for models, workers in sizes:
            _log(f"{models} models, {workers} workers, {args.activators} activators, {args.state}")
            state_url = pg.database(f"plane_{models}x{workers}") if pg is not None else None
            plane = Plane(work / f"{models}x{workers}", store, uri, models, workers, args.activators, args.load_s,
                          state_url)
            try:
                runs.append(one_size(plane, args))
            finally:
                plane.stop()
    report = {"benchmark": "control-plane", "runs": runs, "growth": growth(runs), "model": model,
              "environment": _environment(),
              "settings": {"sizes": args.sizes, "state": args.state, "activators": args.activators,
                           "burst": args.burst, "latency_pairs": args.latency_pairs, "churn_s": args.churn_s,
                           "churn_per_min": args.churn_per_min, "traffic_rps": args.traffic_rps,
                           "load_s": args.load_s, "idle_s": args.idle_s, "deploy_sample": args.deploy_sample,
                           "wall_s": round(time.time() - started, 1)}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    _log(f"wrote {args.out}")
    return 0


def one_size(plane: Plane, args: argparse.Namespace) -> dict[str, Any]:
    """Every scenario at one size, in order; the takeover last (it replaces the leader)."""
    models, workers = plane.models, plane.workers
    plane.start_controller_and_fleet()
    row: dict[str, Any] = {"models": models, "workers": workers, "activators": args.activators, "state": args.state}
    row["deploy"] = plane.deploy(args.deploy_sample)
    _log(f"deployed {models} models ({row['deploy'].get('applied')} applied at once, then "
         f"{row['deploy']['models']} one by one in {row['deploy']['wall_s']} s)")
    plane.start_activators()
    row["idle"] = plane.idle(args.idle_s)
    row["burst"] = plane.burst(min(args.burst, workers, models))
    _log(f"burst: {row['burst']['answered']}/{row['burst']['models']} answered, "
         f"placed {row['burst']['all_placed_after_last_request_s']} s after the last request")
    if args.latency_pairs > 0:
        row["latency"] = plane_scenarios.latency(plane, args.latency_pairs)
        _log(f"latency: {row['latency']}")
    if args.churn_s > 0:
        row["churn"] = plane_scenarios.churn(plane, args.churn_s, args.churn_per_min, args.traffic_rps)
        _log(f"churn: {row['churn']['changes']} changes, {len(row['churn']['failed'])} failed, "
             f"catalog to every activator p99 {row['churn']['catalog_propagation']['p99_s']} s")
    row["operators"] = plane.operators()
    row["resources"] = plane.resources()
    if not args.no_takeover:
        row["takeover"] = plane_scenarios.takeover(plane, args.traffic_rps)
        _log(f"takeover: {row['takeover']}")
    return row


@contextlib.contextmanager
def _postgres() -> Iterator[Any]:
    from loadtests.postgres import PostgresServer

    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        server.remove()


def growth(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Exponents between consecutive sizes (by models) of what should grow at most linearly."""
    out = []
    for a, b in zip(runs, runs[1:], strict=False):
        def pick(r: dict[str, Any], *path: str) -> Any:
            for k in path:
                r = r.get(k) if isinstance(r, dict) else None  # type: ignore[assignment]
            return r

        out.append({
            "from_models": a["models"], "to_models": b["models"],
            # The mean turn: a bucket's bound moves in steps, the mean does not.
            "idle_step_mean": exponent(pick(a, "idle", "step_mean_s"), pick(b, "idle", "step_mean_s"),
                                       a["models"], b["models"]),
            "idle_step_p50": exponent(pick(a, "idle", "step_p50_s"), pick(b, "idle", "step_p50_s"),
                                      a["models"], b["models"]),
            "burst_step_mean": exponent(pick(a, "burst", "step_mean_s"), pick(b, "burst", "step_mean_s"),
                                        a["models"], b["models"]),
            "deploy_p50": exponent(pick(a, "deploy", "p50_s"), pick(b, "deploy", "p50_s"), a["models"], b["models"]),
            "controller_rss": exponent(pick(a, "resources", "controller-a", "rss_mib"),
                                       pick(b, "resources", "controller-a", "rss_mib"), a["models"], b["models"]),
        })
    return out
