"""Thaw as a fleet on one machine: `thaw controller`, two `thaw activator`s and a local
pool of `thaw worker`s, as separate processes with real vLLM on the CPU and the store.

A cold request through activator A starts exactly one replica and a request through B
is hot; the controller is SIGKILLed under streamed load through both and restarted:
no request fails, and the new controller adopts the same workers and replica without a
launch. The control plane refuses calls without the cluster token, and no log, state,
metrics or status output carries the token or the store's secret.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
import yaml

from loadtests.procs import kill_group
from tests.conftest import BUCKET
from thaw.embedded_store import EmbeddedStore, free_port
from thaw.objstore import S3Endpoint
from weight_streaming.push import push_model

pytestmark = [pytest.mark.integration, pytest.mark.engine]

KEY = "thaw-demo-key"
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Fleet:
    tmp: Path
    config: Path
    controller_url: str
    activators: dict[str, str]  # name -> base URL (…/v1)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        return self.tmp / "data"

    def token(self) -> str:
        return (self.data_dir / "cluster-token").read_text().strip()

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token()}"}

    def start(self, name: str, *argv: str) -> None:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "thaw.cli.main", *argv, "--config", str(self.config)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.tmp)
        log.close()

    def start_controller(self) -> None:
        port = self.controller_url.rsplit(":", 1)[1]
        self.start("controller", "controller", "--port", port)

    def state(self) -> dict[str, Any]:
        r = httpx.get(f"{self.controller_url}/v1/state", headers=self.auth(), timeout=5)
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]

    def wait(self, what: str, pred: Any, timeout_s: float = 180) -> dict[str, Any]:
        deadline = time.time() + timeout_s
        last: Any = None
        while time.time() < deadline:
            for name, p in self.procs.items():
                assert p.poll() is None, f"{name} exited ({p.returncode}):\n{self.log_tail(name)}"
            try:
                last = self.state()
                if pred(last):
                    return last  # type: ignore[no-any-return]
            except (httpx.HTTPError, OSError) as exc:  # not up yet (no token file yet)
                last = repr(exc)
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}; last: {json.dumps(last, indent=1)[:4000]}")

    def log_tail(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def client(self, name: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.activators[name], api_key=KEY, max_retries=0, timeout=120)


def _kill_local_workers(data_dir: Path) -> None:
    """The workers outlive a controller on purpose; the test removes them at the end."""
    for rec in (data_dir / "local-workers").glob("*.json"):
        info = json.loads(rec.read_text())
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(info["pid"]), signal.SIGTERM)
    deadline = time.time() + 40
    for rec in (data_dir / "local-workers").glob("*.json"):
        pid = int(json.loads(rec.read_text())["pid"])
        while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE \
                and time.time() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def fleet(store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    uri = f"s3://{BUCKET}/e2e/fleet-{os.getpid()}"
    push_model(s3.client(), demo_model_dir, uri)
    cfg = yaml.safe_load((ROOT / "examples" / "thaw.yaml").read_text())
    controller_port = free_port()
    cfg.update({
        "data_dir": str(tmp / "data"),
        "controller": {"port": controller_port},
        "cluster": {"heartbeat_interval_s": 1, "worker_timeout_s": 10},
        "object_store": {"kind": "s3", "endpoint_url": s3.endpoint_url, "bucket": BUCKET,
                         "credentials": {"source": "file", "file": str(store.root / "credentials.json")}},
    })
    cfg["models"][0].update({"uri": uri, "demo_if_missing": False})
    cfg["models"][0]["autoscaling"].update({"idle_grace_s": 600, "activation_timeout_s": 240})
    cfg["pools"][0].update({"standby_min": 1, "standby_max": 1, "max_instances": 3})
    path = tmp / "thaw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    ports = {"a": free_port(), "b": free_port()}
    f = Fleet(tmp, path, f"http://127.0.0.1:{controller_port}",
              {n: f"http://127.0.0.1:{p}/v1" for n, p in ports.items()})
    try:
        f.start_controller()
        for name, port in ports.items():
            f.start(f"activator-{name}", "activator", "--controller", f.controller_url, "--port", str(port),
                    "--id", name)
        yield f
    finally:
        for name in [n for n in f.procs if n.startswith("activator")] + ["controller"]:
            if name in f.procs:
                kill_group(f.procs[name], 60)
        _kill_local_workers(f.data_dir)


def ready_workers(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in state["workers"] if w["state"] == "ready" and w["model"] == "demo"]


def test_a_cold_request_through_a_starts_one_replica_and_b_is_hot(fleet: Fleet) -> None:
    fleet.wait("a standby worker", lambda s: any(w["state"] == "standby" for w in s["workers"]))
    raw = fleet.client("a").chat.completions.with_raw_response.create(
        model="thaw-demo", messages=[{"role": "user", "content": "Hello"}], max_tokens=4, stream=True)
    assert raw.headers["x-thaw-cold-start"] == "true"
    assert any(c.choices and c.choices[0].delta.content for c in raw.parse())
    # B learns the route from the controller's feed: hot at once.
    deadline = time.time() + 10
    while True:
        raw_b = fleet.client("b").chat.completions.with_raw_response.create(
            model="thaw-demo", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        if raw_b.headers["x-thaw-cold-start"] == "false" or time.time() > deadline:
            break
        time.sleep(0.2)
    assert raw_b.headers["x-thaw-cold-start"] == "false"
    state = fleet.state()
    assert len(ready_workers(state)) == 1
    events = httpx.get(f"{fleet.controller_url}/v1/events", headers=fleet.auth(), timeout=5).json()["events"]
    assert [e["kind"] for e in events].count("assign") == 1


def test_the_control_plane_refuses_calls_without_the_cluster_token(fleet: Fleet) -> None:
    state = fleet.state()
    worker = ready_workers(state)[0]
    for url in (f"{fleet.controller_url}/v1/state", f"{fleet.controller_url}/v1/routes",
                f"{fleet.controller_url}/metrics", f"{worker['control_url']}/state",
                f"{worker['control_url']}/metrics"):
        assert httpx.get(url, timeout=5).status_code == 401, url
        assert httpx.get(url, timeout=5, headers={"Authorization": "Bearer guess"}).status_code == 401, url
    for path in ("/assign", "/release", "/sleep"):
        r = httpx.post(f"{worker['control_url']}{path}", json={}, timeout=5)
        assert r.status_code == 401, path
    assert httpx.get(f"{worker['control_url']}/healthz", timeout=5).status_code == 200
    # Nothing happened to it.
    assert [(w["id"], w["state"]) for w in ready_workers(fleet.state())] == [(worker["id"], "ready")]


def test_controller_sigkill_and_restart_under_streamed_load(fleet: Fleet) -> None:
    before = fleet.state()
    replica = ready_workers(before)[0]
    workers_before = {w["id"]: (w["instance_id"], w["state"], w["model"]) for w in before["workers"]}
    failures: list[str] = []
    done: list[str] = []
    stop = threading.Event()

    def load(name: str) -> None:
        client = fleet.client(name)
        i = 0
        while not stop.is_set():
            i += 1
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model="thaw-demo", messages=[{"role": "user", "content": f"{name} {i}"}], max_tokens=6,
                    stream=True)
                text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
                if not text:
                    failures.append(f"{name} {i}: empty answer")
                else:
                    done.append(name)
            except Exception as exc:
                failures.append(f"{name} {i}: {type(exc).__name__}: {exc}")
            time.sleep(0.1)

    threads = [threading.Thread(target=load, args=(n,), daemon=True) for n in ("a", "b")]
    for t in threads:
        t.start()
    try:
        time.sleep(2)
        os.killpg(fleet.procs["controller"].pid, signal.SIGKILL)
        fleet.procs["controller"].wait(10)
        down_at = time.time()
        served_before_outage = len(done)
        time.sleep(8)  # the whole outage under load
        served_in_outage = len(done) - served_before_outage
        fleet.start_controller()
        after = fleet.wait("the restarted controller to adopt the fleet", lambda s: s["adopted"], timeout_s=60)
        assert after["controller_epoch"] != before["controller_epoch"]
        # Both activators are back on the controller's feed within a few seconds.
        deadline = time.time() + 15
        while time.time() < deadline:
            health = [httpx.get(u.removesuffix("/v1") + "/healthz", timeout=5).json()
                      for u in fleet.activators.values()]
            if all(h["pool_connected"] for h in health):
                break
            time.sleep(0.2)
        assert all(h["pool_connected"] for h in health), health
        back_s = time.time() - down_at
        time.sleep(3)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert not failures, failures[:5]
    assert served_in_outage > 0 and set(done) == {"a", "b"}
    state = fleet.state()
    # The same workers, the same replica, and nothing launched or assigned by the new controller.
    assert {w["id"]: (w["instance_id"], w["state"], w["model"]) for w in state["workers"]} == workers_before
    assert ready_workers(state)[0]["id"] == replica["id"]
    events = httpx.get(f"{fleet.controller_url}/v1/events", headers=fleet.auth(), timeout=5).json()["events"]
    assert not [e for e in events if e["kind"] in ("launch", "launched", "assign", "release", "terminate")], events
    print(f"\nserved during the outage: {served_in_outage}; routes back {back_s:.1f}s after the kill "
          f"(8 s of it down); total served {len(done)}")


def test_no_secret_in_logs_state_metrics_or_pool_status(fleet: Fleet, store: EmbeddedStore) -> None:
    secret = json.loads((store.root / "credentials.json").read_text())["secret_key"]
    token = fleet.token()
    out = subprocess.run([sys.executable, "-m", "thaw.cli.main", "pool", "status", "--json", "--config",
                          str(fleet.config), "--controller", fleet.controller_url],
                         capture_output=True, text=True, timeout=30, cwd=fleet.tmp)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert status["workers"] and all(
        set(w) == {"id", "instance_id", "control_url", "state", "model", "age_s"} for w in status["workers"])
    texts = {"thaw pool status --json": out.stdout + out.stderr,
             "/v1/state": json.dumps(fleet.state()),
             "controller /metrics": httpx.get(f"{fleet.controller_url}/metrics", headers=fleet.auth()).text}
    for name, base in fleet.activators.items():
        texts[f"activator {name} /metrics"] = httpx.get(base.removesuffix("/v1") + "/metrics").text
    for w in status["workers"]:
        texts[f"worker {w['id']} /state"] = httpx.get(f"{w['control_url']}/state", headers=fleet.auth()).text
        texts[f"worker {w['id']} /metrics"] = httpx.get(f"{w['control_url']}/metrics", headers=fleet.auth()).text
    logs = list(fleet.tmp.glob("*.log")) + list((fleet.data_dir / "logs").glob("*.log"))
    assert len(logs) >= 4
    for p in logs:
        texts[str(p)] = p.read_text(errors="replace")
    for name, text in texts.items():
        assert secret not in text, f"the store secret appears in {name}"
        assert token not in text, f"the cluster token appears in {name}"


def test_a_budget_change_from_the_cli_applies_survives_a_restart_and_is_an_event(fleet: Fleet) -> None:
    def thaw(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "thaw.cli.main", *args, "--config", str(fleet.config),
                               "--controller", fleet.controller_url], capture_output=True, text=True, timeout=60,
                              cwd=fleet.tmp)

    def standbys(s: dict[str, Any]) -> int:
        return sum(w["state"] == "standby" for w in s["workers"])

    fleet.wait("one standby", lambda s: standbys(s) == 1)
    bad = thaw("pool", "budget", "set", "cpu-local", "--standby-min", "3", "--standby-max", "2")
    assert bad.returncode == 2 and "standby_min (3) must not exceed standby_max (2)" in bad.stderr
    out = thaw("pool", "budget", "set", "cpu-local", "--standby-min", "2", "--standby-max", "2")
    assert out.returncode == 0, out.stderr
    assert "cpu-local" in out.stdout and "2..2" in out.stdout and "run time" in out.stdout
    # The next tick launches the second standby (it stands by once vLLM is imported).
    fleet.wait("a second standby worker", lambda s: len([w for w in s["workers"] if w["model"] is None]) == 2,
               timeout_s=15)
    fleet.wait("two standbys", lambda s: standbys(s) == 2)
    events = thaw("pool", "events", "--since", "10m")
    assert events.returncode == 0 and "budget" in events.stdout and "operator" in events.stdout
    # A restart (SIGTERM) keeps the band: no launch, no terminate.
    kill_group(fleet.procs["controller"], 60)
    assert fleet.procs["controller"].returncode == 0
    fleet.start_controller()
    state = fleet.wait("adopted", lambda s: s["adopted"])
    time.sleep(2)
    shown = thaw("pool", "budget", "show", "--json")
    pool = json.loads(shown.stdout)["pools"][0]
    assert (pool["standby_min"], pool["standby_max"], pool["source"]) == (2, 2, "run time")
    assert standbys(fleet.state()) == 2 == standbys(state)
    new_events = httpx.get(f"{fleet.controller_url}/v1/events", headers=fleet.auth(), timeout=5).json()["events"]
    assert not [e for e in new_events if e["kind"] in ("launch", "terminate")]
