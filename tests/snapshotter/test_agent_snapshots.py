"""How the worker agent uses snapshots, with a fake engine host and fake snapshot I/O.

Fast: no process, no store. The real thing is in tests/worker/test_snapshots.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from snapshotter.fingerprint import Fingerprint
from snapshotter.ops import CaptureResult, CaptureStatus, RestoreResult, RestoreStatus
from snapshotter.store import SnapshotLocation
from tests.snapshotter.support import RUNTIME
from tests.waiting import until
from tests.worker.fakes import FakeEngine, FakeHost, World, assign_body, wait_state
from thaw.objstore import S3Endpoint
from weight_streaming.manifest import FileEntry, Manifest
from worker.api import create_app
from worker.host import OnEvent
from worker.launch import LaunchCommand
from worker.settings import AgentSettings

MANIFEST = Manifest(uri="s3://thaw/models/demo", created_at=datetime(2026, 1, 1, tzinfo=UTC),
                    files=[FileEntry(path="config.json", size=10, sha256="c" * 64, etag="e")],
                    safetensors={}, parameter_count=0, total_bytes=10)

STORE = S3Endpoint("http://127.0.0.1:9", "AK", "SK")


@dataclass
class FakeSnapshots:
    """Scripted snapshot I/O; records what the agent asked for."""

    restore_result: RestoreResult = field(default_factory=lambda: RestoreResult(RestoreStatus.MISSING, "none"))
    restore_delay_s: float = 0.0
    restore_error: Exception | None = None
    capture_result: CaptureResult = field(default_factory=lambda: CaptureResult(CaptureStatus.UPLOADED, bytes=9))
    # Whether the fake engine compiles a kernel during its start (False: all cached).
    engine_compiles: bool = True
    restores: list[tuple[SnapshotLocation, Fingerprint, Path, threading.Event]] = field(default_factory=list)
    captures: list[dict[str, Any]] = field(default_factory=list)

    def runtime(self, python: str) -> dict[str, Any]:
        return RUNTIME

    def restore(self, store: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, cache_root: Path,
                work_dir: Path, cancelled: threading.Event) -> RestoreResult:
        self.restores.append((loc, fp, cache_root, cancelled))
        time.sleep(self.restore_delay_s)
        if self.restore_error:
            raise self.restore_error
        return self.restore_result

    def capture(self, store: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, cache_root: Path,
                work_dir: Path, *, created_by: str, replace: bool) -> CaptureResult:
        self.captures.append({"loc": loc, "fp": fp, "cache_root": cache_root, "created_by": created_by,
                              "replace": replace})
        return self.capture_result


class CompilingHost(FakeHost):
    """A fake engine host whose engine writes one compiled kernel into inductor's cache."""

    def __init__(self, world: World, on_event: OnEvent, snaps: FakeSnapshots) -> None:
        super().__init__(world, on_event)
        self.snaps = snaps

    async def launch(self, cmd: LaunchCommand) -> None:
        if self.snaps.engine_compiles:
            kernel = Path(cmd.env["TORCHINDUCTOR_CACHE_DIR"]) / "ab" / "kernel.so"
            kernel.parent.mkdir(parents=True, exist_ok=True)
            kernel.write_bytes(b"\x7fELF")
        await super().launch(cmd)


@pytest.fixture
def snaps() -> FakeSnapshots:
    return FakeSnapshots()


@pytest.fixture
async def client(snaps: FakeSnapshots, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, World]]:
    world = World(manifest=lambda store, uri: MANIFEST)

    async def spawn(on_event: OnEvent) -> FakeHost:
        h = CompilingHost(world, on_event, snaps)
        world.hosts.append(h)
        asyncio.get_running_loop().call_later(0.01, h.emit, "imported")
        return h

    settings = AgentSettings(worker_id="w1", shape="cpu-small", port=0, data_dir=tmp_path, store=STORE, ready_poll_s=0.01,
                             in_flight_poll_s=0.01, drain_poll_s=0.01, snapshot_restore_timeout_s=0.5)
    app = create_app(settings, spawn_host=spawn, engine_client=lambda url: FakeEngine(world, url),
                     manifest_reader=world.manifest, snapshots=snaps)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as c:
            yield c, world


