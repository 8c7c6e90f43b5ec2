"""Scale from zero, end to end: `thaw up` as a real process, the real store, real vLLM (CPU),
the official openai client. The tests run in order against one running stack."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from tests.conftest import BUCKET
from tests.e2e_stack import KEY, Stack, running_stack
from tests.otlp_receiver import Received, Span, otlp_receiver
from tests.waiting import wait_until
from thaw.embedded_store import EmbeddedStore
from thaw.objstore import S3Endpoint
from thaw.telemetry import TraceContext

pytestmark = [pytest.mark.integration, pytest.mark.engine]

IDLE_GRACE_S = 8
# Far shorter than a cold start of a real engine (the engine alone takes seconds).
HELD_PROGRESS_S = 0.5
# A scheduled window is declared at least this long before it opens (controller time).
WINDOW_NOTICE_S = 45


def demo_state(state: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in state["models"] if m["name"] == "demo")


def workers_in(state: dict[str, Any], st: str) -> list[dict[str, Any]]:
    return [w for w in state["workers"] if w["state"] == st]


@pytest.fixture(scope="module")
def otlp() -> Iterator[tuple[str, Received]]:
    """A collector for the stack's traces."""
    with otlp_receiver() as r:
        yield r


@pytest.fixture(scope="module")
def stack(store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
          otlp: tuple[str, Received]) -> Iterator[Stack]:
    def configure(cfg: dict[str, Any], uri: str) -> None:
        # Every service sends its spans there; hot requests are not traced unless their
        # caller asks (a cold start and a failure always are).
        cfg["telemetry"] = {"otlp_endpoint": otlp[0], "sample_ratio": 0.0}
        demo = cfg["models"][0]
        demo["autoscaling"].update({"idle_grace_s": IDLE_GRACE_S, "activation_timeout_s": 240})
        ghost = {**demo, "name": "ghost", "served_name": "ghost", "uri": f"s3://{BUCKET}/e2e/nothing-{os.getpid()}",
                 "autoscaling": {**demo["autoscaling"], "activation_timeout_s": 240}}
        cfg["models"].append(ghost)
        # Every streamed cold start here is held past this: its progress comments are
        # read by the first test, and parsed past by the official client in the others.
        cfg["server"]["held_progress_interval_s"] = HELD_PROGRESS_S
        cfg["pools"][0].update({"standby_min": 1, "standby_max": 1, "max_instances": 2})
        # The scheduled window is reached by stepping the controller's clock (up to a
        # minute and a half at once: heartbeats every 2 s outlast it in 120 s).
        cfg["controller"]["stepped_clock"] = True
        cfg.setdefault("cluster", {})["worker_timeout_s"] = 120

    with running_stack(store, s3, demo_model_dir, tmp_path_factory.mktemp("e2e"), configure) as s:
        yield s


