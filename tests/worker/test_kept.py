"""Kept engines (``worker.kept``) driven through their protocol, with the fakes' engine
host and engine: built ahead serving nothing, a model of the class swapped in, parked at
a release; another class or vocabulary stops the engine; a command the engine host never
answers, or answers with a failure, fails the assignment and keeps nothing."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import until
from tests.worker.fakes import LLAMA, FakeHost, World, fake_front_end_fetch
from tests.worker.parts import (
    FakeAgent,
    FakeSupervisor,
    assign_request,
    assignment,
    engine,
    host,
    settings,
)
from thaw.config import EngineArgs
from thaw.engine_class import engine_class_of
from thaw.objstore import S3Endpoint
from thaw.wire import PrebuildRequest
from weight_streaming.manifest import FileEntry, Manifest
from worker.caches import WeightCaches
from worker.engine_start import CurrentEngine
from worker.errors import Conflict
from worker.host import EngineHost
from worker.identity import ModelIdentity
from worker.kept import KeptEngines
from worker.launch import EV_PARKED, EV_SWAP_FAILED, EV_SWAPPED
from worker.state import Prebuilt

ENGINE = {"enforce_eager": True, "cpu_kvcache_gib": 2}
CLASS = engine_class_of(LLAMA, EngineArgs(**ENGINE), max_model_len=512).id  # type: ignore[arg-type]
PORT = 8123


def manifest(uri: str, vocab_sha: str = "v" * 64) -> Manifest:
    files = [FileEntry(path="config.json", size=1, sha256="c" * 64, etag="e"),
             FileEntry(path="tokenizer.json", size=1, sha256=vocab_sha, etag="e")]
    return Manifest(uri=uri, created_at=datetime.now(UTC), files=files, safetensors={}, parameter_count=0,
                    total_bytes=0)


@dataclass
class Kept:
    kept: KeptEngines
    agent: FakeAgent
    supervisor: FakeSupervisor
    host: FakeHost
    engine: CurrentEngine
    world: World
    configs: dict[str, Any]

    async def identity(self, model: str, vocab_sha: str = "v" * 64) -> ModelIdentity | None:
        uri = f"s3://thaw/models/{model}"
        return await self.kept.identity(uri, manifest(uri, vocab_sha), EngineArgs(**ENGINE), 512)  # type: ignore[arg-type]

    async def built(self, model: str = "base") -> Prebuilt:
        """A kept engine of ``model``'s class, built, and an assignment of "demo" loading."""
        ident = await self.identity(model)
        assert ident is not None
        p = Prebuilt(ident.engine_class.id, ident.vocab, model, f"s3://thaw/models/{model}", PORT, built_at=1.0)
        self.agent.record(prebuilt=p, assignment=assignment())
        return p


@pytest.fixture
async def kept(tmp_path: Path) -> AsyncIterator[Kept]:
    world, configs = World(), dict[str, Any]()
    s = settings(tmp_path)
    agent = FakeAgent(s)
    current = engine(world, s)
    parts: dict[str, Any] = {}

    def on_event(_h: EngineHost, ev: dict[str, Any]) -> None:
        if ev["event"] in (EV_SWAPPED, EV_SWAP_FAILED, EV_PARKED):
            parts["kept"].answer(ev)

    def read_config(store: S3Endpoint, uri: str) -> dict[str, Any]:
        if uri in configs and configs[uri] is None:
            raise OSError("no config.json")
        return configs.get(uri, LLAMA)  # type: ignore[no-any-return]

    h = host(world, on_event)
    sup = FakeSupervisor(h)
    k = KeptEngines(agent, supervisor=sup, engine=current, caches=WeightCaches(s, agent.metrics),  # type: ignore[arg-type]
                    clock=time.time, manifest_reader=lambda store, uri: manifest(uri), config_reader=read_config,
                    front_end_fetch=fake_front_end_fetch)
    parts["kept"] = k
    sup.on_gone = k.host_gone
    yield Kept(k, agent, sup, h, current, world, configs)
    await agent.close()


def prebuild_request(**over: Any) -> PrebuildRequest:
    body = {"model": "base", "uri": "s3://thaw/models/base", "served_model_name": "base", "max_model_len": 512,
            "engine": ENGINE, "engine_class": CLASS, **over}
    return PrebuildRequest.model_validate(body)


# -- built ahead ----------------------------------------------------------------------------


async def test_prebuild_builds_a_swappable_engine_that_serves_nothing(kept: Kept) -> None:
    assert await kept.kept.prebuild(prebuild_request())
    p = kept.agent.facts.prebuilt
    assert p is not None and (p.engine_class, p.model, p.built_at) == (CLASS, "base", None)  # building
    await until("the engine built", lambda: (kept.agent.facts.prebuilt or p).built_at is not None)
    cmd = kept.host.launches[0]
    assert (cmd.swappable, cmd.serving, cmd.served_model_name) == (True, False, f"thaw-prebuilt-{CLASS}")
    built = kept.agent.facts.prebuilt
    assert built is not None and built.port == cmd.port and kept.engine.url == f"http://127.0.0.1:{cmd.port}"
    # The same class again: kept already.
    assert not await kept.kept.prebuild(prebuild_request())