def compiled(**over: Any) -> dict[str, Any]:
    return assign_body(engine={"enforce_eager": False, "cpu_kvcache_gib": 2}, **over)


async def ready_with(c: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    await wait_state(c, "standby")
    r = await c.post("/assign", json=body)
    assert r.status_code == 202, r.text
    return await wait_state(c, "ready", "failed")


async def settled(c: httpx.AsyncClient, done: Any) -> dict[str, Any]:
    """/state once ``done(snapshot)`` holds (the after-ready work runs in the background)."""
    last: list[dict[str, Any]] = [{}]

    async def holds() -> bool:
        last[0] = (await c.get("/state")).json()["snapshot"]
        return bool(done(last[0]))

    await until("the snapshot settled", holds, 5, interval_s=0.01, detail=lambda: str(last[0]))
    return last[0]


async def test_missing_snapshot_then_the_engine_compiles_and_the_worker_captures(
    client: tuple[httpx.AsyncClient, World], snaps: FakeSnapshots, tmp_path: Path
) -> None:
    c, world = client
    body = await ready_with(c, compiled())
    assert body["state"] == "ready"
    (loc, fp, cache_root, _), = snaps.restores
    assert loc == SnapshotLocation("thaw", "demo", fp.id)  # the model's bucket, its name
    assert fp.inputs["model_config_sha256"] == "c" * 64 and fp.inputs["enforce_eager"] is False
    assert fp.inputs["max_model_len"] == 512 and fp.inputs["engine_assets_dir"] == "/tmp/thaw-vllm-assets"
    # The engine runs with that cache root and the shared assets dir.
    cmd = world.hosts[0].launches[0]
    assert cmd.env["VLLM_CACHE_ROOT"] == str(cache_root) == str(tmp_path / "vllm-cache" / "models" / "demo")
    assert cmd.env["VLLM_ASSETS_CACHE"] == "/tmp/thaw-vllm-assets"
    assert cmd.env["TORCHINDUCTOR_CACHE_DIR"] == str(cache_root / "torchinductor")
    assert "--enforce-eager" not in cmd.model_dump_json()
    p = body["phases"]
    assert p["assigned"] <= p["snapshot_restored"] <= p["weights_loaded"] <= p["engine_ready"]

    snap = await settled(c, lambda s: s["capture"] not in (None, "running"))
    assert snap == {"fingerprint": fp.id, "status": "missing", "seconds": snap["seconds"], "bytes": None,
                    "reason": "none", "compiled_kernels": 1, "capture": "uploaded"}
    (cap,) = snaps.captures
    assert cap["replace"] is False and cap["created_by"] == "w1" and cap["cache_root"] == cache_root


@pytest.mark.parametrize(
    ("status", "engine_compiles", "captures", "replace"),
    [
        (RestoreStatus.RESTORED, False, 0, None),
        # Restored, yet compiled: the snapshot did not serve this engine; replace it.
        (RestoreStatus.RESTORED, True, 1, True),
        (RestoreStatus.LOCAL, True, 0, None),
        (RestoreStatus.SKIPPED_ERROR, True, 0, None),  # the store is unwell: do not add to its load
        (RestoreStatus.SKIPPED_CORRUPT, True, 1, True),  # replaces the broken one
        (RestoreStatus.SKIPPED_MISMATCH, True, 1, True),
    ],
)
async def test_what_follows_each_restore_status(
    client: tuple[httpx.AsyncClient, World], snaps: FakeSnapshots, status: RestoreStatus,
    engine_compiles: bool, captures: int, replace: bool | None,
) -> None:
    c, _ = client
    snaps.engine_compiles = engine_compiles
    snaps.restore_result = RestoreResult(status, "why", bytes=5 if status is RestoreStatus.RESTORED else None)
    body = await ready_with(c, compiled())
    assert body["state"] == "ready" and body["snapshot"]["status"] == status.value
    snap = await settled(c, lambda s: s["compiled_kernels"] is not None
                         and (captures == 0 or s["capture"] not in (None, "running")))
    assert snap["compiled_kernels"] == int(engine_compiles)
    assert len(snaps.captures) == captures
    if captures:
        assert snaps.captures[0]["replace"] is replace and snap["capture"] == "uploaded"
    else:
        assert snap["capture"] is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (assign_body(), "eager mode"),
        (compiled(snapshots=False), "off for this model"),
        (assign_body(engine={"enforce_eager": False, "snapshots": False}), "off for this model"),
    ],
    ids=["eager", "off-for-assignment", "off-in-model-config"],
)
async def test_disabled_snapshots_touch_nothing(
    client: tuple[httpx.AsyncClient, World], snaps: FakeSnapshots, body: dict[str, Any], reason: str
) -> None:
    c, _ = client
    state = await ready_with(c, body)
    assert state["state"] == "ready"
    assert state["snapshot"]["status"] == "disabled" and reason in state["snapshot"]["reason"]
    assert state["snapshot"]["fingerprint"] is None
    assert state["phases"]["assigned"] <= state["phases"]["snapshot_restored"] <= state["phases"]["engine_ready"]
    await asyncio.sleep(0.05)  # quiet: nothing restores or captures later either
    assert snaps.restores == [] and snaps.captures == []


