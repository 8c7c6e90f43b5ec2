"""Several engines on one worker, end to end: `thaw up` with a pool of one instance that
packs. The demo model takes the standby; a second model (another seed) arrives while
demo serves and is packed into the same worker's free room, with real vLLM engines on
the CPU, through the activator, with the official openai client. The packed engine idles
out alone while demo keeps serving; a crash of its engine leaves demo serving, and it is
placed again."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import psutil
import pytest

from tests.e2e_stack import Stack, push_demo, running_stack
from thaw.auth import bearer
from thaw.embedded_store import EmbeddedStore
from thaw.objstore import S3Endpoint

pytestmark = [pytest.mark.integration, pytest.mark.engine]

PACKED_IDLE_GRACE_S = 4


def model(st: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in st["models"] if m["name"] == name)


def engines_of(st: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The ready workers (instances or packed engines) serving ``name``, with their details."""
    details = {d["id"]: d for d in st["worker_details"]}
    return [{**w, **details[w["id"]]} for w in st["workers"] if w["model"] == name and w["state"] == "ready"]


def ask(stack: Stack, name: str) -> str:
    out = stack.client().chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=4, temperature=0)
    return out.choices[0].message.content or ""


def ask_replica(stack: Stack, name: str) -> tuple[str, str]:
    """Like :func:`ask`, with the replica (its assignment id) that answered."""
    raw = stack.client().chat.completions.with_raw_response.create(
        model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)
    return raw.parse().choices[0].message.content or "", raw.headers["x-thaw-replica"]


def placements(stack: Stack, name: str, since: float) -> list[str]:
    """The workers the controller placed ``name`` on (assigned or packed into) since ``since``."""
    r = httpx.get(f"{stack.control_url}/v1/events", params={"since": since}, timeout=5,
                  headers=bearer(stack.token()))
    r.raise_for_status()
    return [e["worker_id"] for e in r.json()["events"]
            if e.get("model") == name and e.get("kind") in ("assign", "pack")]


def engine_group_rss(engine_url: str) -> tuple[int, int]:
    """The process group serving ``engine_url`` (its listening port) and its RSS in bytes."""
    port = urlsplit(engine_url).port
    pid = next(c.pid for c in psutil.net_connections("tcp")
               if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid)
    group = os.getpgid(pid)
    rss = 0
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(p.pid) == group:
                rss += p.memory_info().rss
    return group, rss


@pytest.fixture(scope="module")
def stack(store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("pack-e2e")
    tuned_uri = push_demo(s3, tmp, "tuned", seed=7)

    def configure(cfg: dict[str, Any], uri: str) -> None:
        demo = cfg["models"][0]
        demo["engine"] = {**demo.get("engine", {}), "enforce_eager": True}
        demo["autoscaling"].update({"idle_grace_s": 3600, "activation_timeout_s": 300})
        tuned = {**demo, "name": "tuned", "served_name": "tuned", "uri": tuned_uri,
                 "autoscaling": {**demo["autoscaling"], "idle_grace_s": PACKED_IDLE_GRACE_S}}
        cfg["models"].append(tuned)
        # Needs 9 GiB of KV cache: never fits beside demo (its requests give up after 5 s).
        cfg["models"].append({**demo, "name": "big", "served_name": "big",
                              "engine": {**demo["engine"], "cpu_kvcache_gib": 9},
                              "autoscaling": {**demo["autoscaling"], "activation_timeout_s": 5}})
        # demo keeps its replica: idle, it would be evicted for big, which fits alone.
        demo["autoscaling"]["min_replicas"] = 1
        cfg["shapes"][0].update({"host_memory_gib": 12, "host_cache_gib": 0})
        cfg["pools"][0].update({"standby_min": 1, "standby_max": 1, "max_instances": 1, "pack": True})

    with running_stack(store, s3, demo_model_dir, tmp, configure) as s:
        yield s


def test_two_models_are_served_from_one_worker_and_released_independently(stack: Stack) -> None:
    assert ask(stack, "thaw-demo")
    st = stack.wait_for("demo ready", lambda s: engines_of(s, "demo"))
    [home] = engines_of(st, "demo")
    assert home["host_worker_id"] is None and home["capacity_bytes"] == 11 << 30  # 12 less the spare engine host
    # One instance, serving: tuned cannot launch another (max_instances 1) and fits beside demo.
    assert ask(stack, "tuned")
    st = stack.wait_for("tuned's cold start recorded", lambda s: model(s, "tuned")["last_cold_start"])
    assert model(st, "tuned")["last_cold_start"]["tier"] == "packed"
    [packed] = engines_of(st, "tuned")
    assert packed["host_worker_id"] == home["id"] and packed["memory_bytes"] > 2 << 30
    assert [s["counts"] for s in st["shapes"]] == [{"ready": 1}]
    # Both at once, each answering as its own model.
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda n: ask(stack, n), ["thaw-demo", "tuned"]))
    assert all(answers)
    _, rss = engine_group_rss(packed["engine_url"])
    print(f"\npacked engine's processes: {rss / (1 << 30):.2f} GiB RSS; counted "
          f"{packed['memory_bytes'] / (1 << 30):.2f} GiB")
    # tuned idles out alone: its engine goes, demo keeps serving on the same worker.
    st = stack.wait_for("tuned released", lambda s: not [w for w in s["workers"] if w["model"] == "tuned"],
                        timeout_s=120)
    assert [w["id"] for w in engines_of(st, "demo")] == [home["id"]]
    assert ask(stack, "thaw-demo")


