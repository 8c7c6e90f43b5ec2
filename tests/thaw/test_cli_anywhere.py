"""`thaw` from any directory once `thaw up` runs, `thaw status --controller` without a
local `thaw up`, and `thaw store down` refused under a running stack: the command line
run as a real process, against a real controller (no vLLM: it launches no worker)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.thaw.controller_proc import EXAMPLE, THAW, controller_process
from thaw.cli import stack
from thaw.cli.up import endpoint_file, write_endpoint_file
from thaw.config import DEFAULT_CONFIG_PATH, load_config
from thaw.embedded_store import free_port


def thaw(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if k not in ("THAW_CONFIG", "THAW_ADMIN_KEY")}, **(env or {})}
    return subprocess.run([*THAW, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


@dataclass(frozen=True)
class Checkout:
    root: Path  # holds examples/thaw.yaml, whose data_dir is relative (.thaw)
    elsewhere: Path  # another directory, without a config
    url: str  # the controller's, started from root as `thaw up` starts it

    @property
    def config(self) -> Path:
        return self.root / DEFAULT_CONFIG_PATH


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Checkout]:
    tmp = tmp_path_factory.mktemp("anywhere")
    root, elsewhere = tmp / "checkout", tmp / "elsewhere"
    elsewhere.mkdir()
    data = yaml.safe_load(EXAMPLE.read_text())
    assert data["data_dir"] == ".thaw"
    data["pools"] = []  # a controller that launches nothing
    port = free_port()
    data["controller"] = {"port": port}
    (root / DEFAULT_CONFIG_PATH).parent.mkdir(parents=True)
    (root / DEFAULT_CONFIG_PATH).write_text(yaml.safe_dump(data))
    with controller_process(DEFAULT_CONFIG_PATH, port, root) as url:
        # Its cluster token is in the checkout's .thaw only: a command that resolved the
        # data directory from anywhere else would be refused.
        assert (root / ".thaw" / "cluster-token").exists()
        yield Checkout(root=root, elsewhere=elsewhere, url=url)


def test_commands_run_elsewhere_use_the_running_thaw_up(checkout: Checkout, state_home: Path) -> None:
    alone = thaw("tenants", "ls", cwd=checkout.elsewhere)
    assert alone.returncode == 2, alone.stderr
    assert "no `thaw up` of yours is running" in alone.stderr and "--config FILE or THAW_CONFIG" in alone.stderr
    # `thaw up` in the checkout: what it records, and its endpoint file.
    stack.record(checkout.config, checkout.root, checkout.root / ".thaw")
    with contextlib.chdir(checkout.root):
        cfg = load_config(DEFAULT_CONFIG_PATH)
    write_endpoint_file(cfg, {"base_url": "http://127.0.0.1:8000/v1", "control_url": checkout.url,
                              "pid": os.getpid()})
    try:
        listed = thaw("tenants", "ls", cwd=checkout.elsewhere)
        assert listed.returncode == 0, listed.stderr
        assert "demo" in listed.stdout
        status = thaw("status", "--json", cwd=checkout.elsewhere)
        assert status.returncode == 0, status.stderr
        body = json.loads(status.stdout)
        assert body["endpoint"]["control_url"] == checkout.url
        assert [m["name"] for m in body["models"]] == ["demo"]
    finally:
        endpoint_file(cfg).unlink()
        stack.forget()
    # Stopped: the commands say how to point at a config again.
    assert thaw("tenants", "ls", cwd=checkout.elsewhere).returncode == 2


def test_status_asks_a_named_controller_without_a_local_thaw_up(checkout: Checkout, state_home: Path) -> None:
    assert not endpoint_file(load_config(checkout.config, checkout.root)).exists()
    text = thaw("status", "--controller", checkout.url, cwd=checkout.root)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"controller {checkout.url}\n") and "MODELS" in text.stdout
    assert "demo" in text.stdout
    # Not named: the config's (controller.urls, here its port on loopback).
    assert thaw("status", cwd=checkout.root).stdout.startswith(f"controller {checkout.url}\n")
    nobody = f"http://127.0.0.1:{free_port()}"
    down = thaw("status", "--controller", nobody, cwd=checkout.root)
    assert down.returncode == 3 and f"the controller at {nobody} does not answer" in down.stderr
    # Several, comma-separated: the call goes to the one that answers as leader.
    both = thaw("status", "--json", "--controller", f"{nobody},{checkout.url}",
                cwd=checkout.root)
    assert both.returncode == 0, both.stderr
    body = json.loads(both.stdout)
    assert body["endpoint"]["base_url"] is None and [m["name"] for m in body["models"]] == ["demo"]


def test_store_down_is_refused_while_a_running_thaw_up_uses_the_store(tmp_path: Path, state_home: Path) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["data_dir"] = str(tmp_path / "data")
    data["object_store"]["embedded"]["s3_port"] = free_port()
    config = tmp_path / "thaw.yaml"
    config.write_text(yaml.safe_dump(data))
    stack.record(config, tmp_path, tmp_path / "data")
    try:
        refused = thaw("store", "down", "--config", str(config), cwd=tmp_path)
        assert refused.returncode == 1
        assert f"in use by the running `thaw up` (pid {os.getpid()}" in refused.stderr
        assert "Ctrl-C" in refused.stderr and "--force" in refused.stderr
        # Another data directory's store is not that stack's.
        other = tmp_path / "other.yaml"
        other.write_text(yaml.safe_dump({**data, "data_dir": str(tmp_path / "other")}))
        elsewhere = thaw("store", "down", "--config", str(other), cwd=tmp_path)
        assert elsewhere.returncode == 0 and elsewhere.stdout.strip() == "store was not running"
        forced = thaw("store", "down", "--force", "--config", str(config), cwd=tmp_path)
        assert forced.returncode == 0, forced.stderr
        assert forced.stdout.strip() == "store was not running"
    finally:
        stack.forget()
    # No stack: stopped as before.
    alone = thaw("store", "down", "--config", str(config), cwd=tmp_path)
    assert alone.returncode == 0 and alone.stdout.strip() == "store was not running"
