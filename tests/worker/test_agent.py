"""The worker agent as a real process: real engine hosts, vLLM on the CPU, the SeaweedFS store.

One agent process serves the whole module; the tests run in file order and each
leaves it in standby (the last one stops it). Times are printed (`pytest -s`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from openai import DefaultHttpxClient, OpenAI

from tests.waiting import wait_until
from tests.worker.agent_process import STANDBY_TIMEOUT_S, Agent, alive, running_agent
from thaw.embedded_store import free_port
from thaw.objstore import S3Endpoint
from weight_streaming.push import push_model

pytestmark = [pytest.mark.integration, pytest.mark.engine]

LOAD_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, s3: S3Endpoint) -> Iterator[Agent]:
    with running_agent(tmp_path_factory.mktemp("agent"), "it-1", s3) as a:
        yield a


def _assign_body(s3: S3Endpoint, uri: str, assignment_id: str) -> dict[str, Any]:
    # No store credentials: the worker has its own (see agent_process.running_agent).
    return {"assignment_id": assignment_id, "model": "demo", "uri": uri, "served_model_name": "thaw-demo",
            "max_model_len": 512, "engine": {"enforce_eager": True, "cpu_kvcache_gib": 1}}


@pytest.fixture(scope="module")
def demo_uri(s3: S3Endpoint, demo_model_dir: Path) -> str:
    uri = f"s3://thaw-test/tests/worker-agent-{os.getpid()}-{free_port()}/demo"
    push_model(s3.client(), demo_model_dir, uri)
    return uri


def _assign_until(agent: Agent, body: dict[str, Any], *states: str, timeout_s: float) -> tuple[dict, list, float]:
    t0 = time.monotonic()
    with agent.http() as c:
        r = c.post("/assign", json=body)
    assert r.status_code == 202, r.text
    assert r.json()["state"] == "loading" and r.json()["assignment_id"] == body["assignment_id"]
    state, seen = agent.wait_state(*states, timeout_s=timeout_s)
    return state, seen, time.monotonic() - t0


def _release(agent: Agent, assignment_id: str | None) -> tuple[int, dict[str, Any]]:
    with agent.http() as c:
        r = c.post("/release", json={"assignment_id": assignment_id, "drain_timeout_s": 10})
    return r.status_code, r.json()


def test_agent_reaches_standby(agent: Agent) -> None:
    body, seen = agent.wait_state("standby", timeout_s=STANDBY_TIMEOUT_S)
    agent.times["standby_s"] = time.monotonic() - agent.started_at
    print(f"\nagent start -> standby: {agent.times['standby_s']:.1f} s (states {seen})")
    assert body["worker_id"] == "it-1" and body["shape"] == "cpu-small"
    assert body["model"] is None and body["engine_url"] is None and body["error"] is None
    assert set(body["phases"].values()) == {None}
    with agent.http() as c:
        assert c.get("/healthz").json() == {"ok": True}
        assert 'thaw_worker_state{state="standby"} 1.0' in c.get("/metrics").text
    agent.record_descendants()
    # The engine host stands by in its own process group, with vLLM's forkserver.
    names = [" ".join(psutil.Process(pid).cmdline()) for pid, _ in agent.descendants]
    assert any("worker.engine_host" in n for n in names), names
    assert any("forkserver" in n for n in names), names


def test_missing_model_fails_at_once(agent: Agent, s3: S3Endpoint) -> None:
    uri = f"s3://thaw-test/tests/no-such-model-{free_port()}"
    body, seen, dt = _assign_until(agent, _assign_body(s3, uri, "missing-1"), "failed", timeout_s=30)
    print(f"\nmissing model -> failed in {dt:.2f} s")
    assert dt < 10
    assert body["error"].startswith(f"no model at {uri}") and "thaw-manifest.json" in body["error"]
    assert body["assignment_id"] == "missing-1"
    with agent.http() as c:
        assert c.get("/healthz").status_code == 200
        r = c.post("/assign", json=_assign_body(s3, uri, "missing-2"))
        assert r.status_code == 409 and r.json()["state"] == "failed"
    code, _ = _release(agent, "missing-1")
    assert code == 202
    # Nothing was launched, so the same engine host stands by at once.
    t0 = time.monotonic()
    agent.wait_state("standby", timeout_s=5)
    assert time.monotonic() - t0 < 2


def test_engine_crash_during_load_fails_with_the_engine_reason(
    agent: Agent, s3: S3Endpoint, demo_model_dir: Path, tmp_path: Path, s3_prefix: str
) -> None:
    # Weights for intermediate_size 1024 under a config that says 2048: push accepts
    # it (headers are valid), vLLM fails while loading the MLP weights.
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in demo_model_dir.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((bad / "config.json").read_text())
    assert cfg["intermediate_size"] == 1024
    cfg["intermediate_size"] = 2048
    (bad / "config.json").write_text(json.dumps(cfg))
    push_model(s3.client(), bad, s3_prefix)

    body, seen, dt = _assign_until(agent, _assign_body(s3, s3_prefix, "bad-1"), "failed", timeout_s=LOAD_TIMEOUT_S)
    print(f"\nbroken model -> failed in {dt:.2f} s: {body['error']}")
    assert seen[0] == "loading"
    assert body["error"].startswith("engine failed to start: ")
    assert "2048" in body["error"] and "1024" in body["error"]  # the mismatch, from vLLM itself
    assert body["phases"]["engine_ready"] is None
    with agent.http() as c:
        assert c.get("/healthz").status_code == 200
    code, _ = _release(agent, None)
    assert code == 202
    t0 = time.monotonic()
    agent.wait_state("standby", timeout_s=STANDBY_TIMEOUT_S)
    print(f"release after failure -> standby: {time.monotonic() - t0:.1f} s")


def _check_serving(body: dict[str, Any]) -> None:
    # trust_env=False: no proxy from the environment between us and loopback.
    http_client = DefaultHttpxClient(trust_env=False, timeout=60)
    client = OpenAI(base_url=body["engine_url"] + "/v1", api_key="unused", http_client=http_client)
    try:
        out = client.chat.completions.create(
            model=body["served_model_name"], max_tokens=5,
            messages=[{"role": "user", "content": "Hello, who are you?"}],
        )
        assert out.choices[0].finish_reason in ("length", "stop")
        assert 1 <= out.usage.completion_tokens <= 5  # type: ignore[union-attr]
        chunks = list(client.chat.completions.create(
            model=body["served_model_name"], max_tokens=5, stream=True,
            messages=[{"role": "user", "content": "Hello again"}],
        ))
        assert len(chunks) >= 2
        assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    finally:
        http_client.close()


def _check_phases(body: dict[str, Any]) -> dict[str, float]:
    p = body["phases"]
    order = ["assigned", "snapshot_restored", "weights_loaded", "engine_ready"]
    assert all(isinstance(p[k], float) for k in order), p
    assert [p[k] for k in order] == sorted(p[k] for k in order), p
    return {f"{a}->{b}": round(p[b] - p[a], 2) for a, b in zip(order, order[1:], strict=False)}


def test_assign_serves_the_model(agent: Agent, s3: S3Endpoint, demo_uri: str) -> None:
    body, seen, dt = _assign_until(agent, _assign_body(s3, demo_uri, "demo-1"), "ready", "failed",
                                   timeout_s=LOAD_TIMEOUT_S)
    assert body["state"] == "ready", body["error"]
    agent.times["load1_s"] = dt
    print(f"\nassign -> ready (1st): {dt:.2f} s, phases {_check_phases(body)}")
    assert seen[0] == "loading"
    assert body["model"] == "demo" and body["served_model_name"] == "thaw-demo"
    assert body["engine_url"].startswith("http://127.0.0.1:")
    assert body["error"] is None
    _check_serving(body)
    agent.record_descendants()
    with agent.http() as c:
        assert "thaw_worker_engine_start_seconds_count 1.0" in c.get("/metrics").text
        # in_flight is sampled from the engine every second: wait for a fresh reading.
        wait_until("a reading of nothing in flight", lambda: c.get("/state").json()["in_flight"] == 0, 15, 0.2)


def test_release_then_assign_again(agent: Agent, s3: S3Endpoint, demo_uri: str) -> None:
    old_url = agent.state()["engine_url"]
    with agent.http() as c:
        r = c.post("/release", json={"assignment_id": "someone-else"})
        assert r.status_code == 409 and r.json()["state"] == "ready"
    t0 = time.monotonic()
    code, body = _release(agent, "demo-1")
    assert code == 202 and body["state"] == "draining"
    body, seen = agent.wait_state("standby", timeout_s=STANDBY_TIMEOUT_S)
    release_s = time.monotonic() - t0
    print(f"\nrelease -> standby: {release_s:.1f} s (states {seen})")
    assert body["model"] is None and body["engine_url"] is None
    with pytest.raises(httpx.TransportError):
        httpx.get(old_url + "/health", timeout=2, trust_env=False)

    body, _, dt = _assign_until(agent, _assign_body(s3, demo_uri, "demo-2"), "ready", "failed",
                                timeout_s=LOAD_TIMEOUT_S)
    assert body["state"] == "ready", body["error"]
    agent.times["load2_s"] = dt
    print(f"assign -> ready (2nd): {dt:.2f} s, phases {_check_phases(body)}; "
          f"agent start -> standby was {agent.times['standby_s']:.1f} s")
    _check_serving(body)
    # Neither load paid vLLM's imports: those happen before standby.
    assert agent.times["load1_s"] < agent.times["standby_s"]
    assert dt < agent.times["standby_s"]


def test_sigterm_stops_the_agent_and_everything_it_started(agent: Agent) -> None:
    assert agent.state()["state"] == "ready"  # an engine core is running: the hard case
    agent.record_descendants()
    assert len(agent.descendants) >= 4  # engine hosts, forkservers, resource trackers, engine cores
    t0 = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    code = agent.proc.wait(30)
    dt = time.monotonic() - t0
    print(f"\nSIGTERM -> agent exited in {dt:.1f} s (status {code})")
    assert code == 0, agent.log_tail()
    assert dt < 20
    _wait_all_gone(agent.descendants, 5)


def _wait_all_gone(descendants: set[tuple[int, float]], timeout_s: float) -> None:
    def left() -> list[tuple[int, float]]:
        return [d for d in descendants if alive(*d)]

    def named() -> str:
        out = []
        for pid, _ in left():
            with contextlib.suppress(psutil.Error):
                out.append(psutil.Process(pid).cmdline())
        return str(out)

    wait_until("everything the agent started gone", lambda: not left(), timeout_s, 0.1, detail=named)


def test_sigkill_of_the_agent_takes_its_engine_along(
    tmp_path: Path, s3: S3Endpoint, demo_uri: str
) -> None:
    # No graceful shutdown at all: the engine host dies with its parent (PDEATHSIG),
    # vLLM's forkserver with the engine host, the engine core with the forkserver.
    with running_agent(tmp_path, "it-kill", s3) as a:
        a.wait_state("standby", timeout_s=STANDBY_TIMEOUT_S)
        body, _, _ = _assign_until(a, _assign_body(s3, demo_uri, "k-1"), "ready", "failed",
                                   timeout_s=LOAD_TIMEOUT_S)
        assert body["state"] == "ready", body["error"]
        a.record_descendants()
        assert len(a.descendants) >= 3
        a.proc.kill()
        a.proc.wait(10)
        _wait_all_gone(a.descendants, 20)