def test_streamed_request_at_zero_cold_starts_once_then_serves_hot(stack: Stack, otlp: tuple[str, Received]) -> None:
    # The standby worker has paid its imports; the model has no replica.
    stack.wait_for("a standby worker", lambda s: workers_in(s, "standby"))
    assert demo_state(stack.state())["replicas"] == {}
    # `thaw up` said the API was up at once, and "serving" only once a worker stood by.
    wait_until("thaw up to say serving", lambda: "thaw up: serving on" in stack.log.read_text(), 30)
    said = stack.log.read_text()
    assert said.index("thaw up: the API is up on") < said.index("thaw up: serving on")

    # Held past HELD_PROGRESS_S, the stream is answered 200 at once and told the phase
    # it waits in until its first token (docs/REQUEST_PATH.md).
    t0 = time.time()
    with httpx.stream("POST", f"{stack.base_url}/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "thaw-demo", "messages": [{"role": "user", "content": "Hello!"}],
                            "max_tokens": 8, "stream": True}, timeout=300) as raw:
        assert raw.status_code == 200 and raw.headers["x-thaw-cold-start"] == "true"
        assert "x-thaw-tier" not in raw.headers  # not known when the 200 went out
        rid = raw.headers["x-request-id"]
        lines = list(raw.iter_lines())
    cold_s = time.time() - t0
    held = [ln for ln in lines if ln.startswith(": thaw held phase=")]
    assert held and {ln.split()[3] for ln in held} <= {"phase=queued", "phase=loading", "phase=first_token"}
    (ready,) = [ln for ln in lines if ln.startswith(": thaw ready")]
    assert "tier=s3" in ready  # nothing cached yet: the weights came from the store
    assert int(ready.split("queue_ms=")[1].split()[0]) > 0
    assert lines.index(ready) < next(i for i, ln in enumerate(lines) if ln.startswith("data: "))
    assert any('"content"' in ln for ln in lines if ln.startswith("data: ")) and "data: [DONE]" in lines
    m = stack.metrics()
    assert m[("thaw_cold_starts_total", (("model", "demo"), ("tier", "s3")))] == 1
    phases = {"queued", "instance_acquired", "snapshot_restored", "weights_loaded", "engine_ready", "first_token", "total"}
    for phase in phases:
        assert m[("thaw_cold_start_seconds_count", (("model", "demo"), ("phase", phase), ("tier", "s3")))] == 1, phase
    # The parts add up to the whole (each is observed once).
    parts = sum(m[("thaw_cold_start_seconds_sum", (("model", "demo"), ("phase", p), ("tier", "s3")))] for p in phases - {"total"})
    total = m[("thaw_cold_start_seconds_sum", (("model", "demo"), ("phase", "total"), ("tier", "s3")))]
    assert abs(parts - total) < 0.01 and 0 < total <= cold_s + 0.5
    # The worker's own milestones were used: loading weights and starting the engine took time.
    assert m[("thaw_cold_start_seconds_sum", (("model", "demo"), ("phase", "engine_ready"), ("tier", "s3")))] > 0

    raw2 = stack.client().chat.completions.with_raw_response.create(
        model="thaw-demo", messages=[{"role": "user", "content": "Again"}], max_tokens=4)
    assert raw2.headers["x-thaw-cold-start"] == "false"
    assert raw2.headers["x-thaw-tier"] == "hot"
    assert raw2.parse().choices[0].message.content is not None
    assert cold_starts(stack) == 1
    print(f"\ncold start to last token: {cold_s:.2f}s; phases: {demo_state(stack.state())['last_cold_start']}")
    cold_trace_has_every_service_and_phase(otlp[1], rid)
    # The hot request was not traced (ratio 0); one whose caller samples it is, in the
    # caller's trace. Spans leave in order: by the time that one came, the other would have.
    caller = TraceContext(0xC0FFEE, 0xBEEF, True)
    marked = stack.client(default_headers={"traceparent": caller.traceparent()}).chat.completions.with_raw_response.create(
        model="thaw-demo", messages=[{"role": "user", "content": "Traced"}], max_tokens=2)
    (mine,) = wait_until("the caller's traced request", lambda: otlp[1].roots(
        "thaw.request_id", marked.headers["x-request-id"]), 60)
    assert mine.trace_id == f"{caller.trace_id:032x}" and mine.parent_id == f"{caller.span_id:016x}"
    assert otlp[1].roots("thaw.request_id", raw2.headers["x-request-id"]) == []


def cold_trace_has_every_service_and_phase(got: Received, request_id: str) -> None:
    """One trace for the cold request: the activator's request and phase spans with the
    GenAI conventions' attributes, the controller's assignment and its call, the worker's load."""
    (root,) = wait_until("the cold request's span", lambda: got.roots("thaw.request_id", request_id), 60)
    assert (root.name, root.service, root.parent_id) == ("chat thaw-demo", "thaw-activator", "")
    assert root.attributes["gen_ai.operation.name"] == "chat" and root.attributes["gen_ai.request.model"] == "thaw-demo"
    assert root.attributes["gen_ai.usage.output_tokens"] > 0 and root.attributes["thaw.tier"] == "s3"
    wanted = {("thaw-activator", f"thaw.{p}") for p in ("queued", "instance_acquired", "snapshot_restored",
                                                         "weights_loaded", "engine_ready", "first_token")}
    wanted |= {("thaw-controller", "thaw.assign demo"), ("thaw-controller", "POST /assign"),
               ("thaw-worker", "thaw.load demo"), ("thaw-worker", "thaw.weights_load"),
               ("thaw-worker", "thaw.engine_start")}
    def named() -> dict[tuple[str, str], Span]:
        return {(x.service, x.name): x for x in got.trace(root.trace_id)}

    by = wait_until("every service's spans in the trace", lambda: wanted <= set(named()) and named(), 60,
                    detail=lambda: str(sorted(named())))
    assign, call, load = by["thaw-controller", "thaw.assign demo"], by["thaw-controller", "POST /assign"], \
        by["thaw-worker", "thaw.load demo"]
    assert (assign.parent_id, call.parent_id, load.parent_id) == (root.span_id, assign.span_id, call.span_id)
    assert by["thaw-activator", "thaw.weights_loaded"].attributes["thaw.load.tier"] == "s3"
    assert load.attributes["thaw.load.bytes"] > 0