async def test_prebuild_is_refused_unless_standing_by_with_no_engine(kept: Kept) -> None:
    kept.agent.record(assignment=assignment())
    with pytest.raises(Conflict, match="worker is loading; it builds an engine only standing by") as exc:
        await kept.kept.prebuild(prebuild_request())
    assert exc.value.state.value == "loading"
    kept.agent.record(assignment=None)
    kept.host.launched = True  # serving an engine of its own
    with pytest.raises(Conflict):
        await kept.kept.prebuild(prebuild_request())
    kept.host.launched = False
    kept.agent.record(prebuilt=Prebuilt("other-class", "v", "x", "s3://thaw/models/x", 1, 1.0))
    with pytest.raises(Conflict, match="keeps an engine already"):
        await kept.kept.prebuild(prebuild_request())


async def test_a_model_whose_config_cannot_be_read_builds_nothing_and_says_why(kept: Kept) -> None:
    kept.configs["s3://thaw/models/base"] = None
    assert await kept.kept.prebuild(prebuild_request())
    await until("the failure", lambda: kept.agent.facts.failure)
    assert kept.agent.facts.failure == ("cannot build an engine for base: its manifest or config.json could not "
                                        "be read")
    assert kept.agent.facts.prebuilt is None and kept.host.launches == []


# -- swapped into -----------------------------------------------------------------------------


async def test_a_model_of_the_class_is_swapped_into_the_kept_engine(kept: Kept) -> None:
    await kept.built()
    kept.world.healthy = True
    a, req = assignment(), assign_request()
    assert await kept.kept.swap_if_it_fits(a, req, await kept.identity("demo"), manifest(req.uri))
    (cmd,) = kept.world.commands
    assert (cmd.op, cmd.swap_id, cmd.uri, cmd.served_model_name) == ("swap", "a1", req.uri, "demo-chat")
    f = kept.agent.facts
    assert f.prebuilt is not None and (f.prebuilt.model, f.prebuilt.uri) == ("demo", req.uri)
    assert f.load is not None and f.load.swap and f.engine_ready_at is not None
    assert kept.supervisor.replaced == [] and kept.engine.url == f"http://127.0.0.1:{PORT}"


@pytest.mark.parametrize(("case", "config", "vocab"), [
    ("another class", {**LLAMA, "hidden_size": 512}, "v" * 64),
    ("another vocabulary", LLAMA, "w" * 64),
    ("class unknown", None, "v" * 64),
])
async def test_a_model_that_does_not_fit_stops_the_kept_engine(kept: Kept, case: str, config: dict[str, Any] | None,
                                                               vocab: str) -> None:
    await kept.built()
    kept.configs["s3://thaw/models/demo"] = config
    ident = await kept.identity("demo", vocab)
    assert not await kept.kept.swap_if_it_fits(assignment(), assign_request(), ident)
    # Stopped at once (no grace: it served nothing), and with its host, nothing is kept.
    assert kept.supervisor.replaced == [False] and kept.agent.facts.prebuilt is None
    assert kept.world.commands == [] and kept.agent.failures == []


async def test_a_failed_swap_fails_the_assignment(kept: Kept) -> None:
    await kept.built()
    kept.world.on_swap = "weights"
    assert not await kept.kept.swap_if_it_fits(assignment(), assign_request(), await kept.identity("demo"))
    assert kept.agent.failures == [
        ("swapping the model into the engine failed (weights): ChecksumMismatch: sha256 of model.safetensors "
         "differs", "engine")]


async def test_a_swap_the_engine_host_never_answers_fails_after_the_load_timeout(kept: Kept) -> None:
    await kept.built()
    kept.agent.settings = replace(kept.agent.settings, load_timeout_s=0.05)

    async def silent(cmd: Any) -> None:
        kept.world.commands.append(cmd)

    kept.host.command = silent  # type: ignore[method-assign]
    assert not await kept.kept.swap_if_it_fits(assignment(), assign_request(), await kept.identity("demo"))
    assert kept.agent.failures == [("swapping the model into the engine failed (engine): no answer within 0 s",
                                    "engine")]


async def test_without_an_engine_host_a_swap_fails_at_once(kept: Kept) -> None:
    await kept.built()
    kept.supervisor.host = None
    assert not await kept.kept.swap_if_it_fits(assignment(), assign_request(), await kept.identity("demo"))
    assert kept.agent.failures == [("swapping the model into the engine failed (engine): no engine host", "engine")]


# -- parked ----------------------------------------------------------------------------------


async def test_park_keeps_the_engine_with_its_steps(kept: Kept) -> None:
    await kept.built()
    assert await kept.kept.park()
    (cmd,) = kept.world.commands
    assert (cmd.op, cmd.swap_id) == ("park", "park-a1")
    p = kept.agent.facts.prebuilt
    assert p is not None and p.park_steps_s == {"prefix_cache_s": 0.002, "total_s": 0.002}


async def test_nothing_built_or_no_host_is_nothing_to_park(kept: Kept) -> None:
    kept.agent.record(assignment=assignment())
    assert not await kept.kept.park()  # no kept engine
    await kept.built()
    kept.host.exit(-9)
    assert not await kept.kept.park()  # its host is gone
    assert kept.world.commands == []


async def test_a_park_waiting_when_the_host_goes_gets_its_answer_then(kept: Kept) -> None:
    await kept.built()

    async def silent(cmd: Any) -> None:
        kept.world.commands.append(cmd)

    kept.host.command = silent  # type: ignore[method-assign]
    parking = kept.agent.spawn(kept.kept.park(), name="park")
    await until("the park command sent", lambda: kept.world.commands)
    kept.kept.host_gone()
    assert not await parking
    assert kept.agent.facts.prebuilt is None
