"""Faults of processes, injected into a real `thaw up` (controller, activator, local
workers running vLLM on the CPU, the session's SeaweedFS) under a steady open-loop load
of streamed requests from the official openai client. One stack for the module; the
faults run in order, each bounded in time, each leaving the stack serving again. Here
so far: a worker SIGKILLed mid-stream (docs/RELIABILITY.md lists what is still to come).

After every fault the suite checks what each client saw and what the ledger recorded
(``support.check``): complete answers or OpenAI-shaped errors with the right status and
``Retry-After``, nothing truncated, nothing hung, one ledger record per answered request
with the tokens the client received.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_stack import Stack, running_stack
from tests.faults.support import (
    Outcome,
    check,
    kill_worker,
    local_workers,
    open_load,
    stream_once,
    timeline,
    wait_recorded,
    wait_until,
)
from thaw.embedded_store import EmbeddedStore
from thaw.objstore import S3Endpoint

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.faults]

# The load every fault runs through: 2 streamed requests a second, 8-48 tokens each.
RATE = 2.0
# How long a request may wait for a replica; the client waits longer for a byte, so a
# client timeout is a hang, never a slow but bounded refusal.
ACTIVATION_S = 60
CLIENT_TIMEOUT_S = 150
# A stream long enough that a fault lands while it streams (the demo model has random
# weights: ignore_eos makes the length exact).
LONG_TOKENS = 600


def serving(state: dict[str, Any], model: str) -> list[str]:
    return [w["id"] for w in state["workers"] if w["model"] == model and w["state"] == "ready"]


def standby(state: dict[str, Any]) -> list[str]:
    return [w["id"] for w in state["workers"] if w["state"] == "standby"]


@pytest.fixture(scope="module")
def stack(store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    def configure(cfg: dict[str, Any], uri: str) -> None:
        shape = cfg["shapes"][0]
        shape.pop("cache", None)  # the cache tiers have their own faults
        shape.pop("host_cache_gib", None)
        cfg["cluster"].update({"heartbeat_interval_s": 1, "worker_timeout_s": 10})
        cfg["pools"][0].update({"standby_min": 2, "standby_max": 2, "max_instances": 4})
        demo = cfg["models"][0]
        demo["autoscaling"].update({"idle_grace_s": 600, "activation_timeout_s": ACTIVATION_S, "max_replicas": 1})
        # The tenant's own limits are not what these faults test.
        cfg["tenants"][0]["limits"] = {"requests_per_minute": 100000, "tokens_per_minute": 100000000,
                                       "max_concurrent_requests": 1000}

    with running_stack(store, s3, demo_model_dir, tmp_path_factory.mktemp("faults"), configure) as s:
        s.wait_for("two standby workers", lambda st: len(standby(st)) >= 2, timeout_s=300)
        # Hot before the faults: the load starts against a serving replica.
        first = stream_once(s.client(), "thaw-demo", max_tokens=4, timeout_s=180)
        assert first.kind == "ok", first
        yield s


def ledger_check(stack: Stack, fault: str, outcomes: list[Outcome], **kw: Any) -> None:
    verdict = check(fault, outcomes, wait_recorded(stack.data_dir, outcomes), **kw)
    assert not verdict.problems, "\n".join(verdict.problems[:10]) + "\n" + timeline(
        outcomes, min(o.sent_at for o in outcomes))


def long_stream_in_background(stack: Stack, model: str = "thaw-demo") -> tuple[Any, threading.Event]:
    """A long stream, and an event set once it has received a few chunks."""
    streaming = threading.Event()

    def seen(o: Outcome) -> None:
        if o.chunks >= 3:
            streaming.set()

    pool = ThreadPoolExecutor(1)
    fut = pool.submit(stream_once, stack.client(), model, max_tokens=LONG_TOKENS, timeout_s=60, on_chunk=seen,
                      ignore_eos=True)
    pool.shutdown(wait=False)
    return fut, streaming


def test_worker_sigkill_mid_stream(stack: Stack) -> None:
    """1. The worker dies under a stream: that client gets an error event and [DONE]
    (never a 200 that just stops); the model comes back on another worker, and the load
    is served again."""
    victim = serving(stack.state(), "demo")
    assert len(victim) == 1
    with open_load(stack.client(), "thaw-demo", rate_per_s=RATE, timeout_s=CLIENT_TIMEOUT_S) as load:
        time.sleep(2)
        fut, streaming = long_stream_in_background(stack)
        assert streaming.wait(60)
        kill_worker(local_workers(stack.data_dir)[victim[0]])
        killed_at = time.time()
        back = wait_until("demo on another worker", lambda: [w for w in serving(stack.state(), "demo")
                                                              if w != victim[0]], timeout_s=120)
        back_at = time.time()
        time.sleep(4)
        outcomes = load.stop()
    cut = fut.result()
    assert cut.kind == "error_event" and cut.chunks >= 3, cut
    assert cut.error is not None and "incomplete" in str(cut.error)
    print(f"\nback on {back[0]} {back_at - killed_at:.1f} s after the kill")
    after = [o for o in outcomes if o.sent_at > back_at + 0.5]
    assert after and all(o.kind == "ok" for o in after), timeline(outcomes, killed_at)
    ledger_check(stack, "worker SIGKILL mid-stream", [*outcomes, cut], allow={"ok", "error_event", "http_error"},
                 statuses={503})
