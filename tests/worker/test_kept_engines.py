"""Kept engines in the agent, with a fake engine host: built ahead (prebuild), a model
of the same class swapped in, parked by a release and taken again; another class, a
different vocabulary or a failed swap means a fresh engine, never a served one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.waiting import until
from tests.worker.fakes import (
    LLAMA,
    World,
    agent_client,
    assign_body,
    wait_state,
)
from thaw.config import EngineArgs
from thaw.engine_class import engine_class_of
from thaw.objstore import S3Endpoint
from weight_streaming.manifest import FileEntry, Manifest

ENGINE = {"enforce_eager": True, "cpu_kvcache_gib": 2}
CLASS = engine_class_of(LLAMA, EngineArgs(**ENGINE), max_model_len=512).id  # type: ignore[arg-type]


def manifest(uri: str, vocab_sha: str = "v" * 64) -> Manifest:
    files = [FileEntry(path="config.json", size=1, sha256="c" * 64, etag="e"),
             FileEntry(path="tokenizer.json", size=1, sha256=vocab_sha, etag="e")]
    return Manifest(uri=uri, created_at=datetime.now(UTC), files=files, safetensors={}, parameter_count=0,
                    total_bytes=0)


class Store:
    """The fakes' store: configs and vocabularies per URI (default: the LLAMA class)."""

    def __init__(self) -> None:
        self.configs: dict[str, dict[str, Any]] = {}
        self.vocab: dict[str, str] = {}

    def manifest(self, store: S3Endpoint, uri: str) -> Manifest:
        return manifest(uri, self.vocab.get(uri, "v" * 64))

    def config(self, store: S3Endpoint, uri: str) -> dict[str, Any]:
        return self.configs.get(uri, LLAMA)


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def store() -> Store:
    return Store()