def cold_starts(stack: Stack) -> float:
    """The demo model's cold starts, whichever tier served them."""
    return sum(v for (name, labels), v in stack.metrics().items()
               if name == "thaw_cold_starts_total" and ("model", "demo") in labels)


def test_a_conversation_continues_after_its_model_scaled_to_zero(stack: Stack) -> None:
    client = stack.client()
    first = client.responses.create(model="thaw-demo", input="Remember the word tulip.", max_output_tokens=4)
    stack.wait_for("scale to zero", lambda s: not demo_state(s)["replicas"] and workers_in(s, "standby"),
                   timeout_s=IDLE_GRACE_S + 90)
    # Nothing of the conversation lived in the released replica: a cold start continues it.
    raw = client.responses.with_raw_response.create(model="thaw-demo", input="Which word?",
                                                    previous_response_id=first.id, max_output_tokens=4)
    assert raw.headers["x-thaw-cold-start"] == "true"
    second = raw.parse()
    history = [{"role": "user", "content": "Remember the word tulip."},
               {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "Which word?"}]
    usage = client.chat.completions.create(model="thaw-demo", messages=history, max_tokens=1).usage  # type: ignore[arg-type]
    assert second.usage is not None and usage is not None and second.usage.input_tokens == usage.prompt_tokens


def test_idle_model_scales_to_zero_and_worker_returns_to_standby(stack: Stack) -> None:
    state = stack.wait_for("scale to zero", lambda s: not demo_state(s)["replicas"] and workers_in(s, "standby"),
                           timeout_s=IDLE_GRACE_S + 90)
    assert demo_state(state)["replicas"] == {}
    m = stack.metrics()
    assert m[("thaw_replicas", (("model", "demo"), ("state", "ready")))] == 0


def test_concurrent_requests_during_one_cold_start_share_one_replica(stack: Stack) -> None:
    before = cold_starts(stack)
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=KEY, max_retries=0, timeout=300)

    async def one(i: int) -> tuple[str, str]:
        raw = await client.chat.completions.with_raw_response.create(
            model="thaw-demo", messages=[{"role": "user", "content": f"request {i}"}], max_tokens=4, stream=True)
        stream = raw.parse()
        if inspect.isawaitable(stream):
            stream = await stream
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        return raw.headers["x-thaw-cold-start"], text

    async def all_of_them() -> list[tuple[str, str]]:
        return await asyncio.gather(*(one(i) for i in range(8)))

    results = asyncio.run(all_of_them())
    assert len(results) == 8 and all(cold == "true" for cold, _ in results)
    assert all(text for _, text in results)
    state = stack.state()
    assert demo_state(state)["replicas"] == {"ready": 1}
    # One activation: one more cold start, one replica assigned.
    assert cold_starts(stack) == before + 1


