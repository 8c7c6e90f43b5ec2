"""Idle yields to waiting, end to end: `thaw up` with a pool of one instance and two
models (demo and a fine-tune of it, another seed), real vLLM engines on the CPU, the
official openai client. demo, served once and idle (its keep-alive an hour), holds the
only instance; a request for tuned takes it (demo's replica evicted, the decision
logged) and is served within a cold start. With tuned busy streaming, a request for
demo is refused at once (503 pool_at_capacity, Retry-After, naming the pool and its
cap) instead of after its activation timeout, and tuned's streams complete."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e_stack import Stack, push_demo, running_stack
from thaw.auth import bearer
from thaw.embedded_store import EmbeddedStore
from thaw.objstore import S3Endpoint

pytestmark = [pytest.mark.integration, pytest.mark.engine]

ACTIVATION_S = 240
# tuned's streams: one at a time on its replica, each long (the demo model has random
# weights: ignore_eos makes the length exact), so tuned stays busy while demo asks.
STREAMS, TOKENS = 4, 1500


def model(st: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in st["models"] if m["name"] == name)


def serving(st: dict[str, Any], name: str) -> list[str]:
    return [w["id"] for w in st["workers"] if w["model"] == name and w["state"] == "ready"]


def ask(stack: Stack, name: str) -> str:
    out = stack.client().chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=4, temperature=0)
    return out.choices[0].message.content or ""


def events(stack: Stack, since: float) -> list[dict[str, Any]]:
    r = httpx.get(f"{stack.control_url}/v1/events", params={"since": since}, timeout=5,
                  headers=bearer(stack.token()))
    r.raise_for_status()
    return r.json()["events"]  # type: ignore[no-any-return]


def long_stream(stack: Stack, started: list[float]) -> tuple[int | None, str | None]:
    """One of tuned's long streams: the tokens it generated, and how it finished."""
    out = stack.client().chat.completions.create(
        model="tuned", messages=[{"role": "user", "content": "Count."}], max_tokens=TOKENS, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    tokens, finish = None, None
    for c in out:
        if not started:
            started.append(time.time())
        if c.choices:
            finish = c.choices[0].finish_reason or finish
        if c.usage is not None:
            tokens = c.usage.completion_tokens
    return tokens, finish


@pytest.fixture(scope="module")
def stack(store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("evict-e2e")
    tuned_uri = push_demo(s3, tmp, "tuned", seed=7)

    def configure(cfg: dict[str, Any], uri: str) -> None:
        demo = cfg["models"][0]
        demo["engine"] = {**demo.get("engine", {}), "enforce_eager": True}
        demo["autoscaling"].update({"idle_grace_s": 3600, "activation_timeout_s": ACTIVATION_S})
        cfg["models"].append({**demo, "name": "tuned", "served_name": "tuned", "uri": tuned_uri,
                              "autoscaling": {**demo["autoscaling"], "max_concurrency_per_replica": 1}})
        cfg["pools"][0].update({"standby_min": 1, "standby_max": 1, "max_instances": 1})

    with running_stack(store, s3, demo_model_dir, tmp, configure) as s:
        yield s


def test_a_waiting_model_takes_the_idle_instance_and_a_busy_one_is_refused_at_once(stack: Stack) -> None:
    assert ask(stack, "thaw-demo")
    st = stack.wait_for("demo ready", lambda s: serving(s, "demo"))
    [home] = serving(st, "demo")
    # demo is idle, kept an hour; the pool is at max_instances 1: tuned takes its instance.
    since = time.time()
    assert ask(stack, "tuned")
    waited = time.time() - since
    st = stack.wait_for("tuned's cold start recorded", lambda s: model(s, "tuned")["last_cold_start"])
    assert serving(st, "tuned") == [home] and len(st["workers"]) == 1
    cold = model(st, "tuned")["last_cold_start"]
    print(f"\ntuned served {waited:.1f} s after its request by taking demo's instance "
          f"(demo's own cold start: {model(st, 'demo')['last_cold_start']['total_s']:.1f} s)")
    assert waited < ACTIVATION_S / 2 and cold["tier"] != "launch", (waited, cold)
    [ev] = [e for e in events(stack, since) if e["kind"] == "release"]
    assert (ev["reason"], ev["model"], ev["worker_id"]) == ("evicted", "demo", home)
    assert ev["inputs"]["for_model"] == "tuned" and ev["inputs"]["idle_s"] > 0
    # tuned busy (its streams one after another on its one replica): demo is refused at
    # once, by its cause, and no replica of tuned is taken.
    since, started = time.time(), list[float]()
    with ThreadPoolExecutor(STREAMS) as pool:
        streams = [pool.submit(long_stream, stack, started) for _ in range(STREAMS)]
        stack.wait_for("tuned streaming", lambda s: started, timeout_s=120)
        asked = time.time()
        with pytest.raises(openai.APIStatusError) as refused:
            ask(stack, "thaw-demo")
        took = time.time() - asked
        assert not all(s.done() for s in streams), "tuned went idle before demo was refused: make it busier"
        results = [s.result() for s in streams]
    r = refused.value.response
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text
    err = r.json()["error"]
    assert err["code"] == "pool_at_capacity", err
    assert "pool cpu-local is at max_instances 1 and every replica is busy" in err["message"], err
    assert took < 30, took  # not the activation timeout (240 s)
    assert results == [(TOKENS, "length")] * STREAMS
    assert not [e for e in events(stack, since) if e["kind"] == "release" and e["reason"] == "evicted"]
