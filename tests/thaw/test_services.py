"""The three services as processes: each answers /healthz without the token and
/metrics with it, a worker started by hand registers on a local pool, and SIGTERM
drains each and exits 0."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.waiting import wait_until
from thaw.embedded_store import free_port
from thaw.process import stop_group

TOKEN = "services-test-token"


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, "-m", "thaw.cli.main", *args], stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait_ok(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    def ok() -> bool:
        assert proc.poll() is None, log.read_text()[-2000:]
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(url, timeout=1).status_code == 200
        return False

    wait_until(f"{url} to answer", ok, timeout_s, 0.1, detail=lambda: log.read_text()[-2000:])


@pytest.mark.integration
def test_services_start_register_and_exit_0_on_sigterm(tmp_path: Path) -> None:
    cport, aport, wport = free_port(), free_port(), free_port()
    cfg = {
        "data_dir": str(tmp_path / "data"),
        "cluster": {"token": TOKEN, "heartbeat_interval_s": 0.5},
        "controller": {"port": cport},
        "object_store": {"kind": "s3", "endpoint_url": "http://127.0.0.1:9", "credentials": {"source": "env"}},
        "shapes": [{"name": "cpu", "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8,
                    "price_per_hour_usd": 0}],
        # No standby: nothing is launched; a worker started by hand registers itself.
        "pools": [{"shape": "cpu", "provider": "local", "standby_min": 0, "standby_max": 0}],
        "models": [{"name": "demo", "uri": "s3://thaw/demo", "shape": "cpu"}],
    }
    path = tmp_path / "thaw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    curl = f"http://127.0.0.1:{cport}"
    procs = {
        "controller": start(["controller", "--config", str(path)], tmp_path / "controller.log"),
        "activator": start(["activator", "--config", str(path), "--controller", curl, "--port", str(aport)],
                           tmp_path / "activator.log"),
        "worker": start(["worker", "--config", str(path), "--shape", "cpu", "--instance-id", "by-hand-1",
                         "--port", str(wport), "--data-dir", str(tmp_path / "w")], tmp_path / "worker.log"),
    }
    urls = {"controller": curl, "activator": f"http://127.0.0.1:{aport}", "worker": f"http://127.0.0.1:{wport}"}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        for name, proc in procs.items():
            wait_ok(f"{urls[name]}/healthz", proc, tmp_path / f"{name}.log")
            assert httpx.get(f"{urls[name]}/metrics", headers=auth, timeout=5).status_code == 200
        for name in ("controller", "worker", "activator"):
            assert httpx.get(f"{urls[name]}/metrics", timeout=5).status_code == 401
        workers = wait_until("the worker registered",
                             lambda: httpx.get(f"{curl}/v1/state", headers=auth, timeout=5).json()["workers"], 30, 0.2)
        assert [(w["id"], w["instance_id"], w["control_url"]) for w in workers] == [
            ("by-hand-1", "by-hand-1", f"http://127.0.0.1:{wport}")]
        # The activator is on the controller's route feed (it waited out the adoption).
        wait_until("the activator on the controller's route feed",
                   lambda: httpx.get(f"{urls['activator']}/healthz", timeout=5).json()["pool_connected"], 30, 0.2,
                   detail=lambda: (tmp_path / "activator.log").read_text()[-2000:])
    finally:
        codes = {}
        for name in ("activator", "worker", "controller"):
            stop_group(procs[name], 60)  # SIGTERM, then SIGKILL for what is left after 60 s
            codes[name] = procs[name].returncode
    assert codes == {"activator": 0, "worker": 0, "controller": 0}, {
        n: (tmp_path / f"{n}.log").read_text()[-1500:] for n, c in codes.items() if c}


def test_standing_by_is_a_standby_or_a_serving_worker() -> None:
    from thaw.cli.up import standing_by

    assert not standing_by({"workers": [{"state": "starting"}, {"state": "launching"}]})
    assert standing_by({"workers": [{"state": "starting"}, {"state": "standby"}]})
    assert standing_by({"workers": [{"state": "ready"}]}) and not standing_by({})