def test_error_statuses_are_openai_errors(stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        stack.client().chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert nf.value.status_code == 404 and nf.value.body["code"] == "model_not_found"  # type: ignore[index]
    bad = openai.OpenAI(base_url=stack.base_url, api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as au:
        bad.chat.completions.create(model="thaw-demo", messages=[{"role": "user", "content": "x"}])
    assert au.value.status_code == 401
    r = httpx.post(f"{stack.base_url}/chat/completions", content=b"{oops",
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_model_without_weights_fails_fast_with_the_reason(stack: Stack) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        stack.client().chat.completions.create(model="ghost", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 503
    message = info.value.body["message"]  # type: ignore[index]
    # The answer is the load failure's kind (from the first backoff), not the activation
    # timeout's "did not become ready"; the details (the URI) are the operator's.
    assert message.startswith("model 'ghost' failed to start: its weights could not be read from the object store")
    assert "s3://" not in message and "did not become ready" not in message, message
    assert int(info.value.response.headers["retry-after"]) >= 1
    # The platform is fine: health answers and the demo model still serves.
    assert httpx.get(stack.base_url.removesuffix("/v1") + "/healthz").json()["ok"] is True
    out = stack.client().chat.completions.create(model="thaw-demo", messages=[{"role": "user", "content": "y"}],
                                                 max_tokens=2)
    assert out.choices[0].message.content is not None


def test_thaw_status_prints_models_and_workers(stack: Stack) -> None:
    out = subprocess.run([sys.executable, "-m", "thaw.cli.main", "status", "--config", str(stack.config)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "thaw-demo" in out.stdout and "last cold start" in out.stdout and "WORKERS" in out.stdout
    assert "ghost" in out.stdout and "no model at" in out.stdout


def test_a_scheduled_window_brings_a_replica_up_before_its_first_request(stack: Stack) -> None:
    stack.wait_for("scale to zero", lambda s: not demo_state(s)["replicas"] and workers_in(s, "standby"),
                   timeout_s=IDLE_GRACE_S + 90)
    # A window at the next minute at least WINDOW_NOTICE_S away on the controller's clock
    # (UTC; cron has minutes), declared while it is still shut. The test steps the live
    # controller's clock to just before it, where nothing happens, then across it, where
    # a replica comes up with no request.
    auth = {"Authorization": f"Bearer {stack.token()}"}
    clock_url = f"{stack.control_url}/v1/pool/clock"
    declared = httpx.get(clock_url, headers=auth, timeout=10).json()["now"]
    opens = math.ceil((declared + WINDOW_NOTICE_S) / 60) * 60.0
    at = datetime.fromtimestamp(opens, UTC)
    url = f"{stack.control_url}/v1/admin/models/demo"
    revision = httpx.get(url, headers=auth, timeout=10).json()["revision"]
    window = {"cron": f"{at.minute} {at.hour} * * *", "for_s": 600}
    r = httpx.patch(url, headers=auth, timeout=30, json={"revision": revision, "spec": {"prewarm": [window]}})
    assert r.status_code == 200, r.text
    try:
        # The first step as an operator takes it (`thaw pool clock --advance`), the second
        # by the API. A step the heartbeats would not outlast is refused, naming the bound.
        def pool_clock(advance_s: float) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "thaw.cli.main", "pool", "clock", "--advance", str(advance_s),
                                   "--config", str(stack.config), "--json"], capture_output=True, text=True, timeout=30)

        out = pool_clock(3600)
        assert out.returncode != 0 and "step at most 116 s" in out.stderr, (out.returncode, out.stderr)
        # The clock runs on while the CLI starts (seconds on a loaded 2-core machine), so
        # the first step stops 20 s short and the second is sized from where it landed.
        now = httpx.get(clock_url, headers=auth, timeout=10).json()["now"]
        out = pool_clock(max(1.0, opens - 20 - now))
        assert out.returncode == 0, out.stderr
        stepped = json.loads(out.stdout)["now"]
        assert stepped < opens
        r = httpx.post(clock_url, headers=auth, timeout=10, json={"advance_s": opens - stepped + 1})
        assert r.status_code == 200 and r.json()["now"] >= opens, r.text
        stack.wait_for("the scheduled replica", lambda s: demo_state(s)["replicas"].get("ready"), timeout_s=180)
        events = httpx.get(f"{stack.control_url}/v1/events", headers=auth, timeout=5).json()["events"]
        assigned = [e for e in events if e["kind"] == "assign" and e["model"] == "demo" and e["at"] >= declared]
        assert [e["reason"] for e in assigned] == ["prewarm"], assigned
        assert assigned[0]["at"] >= opens, f"assigned {opens - assigned[0]['at']:.1f} s before the window opened"
        print(f"\nclock stepped {opens - now:.1f} s to the window; replica assigned "
              f"{assigned[0]['at'] - opens:.2f} s (controller time) after it opened")
        # The window's first request finds it up: no cold start.
        before = cold_starts(stack)
        raw = stack.client().chat.completions.with_raw_response.create(
            model="thaw-demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert raw.headers["x-thaw-cold-start"] == "false"
        assert cold_starts(stack) == before
    finally:
        revision = httpx.get(url, headers=auth, timeout=10).json()["revision"]
        httpx.patch(url, headers=auth, timeout=30, json={"revision": revision, "spec": {"prewarm": []}})


def test_stopping_thaw_up_leaves_no_process(stack: Stack) -> None:
    stack.remember_children()
    assert stack.seen_pids, "thaw up had no children to check"
    stack.proc.send_signal(signal.SIGTERM)
    stack.proc.wait(timeout=90)

    def running() -> list[int]:
        out = []
        for p in stack.seen_pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(p).status() != "zombie":
                    out.append(p)
        return out

    def named() -> str:
        out = []
        for p in running():
            with contextlib.suppress(psutil.NoSuchProcess):
                out.append(psutil.Process(p).cmdline())
        return f"left running: {out}"

    wait_until("everything thaw up started gone", lambda: not running(), 10, 0.2, detail=named)
    assert "thaw up: stopping" in stack.log.read_text()