def test_a_crash_of_a_packed_engine_leaves_its_neighbour_serving(stack: Stack) -> None:
    assert ask(stack, "thaw-demo")
    assert ask(stack, "tuned")
    st = stack.wait_for("tuned packed", lambda s: engines_of(s, "tuned"))
    [packed] = engines_of(st, "tuned")
    [home] = engines_of(st, "demo")
    assert packed["host_worker_id"] == home["id"]
    group, _ = engine_group_rss(packed["engine_url"])
    crashed_at = time.time()
    os.killpg(group, signal.SIGKILL)
    stack.wait_for("the crashed engine dropped",
                   lambda s: packed["id"] not in [w["id"] for w in engines_of(s, "tuned")], timeout_s=60)
    # Its neighbour never stopped serving.
    assert ask(stack, "thaw-demo")
    assert [w["id"] for w in engines_of(stack.state(), "demo")] == [home["id"]]
    # The crashed model is placed again, packed into the same worker: a new engine
    # answers. Judged by the answer and the controller's decisions, not by polling for a
    # ready engine: the model may be placed again at once (its keep-alive still running),
    # and that engine can answer and idle out (4 s) before any poll sees it.
    answer, replica = ask_replica(stack, "tuned")
    assert answer and replica != packed["assignment_id"]
    placed = placements(stack, "tuned", since=crashed_at)
    assert placed and set(placed) == {home["id"]}, placed


def test_a_model_that_does_not_fit_is_not_packed_and_the_worker_says_why(stack: Stack) -> None:
    assert ask(stack, "thaw-demo")
    st = stack.wait_for("demo ready", lambda s: engines_of(s, "demo"))
    [home] = engines_of(st, "demo")
    with pytest.raises(openai.APIStatusError) as info:
        ask(stack, "big")
    assert info.value.status_code == 503, info.value
    st = stack.state()
    assert not [w for w in st["workers"] if w["model"] == "big"]
    # Asked directly (as a controller that thought otherwise would), the worker refuses
    # with both numbers, and nothing starts.
    big = next(m for m in yaml_models(stack) if m["name"] == "big")
    body = {"assignment_id": "big-x", "model": "big", "uri": big["uri"],
            "served_model_name": "big", "max_model_len": 2048, "engine_id": f"{home['id']}.big-x",
            "memory_bytes": 12 << 30}
    r = httpx.post(f"{home['control_url']}/engines", json=body, timeout=10,
                   headers={"Authorization": f"Bearer {stack.token()}"})
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert "the engine needs 12.00 GiB but" in error and "GiB are free" in error and "of 11.00 GiB" in error, error
    assert not [w for w in stack.state()["workers"] if w["model"] == "big"]


def yaml_models(stack: Stack) -> list[dict[str, Any]]:
    import yaml

    return yaml.safe_load(stack.config.read_text())["models"]  # type: ignore[no-any-return]
