"""`thaw snapshot build|ls|rm` as a real process, against the real store (no engine started)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from snapshotter.fingerprint import fingerprint_inputs, fingerprint_of
from snapshotter.ops import CaptureStatus, capture_snapshot
from snapshotter.runtime import detect
from snapshotter.store import SnapshotLocation, read_snapshot_manifest
from tests.snapshotter.support import make_cache
from thaw.config import EngineArgs
from thaw.embedded_store import free_port
from thaw.objstore import S3Endpoint
from weight_streaming.push import push_model
from worker.settings import ENGINE_ASSETS_DIR

THAW = [sys.executable, "-m", "thaw.cli.main", "snapshot"]


def write_config(path: Path, *, endpoint_url: str, model_uri: str, model: str) -> Path:
    cfg = {
        "data_dir": str(path.parent / "data"),
        "object_store": {"kind": "s3", "endpoint_url": endpoint_url, "bucket": "thaw-test",
                         "credentials": {"source": "env", "access_key_env": "SNAP_AK",
                                         "secret_key_env": "SNAP_SK"}},
        "shapes": [{"name": "cpu", "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8,
                    "price_per_hour_usd": 0}],
        "models": [
            {"name": model, "uri": model_uri, "shape": "cpu", "max_context_tokens": 512,
             "engine": {"enforce_eager": False}},
            {"name": f"{model}-eager", "uri": model_uri, "shape": "cpu", "engine": {"enforce_eager": True}},
        ],
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def snapshot(*args: str, s3: S3Endpoint | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "THAW_CONFIG"}
    if s3 is not None:
        env.update(SNAP_AK=s3.access_key, SNAP_SK=s3.secret_key)
    return subprocess.run([*THAW, *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture
def offline_config(tmp_path: Path) -> Path:
    # Nothing listens on this port.
    return write_config(tmp_path / "c.yaml", endpoint_url=f"http://127.0.0.1:{free_port()}",
                        model_uri="s3://thaw-test/models/demo", model="demo")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["build", "nope"], 2, "unknown model 'nope'; the config declares: demo, demo-eager"),
        (["build", "demo-eager"], 2, "runs in eager mode (engine.enforce_eager: true)"),
        (["ls", "nope"], 2, "unknown model 'nope'"),
        (["rm", "nope", "--all"], 2, "unknown model 'nope'"),
        (["rm", "demo"], 2, "name one FINGERPRINT or pass --all"),
        (["rm", "demo", "0123456789abcdef", "--all"], 2, "name one FINGERPRINT or pass --all"),
    ],
)
def test_bad_input_exits_2_before_touching_the_store(
    offline_config: Path, args: list[str], code: int, message: str
) -> None:
    proc = snapshot(*args, "--config", str(offline_config))
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.startswith("thaw: error: ") and message in proc.stderr, proc.stderr


@pytest.mark.parametrize("args", [["ls"], ["build", "demo"], ["rm", "demo", "--all"]])
def test_an_unreachable_store_exits_3(offline_config: Path, args: list[str]) -> None:
    proc = snapshot(*args, "--config", str(offline_config), s3=S3Endpoint(None, "ak", "sk"))
    assert proc.returncode == 3, proc.stderr
    assert "cannot reach the store" in proc.stderr


def test_missing_credentials_exit_3(offline_config: Path) -> None:
    proc = snapshot("ls", "--config", str(offline_config))
    assert proc.returncode == 3 and "set SNAP_AK and SNAP_SK" in proc.stderr


def test_a_bad_config_exits_2(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("shapes: []\n")
    proc = snapshot("ls", "--config", str(tmp_path / "bad.yaml"))
    assert proc.returncode == 2 and "shapes" in proc.stderr


@pytest.mark.integration
def test_build_ls_rm_against_the_store(
    tmp_path: Path, s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str
) -> None:
    model = f"cli{free_port()}"
    cfg = write_config(tmp_path / "c.yaml", endpoint_url=str(s3.endpoint_url), model_uri=s3_prefix, model=model)
    proc = snapshot("build", model, "--config", str(cfg), s3=s3)
    assert proc.returncode == 1 and "no model at" in proc.stderr and "thaw push" in proc.stderr
    manifest = push_model(s3.client(), demo_model_dir, s3_prefix)

    # The snapshot a worker here would capture for this model: same fingerprint as the CLI's.
    config_sha = next(f.sha256 for f in manifest.files if f.path == "config.json")
    fp = fingerprint_of(fingerprint_inputs(
        runtime=detect(), model_uri=s3_prefix, model_config_sha256=config_sha,
        engine=EngineArgs(enforce_eager=False), max_model_len=512, engine_assets_dir=str(ENGINE_ASSETS_DIR),
    ))
    loc = SnapshotLocation.for_model(s3_prefix, model, fp.id)
    make_cache(tmp_path / "cache")
    assert capture_snapshot(s3.client(), loc, fp, tmp_path / "cache", tmp_path / "work", created_by="w9",
                            replace=False).status is CaptureStatus.UPLOADED

    # It exists: build says so, starts no engine.
    proc = snapshot("build", model, "--config", str(cfg), "--json", s3=s3)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    assert out["result"] == "exists" and out["fingerprint"] == fp.id and out["uri"] == loc.uri

    proc = snapshot("ls", model, "--config", str(cfg), "--json", s3=s3)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["model"] == model and row["fingerprint"] == fp.id and row["status"] == "complete"
    assert row["created_by"] == "w9" and row["vllm"].endswith("0.32.0") and row["max_model_len"] == 512
    table = snapshot("ls", "--config", str(cfg), s3=s3).stdout
    assert fp.id in table and model in table and "FINGERPRINT" in table

    proc = snapshot("rm", model, "ffffffffffffffff", "--config", str(cfg), s3=s3)
    assert proc.returncode == 2 and f"it has: {fp.id}" in proc.stderr
    proc = snapshot("rm", model, fp.id, "--config", str(cfg), s3=s3)
    assert proc.returncode == 0 and f"removed {loc.uri}" in proc.stdout
    assert read_snapshot_manifest(s3.client(), loc) is None
    assert "no snapshots of" in snapshot("ls", model, "--config", str(cfg), s3=s3).stdout
