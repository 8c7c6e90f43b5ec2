"""Routing between two real replicas (real vLLM on CPU behind `thaw up`): prefix affinity
with bounded load, and a replica killed before its first byte retried transparently."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import openai
import psutil
import pytest

from tests.e2e_stack import KEY, Stack, running_stack
from thaw.embedded_store import EmbeddedStore
from thaw.objstore import S3Endpoint

pytestmark = [pytest.mark.integration, pytest.mark.engine]


@pytest.fixture(scope="module")
def stack(store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    def configure(cfg: dict[str, Any], uri: str) -> None:
        cfg["models"][0]["autoscaling"].update({
            "min_replicas": 2, "max_replicas": 2, "idle_grace_s": 600, "activation_timeout_s": 240,
            "max_concurrency_per_replica": 16})
        cfg["pools"][0].update({"standby_min": 0, "standby_max": 1, "max_instances": 2})

    with running_stack(store, s3, demo_model_dir, tmp_path_factory.mktemp("routing"), configure) as s:
        s.wait_for("two ready replicas",
                   lambda st: next(m for m in st["models"] if m["name"] == "demo")["replicas"] == {"ready": 2},
                   timeout_s=300)
        yield s


def convo(opener: str, turn: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"You are assistant {opener}."},
            {"role": "user", "content": "Let us talk."}, {"role": "assistant", "content": "Sure."},
            {"role": "user", "content": turn}]


def ask(stack: Stack, opener: str, turn: str, max_tokens: int = 4) -> str:
    raw = stack.client().chat.completions.with_raw_response.create(
        model="thaw-demo", messages=convo(opener, turn), max_tokens=max_tokens)
    assert raw.parse().choices
    return raw.headers["x-thaw-replica"]


def test_turns_of_one_conversation_stay_on_one_replica(stack: Stack) -> None:
    homes = {ask(stack, "A", f"turn {i}") for i in range(5)}
    assert len(homes) == 1
    # Different conversations spread over both replicas (rendezvous hashing of 12 keys).
    spread = {ask(stack, f"conv-{i}", "hello") for i in range(12)}
    assert len(spread) == 2


def test_a_continued_conversation_lands_where_its_prefix_is_cached(stack: Stack) -> None:
    client = stack.client()
    # An opening of many full cache blocks, which every later turn starts with (instructions
    # would not be: they are not carried over to a continued response).
    opening = "Here is a long story to remember. " * 40
    raw = client.responses.with_raw_response.create(model="thaw-demo", input=opening, max_output_tokens=4)
    previous, home = raw.parse(), raw.headers["x-thaw-replica"]
    homes, cached = [], []
    for turn in ("Go on.", "And then?", "Finish."):
        raw = client.responses.with_raw_response.create(
            model="thaw-demo", input=turn, previous_response_id=previous.id, max_output_tokens=4)
        previous = raw.parse()
        homes.append(raw.headers["x-thaw-replica"])
        assert previous.usage is not None
        cached.append(previous.usage.input_tokens_details.cached_tokens)
    # Every turn on the replica that served the first, whose prefix cache holds the history.
    assert homes == [home] * 3, homes
    assert all(c > 0 for c in cached), cached


def test_a_burst_of_one_prefix_is_moved_by_the_load_bound(stack: Stack) -> None:
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=KEY, max_retries=0, timeout=300)

    async def one(i: int) -> str:
        raw = await client.chat.completions.with_raw_response.create(
            model="thaw-demo", messages=convo("B", f"burst {i}"), max_tokens=24)
        return raw.headers["x-thaw-replica"]

    async def burst() -> list[str]:
        return await asyncio.gather(*(one(i) for i in range(10)))

    served = asyncio.run(burst())
    # Alone, these would all go to conversation B's replica; ten at once exceed
    # ceil(1.25 x mean) there, so the other replica takes a share.
    assert len(set(served)) == 2
    counts = sorted(served.count(r) for r in set(served))
    assert counts[1] >= counts[0]  # the home replica keeps the larger share


def test_replica_killed_before_first_byte_is_served_elsewhere_transparently(stack: Stack) -> None:
    home = ask(stack, "C", "first")
    worker = next(w for w in stack.state()["worker_details"] if w["assignment_id"] == home)
    port = urlparse(worker["engine_url"]).port
    victims = [c.pid for c in psutil.net_connections("tcp")
               if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid]
    assert victims, f"nobody listens on the engine port {port}"
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    # Right away, requests whose home is the dead replica: each gets an answer.
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=KEY, max_retries=0, timeout=300)

    async def one(i: int) -> str:
        raw = await client.chat.completions.with_raw_response.create(
            model="thaw-demo", messages=convo("C", f"after {i}"), max_tokens=4)
        assert raw.parse().choices
        return raw.headers["x-thaw-replica"]

    async def after() -> list[str]:
        return await asyncio.gather(*(one(i) for i in range(4)))

    served = asyncio.run(after())
    assert home not in served
    m = stack.metrics()
    retried = m.get(("thaw_upstream_retries_total", (("model", "demo"),)), 0.0)
    print(f"\nretried on another replica: {retried:.0f} request(s)")