@pytest.fixture
async def client(world: World, store: Store, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with agent_client(world, tmp_path, manifest_reader=store.manifest, config_reader=store.config) as c:
        yield c


def prebuild_body(**over: Any) -> dict[str, Any]:
    body = {"model": "base", "uri": "s3://thaw/models/base", "served_model_name": "base", "max_model_len": 512,
            "engine": ENGINE, "engine_class": CLASS}
    body.update(over)
    return body


async def prebuilt(c: httpx.AsyncClient, state: str = "ready") -> dict[str, Any]:
    async def built() -> dict[str, Any] | None:
        body = (await c.get("/state")).json()
        return body if (body.get("prebuilt") or {}).get("state") == state else None

    got: dict[str, Any] = await until(f"the prebuilt engine {state}", built, 5, interval_s=0.005)
    return got


async def test_prebuild_builds_an_engine_that_serves_nothing(client: httpx.AsyncClient, world: World) -> None:
    await wait_state(client, "standby")
    r = await client.post("/prebuild", json=prebuild_body())
    assert r.status_code == 202 and r.json()["prebuilt"]["state"] == "building"
    body = await prebuilt(client)
    assert body["state"] == "standby" and body["prebuilt"]["engine_class"] == CLASS
    [launch] = world.hosts[0].launches
    assert launch.swappable and not launch.serving
    # The same class again is nothing to do; another, or a second engine, is refused.
    assert (await client.post("/prebuild", json=prebuild_body())).status_code == 200
    r = await client.post("/prebuild", json=prebuild_body(engine_class="f" * 16))
    assert r.status_code == 409 and "keeps an engine already" in r.json()["error"]


async def test_a_model_of_the_class_is_swapped_in_then_parked_and_taken_again(
        client: httpx.AsyncClient, world: World, tmp_path: Path) -> None:
    await wait_state(client, "standby")
    await client.post("/prebuild", json=prebuild_body())
    await prebuilt(client)
    host = world.hosts[0]
    assert (await client.post("/assign", json=assign_body(uri="s3://thaw/models/tuned", engine=ENGINE,
                                                          engine_class=CLASS))).status_code == 202
    ready = await wait_state(client, "ready")
    [swap] = world.commands
    assert (swap.op, swap.uri, swap.served_model_name) == ("swap", "s3://thaw/models/tuned", "demo-chat")
    # The front end is rebuilt from the agent's copy of the model's files, kept by content.
    assert swap.files_dir is not None and Path(swap.files_dir).parent == tmp_path / "model-files"
    assert ready["load"]["swap"] is True and ready["prebuilt"]["model"] == "demo"
    assert len(host.launches) == 1  # no second engine
    # A release parks the engine: back to standby with it, on the same engine host.
    assert (await client.post("/release", json={})).status_code == 202
    back = await wait_state(client, "standby")
    assert [c.op for c in world.commands] == ["swap", "park"]
    # The park's steps as the engine host timed them (a built engine had none before).
    assert ready["prebuilt"]["park_steps_s"] is None
    assert back["prebuilt"] == {"engine_class": CLASS, "model": "demo", "state": "ready",
                                "built_at": back["prebuilt"]["built_at"],
                                "park_steps_s": {"prefix_cache_s": 0.002, "total_s": 0.002}}
    assert host.stops == [] and len(world.hosts) == 1
    # ... and the next model of the class takes it by swap again.
    await client.post("/assign", json=assign_body(assignment_id="a2", model="other", uri="s3://thaw/models/other",
                                                  engine=ENGINE))
    await wait_state(client, "ready")
    assert [c.op for c in world.commands] == ["swap", "park", "swap"] and len(host.launches) == 1


@pytest.mark.parametrize(("case", "uri", "configs", "vocab"), [
    ("another class", "s3://thaw/models/big", {"s3://thaw/models/big": {**LLAMA, "hidden_size": 512}}, {}),
    ("another vocabulary", "s3://thaw/models/tok", {}, {"s3://thaw/models/tok": "w" * 64}),
])
async def test_a_model_that_does_not_fit_gets_a_fresh_engine(
        client: httpx.AsyncClient, world: World, store: Store, case: str, uri: str,
        configs: dict[str, Any], vocab: dict[str, str]) -> None:
    store.configs.update(configs)
    store.vocab.update(vocab)
    await wait_state(client, "standby")
    await client.post("/prebuild", json=prebuild_body())
    await prebuilt(client)
    await client.post("/assign", json=assign_body(uri=uri, engine=ENGINE, engine_class="f" * 16))
    ready = await wait_state(client, "ready", timeout_s=10)
    assert world.commands == [], case  # no swap was tried
    assert world.hosts[0].stops == [0.0] and len(world.hosts) == 2  # the kept engine went at once
    launch = world.hosts[1].launches[0]
    assert launch.uri == uri and launch.swappable  # a class was named: this engine may be kept in turn
    assert ready["load"]["swap"] is False and ready["prebuilt"]["model"] == "demo"


async def test_a_failed_swap_serves_nothing_and_the_engine_goes(client: httpx.AsyncClient, world: World) -> None:
    world.on_swap = "weights"
    await wait_state(client, "standby")
    await client.post("/prebuild", json=prebuild_body())
    await prebuilt(client)
    await client.post("/assign", json=assign_body(uri="s3://thaw/models/tuned", engine=ENGINE))
    failed = await wait_state(client, "failed")
    assert "swapping the model into the engine failed (weights)" in failed["error"]
    assert failed["engine_url"] is None and failed["prebuilt"] is None
    assert world.hosts[0].stops == [0.0]  # dirty: killed, not kept
    # The release clears the failure; a fresh engine host stands by with no engine.
    await client.post("/release", json={})
    back = await wait_state(client, "standby")
    assert back["prebuilt"] is None and len(world.hosts) == 2


async def test_an_assignment_while_the_engine_builds_waits_for_it(client: httpx.AsyncClient, world: World) -> None:
    await wait_state(client, "standby")
    world.healthy = False
    await client.post("/prebuild", json=prebuild_body())
    await client.post("/assign", json=assign_body(uri="s3://thaw/models/tuned", engine=ENGINE))
    # Loading until the engine is built, then a swap into it (one engine in all).
    ready = await wait_state(client, "ready")
    assert [c.op for c in world.commands] == ["swap"] and len(world.hosts[0].launches) == 1
    assert ready["load"]["swap"] is True


async def test_an_engine_is_kept_only_when_the_assignment_names_a_class(client: httpx.AsyncClient,
                                                                         world: World) -> None:
    await wait_state(client, "standby")
    await client.post("/assign", json=assign_body(uri="s3://thaw/models/plain", engine=ENGINE))
    ready = await wait_state(client, "ready")
    assert ready["prebuilt"] is None and not world.hosts[0].launches[0].swappable
    await client.post("/release", json={})
    back = await wait_state(client, "standby")
    assert back["prebuilt"] is None and world.commands == [] and len(world.hosts) == 2