async def test_a_store_error_is_skipped_and_the_engine_starts(
    client: tuple[httpx.AsyncClient, World], snaps: FakeSnapshots
) -> None:
    c, _ = client
    snaps.restore_error = ConnectionError("store is down")
    body = await ready_with(c, compiled())
    assert body["state"] == "ready" and body["error"] is None
    assert body["snapshot"]["status"] == "skipped_error" and "store is down" in body["snapshot"]["reason"]


async def test_a_slow_restore_is_abandoned_and_told_to_stop(
    client: tuple[httpx.AsyncClient, World], snaps: FakeSnapshots
) -> None:
    c, _ = client
    snaps.restore_delay_s = 1.5  # the timeout is 0.5 s
    body = await ready_with(c, compiled())
    assert body["state"] == "ready"
    assert body["snapshot"]["status"] == "skipped_error" and "longer than 0.5 s" in body["snapshot"]["reason"]
    (_, _, _, cancelled), = snaps.restores
    assert cancelled.is_set()
    p = body["phases"]
    # Abandoned at the timeout, not waited for (the restore was cancelled, above): no upper
    # bound on the clock, which a loaded machine stretches.
    assert p["snapshot_restored"] - p["assigned"] >= 0.4


async def test_the_restore_is_timed_and_ends_its_phase(
    client: tuple[httpx.AsyncClient, World], snaps: FakeSnapshots
) -> None:
    c, _ = client
    snaps.restore_delay_s = 0.3
    snaps.restore_result = RestoreResult(RestoreStatus.RESTORED, bytes=1234, files=3)
    await wait_state(c, "standby")
    assert (await c.post("/assign", json=compiled())).status_code == 202
    during = await settled(c, lambda s: s is not None and s["status"] == "restoring")
    assert during["fingerprint"] and during["seconds"] is None
    assert (await c.get("/state")).json()["phases"]["snapshot_restored"] is None
    body = await wait_state(c, "ready")
    snap, p = body["snapshot"], body["phases"]
    assert snap["status"] == "restored" and snap["bytes"] == 1234 and snap["seconds"] >= 0.3
    assert p["snapshot_restored"] - p["assigned"] >= 0.3


async def test_a_manifest_without_config_json_is_skipped(tmp_path: Path, snaps: FakeSnapshots) -> None:
    world = World(manifest=lambda store, uri: MANIFEST.model_copy(update={"files": []}))

    async def spawn(on_event: OnEvent) -> FakeHost:
        h = FakeHost(world, on_event)
        world.hosts.append(h)
        asyncio.get_running_loop().call_later(0.01, h.emit, "imported")
        return h

    settings = AgentSettings(worker_id="w1", shape="cpu-small", port=0, data_dir=tmp_path, store=STORE, ready_poll_s=0.01)
    app = create_app(settings, spawn_host=spawn, engine_client=lambda url: FakeEngine(world, url),
                     manifest_reader=world.manifest, snapshots=snaps)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as c:
            body = await ready_with(c, compiled())
            assert body["state"] == "ready"
            assert body["snapshot"]["status"] == "skipped_error"
            assert "lists no config.json" in body["snapshot"]["reason"]
            assert snaps.restores == []
            # A release clears it with the assignment.
            r = await c.post("/release", json={"assignment_id": "a1", "drain_timeout_s": 1})
            assert r.status_code == 202
            assert (await wait_state(c, "standby"))["snapshot"] is None
