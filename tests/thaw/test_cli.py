"""The `thaw` command line, run as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.thaw.controller_proc import controller_process
from thaw.config import Model, parse_config
from thaw.embedded_store import free_port
from thaw.engine_class import engine_class_of

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "thaw.yaml"
THAW = [sys.executable, "-m", "thaw.cli.main"]


def thaw(*args: str, cwd: Path | None = None, check: bool = True, timeout: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if k not in ("THAW_CONFIG", "THAW_ADMIN_KEY")}, **(env or {})}
    proc = subprocess.run([*THAW, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"thaw {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def cfg_models(data: dict[str, object]) -> list[Model]:
    return parse_config(data).models


def test_help_lists_every_command_with_a_description() -> None:
    out = thaw("--help").stdout
    for command in ("up", "status", "controller", "activator", "worker", "pool", "config", "store",
                    "demo-model", "push", "bench", "snapshot", "usage", "tenants", "models"):
        line = next((ln for ln in out.splitlines() if ln.strip().startswith(command)), None)
        assert line is not None, f"{command} missing from --help:\n{out}"
    for group, subs in {"config": ("check", "hash-key"), "store": ("up", "down", "status", "ls"),
                        "models": ("deploy", "update", "rollback", "rm", "ls", "show"),
                        "bench": ("cold-start", "stream"), "snapshot": ("build", "ls", "rm"),
                        "tenants": ("create", "rm", "ls", "show", "keys", "limits", "models"),
                        "pool": ("status", "events")}.items():
        sub_out = thaw(group, "--help").stdout
        for s in subs:
            assert any(ln.strip().split()[:1] == [s] for ln in sub_out.splitlines() if ln.strip()), sub_out


def test_version() -> None:
    assert thaw("--version").stdout.strip() == "thaw 0.1.0"


def test_unknown_command_is_usage_error() -> None:
    proc = thaw("frobnicate", check=False)
    assert proc.returncode == 2
    assert "invalid choice: 'frobnicate'" in proc.stderr


def test_push_refuses_bad_uri(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(EXAMPLE.read_text())
    proc = thaw("push", str(tmp_path), "http://x/y", "--config", str(cfg), check=False)
    assert proc.returncode == 2
    assert "is not an s3:// URI" in proc.stderr


@pytest.mark.integration
def test_store_push_ls_and_restart_keeps_data(tmp_path: Path, demo_model_dir: Path) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["data_dir"] = str(tmp_path / "data")
    data["object_store"]["embedded"]["s3_port"] = free_port()
    cfg = tmp_path / "thaw.yaml"
    cfg.write_text(yaml.safe_dump(data))
    c = ("--config", str(cfg))
    try:
        up = json.loads(thaw("store", "up", *c).stdout)
        assert up["endpoint_url"].startswith("http://127.0.0.1:")
        assert json.loads(thaw("store", "status", *c).stdout)["running"] is True

        pushed = thaw("push", str(demo_model_dir), "s3://thaw/models/demo", *c).stdout.splitlines()
        lines = [json.loads(ln) for ln in pushed]
        assert {ln["path"] for ln in lines if ln["event"] == "file_pushed"} >= {"model.safetensors", "config.json"}
        assert lines[-1]["event"] == "pushed" and lines[-1]["uri"] == "s3://thaw/models/demo"

        listed = json.loads(thaw("store", "ls", "--json", *c).stdout)
        assert [(m["uri"], m["status"], m["configured_as"]) for m in listed] == [
            ("s3://thaw/models/demo", "complete", ["demo"])
        ]
        # The engine class, from the config.json in the store and the model's engine settings.
        demo = next(m for m in cfg_models(data) if m.name == "demo")
        expected = engine_class_of(json.loads((demo_model_dir / "config.json").read_text()), demo.engine,
                                   max_model_len=demo.max_context_tokens).id
        assert listed[0]["engine_classes"] == {"demo": expected}
        table = thaw("store", "ls", *c).stdout
        assert "s3://thaw/models/demo" in table and "complete" in table and f"demo ({expected})" in table

        assert thaw("store", "down", *c).stdout.strip() == "store stopped"
        assert thaw("store", "status", *c, check=False).returncode == 3
        assert json.loads(thaw("store", "down", "--json", *c).stdout) == {"stopped": False}

        thaw("store", "up", *c)
        again = json.loads(thaw("store", "ls", "--json", *c).stdout)
        assert again == listed  # restart keeps the data
    finally:
        thaw("store", "down", *c, check=False)
    assert thaw("store", "status", *c, check=False).returncode == 3


def test_models_ls_without_store_says_so(tmp_path: Path) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["data_dir"] = str(tmp_path / "data")
    cfg = tmp_path / "thaw.yaml"
    cfg.write_text(yaml.safe_dump(data))
    proc = thaw("store", "ls", "--config", str(cfg), check=False)
    assert proc.returncode == 3
    assert "start the store first (`thaw store up`)" in proc.stderr


def test_tenants_commands_keep_keys_at_the_controller(tmp_path: Path) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["data_dir"] = str(tmp_path / "data")
    data["pools"] = []  # a controller that launches nothing
    port = free_port()
    data["controller"] = {"port": port}
    cfg = tmp_path / "thaw.yaml"
    cfg.write_text(yaml.safe_dump(data))
    c = ("--config", str(cfg))
    down = thaw("tenants", "ls", *c, check=False)
    assert down.returncode == 3 and "does not answer" in down.stderr
    with controller_process(cfg, port, tmp_path):
        key = thaw("tenants", "keys", "add", "demo", "--label", "ci", *c).stdout.strip()
        assert key.startswith("thaw-")
        listed = thaw("tenants", "ls", *c).stdout
        assert key[:9] in listed and "active" in listed and "ci" in listed and key not in listed
        assert "revoked 1 key" in thaw("tenants", "keys", "revoke", key, *c).stdout
        assert "revoked" in thaw("tenants", "ls", *c).stdout
        bad = thaw("tenants", "keys", "add", "nobody", *c, check=False)
        assert bad.returncode == 2 and "no tenant 'nobody'" in bad.stderr
        again = thaw("tenants", "keys", "revoke", key, *c, check=False)
        assert again.returncode == 2 and "no such active key" in again.stderr
        # Tenants at run time: made, limited, given models and a key, removed with it.
        made = thaw("tenants", "create", "beta", "--allowed-models", "demo", "--requests-per-minute", "60",
                    *c).stdout
        assert "created tenant beta (models demo; limits requests-per-minute 60)" in made
        assert "requests-per-minute 120, tokens-per-minute 5000" in thaw(
            "tenants", "limits", "set", "beta", "--requests-per-minute", "120", "--tokens-per-minute", "5000",
            *c).stdout
        assert "models *" in thaw("tenants", "models", "set", "beta", "*", *c).stdout
        assert "no key" in thaw("tenants", "ls", *c).stdout
        beta_key = thaw("tenants", "keys", "add", "beta", *c).stdout.strip()
        assert beta_key[:9] in thaw("tenants", "ls", *c).stdout
        unknown = thaw("tenants", "models", "set", "beta", "nope", *c, check=False)
        assert unknown.returncode == 2 and "no models ['nope'] are deployed" in unknown.stderr
        assert "removed tenant beta" in thaw("tenants", "rm", "beta", *c).stdout
        assert "beta" not in thaw("tenants", "ls", *c).stdout
        assert thaw("tenants", "rm", "beta", *c, check=False).returncode == 2
        # Declared in a file: the plan first, then all of it.
        declared = tmp_path / "tenants.yaml"
        declared.write_text(yaml.safe_dump({"tenants": [
            {"name": "demo", "api_key_hashes": data["tenants"][0]["api_key_hashes"]},
            {"name": "gamma", "limits": {"requests_per_minute": 30}}]}))
        dry = thaw("apply", "-f", str(declared), "--dry-run", *c).stdout
        assert "+ tenant gamma (create)" in dry and "~ tenant demo (change)" in dry and "dry run" in dry
        assert "gamma" not in thaw("tenants", "ls", *c).stdout
        assert "applied: 2 change(s)" in thaw("apply", "-f", str(declared), *c).stdout
        assert "gamma" in thaw("tenants", "ls", *c).stdout
        assert "nothing to change" in thaw("apply", "-f", str(declared), *c).stdout
        # An admin key: the tenant and model commands without the cluster token.
        admin = thaw("admin-keys", "add", "--label", "ci", *c).stdout.strip()
        assert admin.startswith("thawadmin-") and admin[:14] in thaw("admin-keys", "ls", *c).stdout
        with_key = {"THAW_ADMIN_KEY": admin}
        assert "created tenant delta" in thaw("tenants", "create", "delta", *c, env=with_key).stdout
        refused = thaw("tenants", "keys", "add", "delta", *c, env=with_key, check=False)  # keys: the cluster token's
        assert refused.returncode == 1 and "refused the admin key in THAW_ADMIN_KEY" in refused.stderr
        assert "revoked 1 admin key" in thaw("admin-keys", "revoke", admin, *c).stdout
        assert thaw("tenants", "ls", *c, env=with_key, check=False).returncode == 1
    assert (tmp_path / "data" / "controller" / "keys.db").exists()


def test_usage_command(tmp_path: Path) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["data_dir"] = str(tmp_path / "data")
    cfg = tmp_path / "thaw.yaml"
    cfg.write_text(yaml.safe_dump(data))
    c = ("--config", str(cfg))
    # No store (the embedded one is not up) and no activator ledger here: nothing to read.
    nothing = thaw("usage", *c, check=False)
    assert nothing.returncode == 3 and "no activator ledger under" in nothing.stderr
    # An activator's ledger on this machine: answered from it, saying the store was not read.
    import asyncio

    from activator.ledger import Ledger
    from tests.activator.support import record
    from thaw.config import load_config

    async def one_record() -> None:
        ledger = Ledger(load_config(cfg).ledger_path_for("a"))
        await ledger.append(record(1, "demo"))
        ledger.close()

    asyncio.run(one_record())
    window = thaw("usage", "--since", "1h", *c).stdout
    assert "no usage in that window" in window and "incomplete: the object store is not available" in window
    answer = json.loads(thaw("usage", "--format", "json", *c).stdout)
    assert json.loads(thaw("usage", "--json", *c).stdout)["tenants"] == answer["tenants"]  # the same
    assert answer["tenants"]["demo"]["requests"] == 1 and answer["complete"] is False
    assert answer["tenants"]["demo"]["models"]["demo"]["requests"] == 1
    # No controller to ask for prices: no cost, and said so.
    assert answer["tenants"]["demo"]["models"]["demo"]["cost_usd"] is None and "no costs" in answer["prices_note"]
    assert answer["records"][0]["activator"] == "a"
    assert thaw("usage", "--since", "yesterday", *c, check=False).returncode == 2


def test_up_refuses_an_ec2_pool_naming_the_field(tmp_path: Path) -> None:
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg["data_dir"] = str(tmp_path / "data")
    cfg["controller"] = {"url": "http://controller.internal:8100"}
    cfg["pools"][0].update({"provider": "ec2", "ec2": {
        "region": "us-east-1", "launch_template": "thaw-worker", "subnets": ["subnet-1"],
        "instance_types": ["g6e.xlarge"]}})
    path = tmp_path / "thaw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = thaw("up", "--config", str(path), check=False, timeout=60)
    assert out.returncode == 2
    assert "pools[0].provider" in out.stderr and "thaw controller" in out.stderr
    assert not (tmp_path / "data" / "store").exists()  # refused before starting anything


def test_pool_status_without_a_controller_says_so(tmp_path: Path) -> None:
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg["data_dir"] = str(tmp_path / "data")
    cfg["controller"] = {"port": free_port()}
    path = tmp_path / "thaw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = thaw("pool", "status", "--config", str(path), check=False, timeout=60)
    assert out.returncode == 3 and "does not answer" in out.stderr
