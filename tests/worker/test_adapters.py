"""LoRA adapters in a worker's engine (``worker.adapters``), with a fake engine host and
engine: loaded only into a ready engine started with LoRA, within its max_loras; an
unload waits for the adapter's requests; a failed fetch is shown; a release takes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.waiting import until
from tests.worker.fakes import World, agent_client, ready, wait_state

LORA = {"enforce_eager": True, "cpu_kvcache_gib": 2,
        "extra": {"enable_lora": True, "max_loras": 2, "max_lora_rank": 8}}


def adapter(name: str) -> dict[str, Any]:
    return {"model": name, "uri": f"s3://thaw/adapters/{name}", "served_model_name": f"{name}-chat"}


def fetcher(seen: list[str], fail: bool = False) -> Any:
    def fetch(client: Any, uri: str, dest: Path) -> Path:
        seen.append(uri)
        if fail:
            raise FileNotFoundError(f"no thaw-manifest.json at {uri}")
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "adapter_config.json").write_text("{}")
        return dest
    return fetch


async def adapter_state(c: httpx.AsyncClient, name: str, *states: str | None, timeout_s: float = 5.0) -> dict[str, Any]:
    last: list[Any] = [None]

    async def reached() -> dict[str, Any] | None:
        st = (await c.get("/state")).json()
        last[0] = got = next((a for a in st["adapters"] if a["model"] == name), None)
        return st if (got["state"] if got else None) in states else None

    st: dict[str, Any] = await until(f"adapter {name} in {states}", reached, timeout_s, interval_s=0.005,
                                     detail=lambda: f"adapter {name}: {last[0]}")
    return st


async def test_an_adapter_is_fetched_and_loaded_under_its_served_name(tmp_path: Path) -> None:
    world, seen = World(), []
    async with agent_client(world, tmp_path, adapter_fetch=fetcher(seen)) as c:
        await ready(c, engine=LORA)
        r = await c.post("/adapters", json=adapter("a1"))
        assert r.status_code == 202 and r.json()["adapters"][0]["state"] == "loading"
        await adapter_state(c, "a1", "ready")
        assert seen == ["s3://thaw/adapters/a1"] and world.lora_calls == [("load", "a1-chat")]
        assert Path(world.loras["a1-chat"]).parent == tmp_path / "adapters"
        # Again: nothing to do.
        assert (await c.post("/adapters", json=adapter("a1"))).status_code == 200
        assert world.lora_calls == [("load", "a1-chat")]


async def test_no_adapter_without_lora_or_beyond_max_loras(tmp_path: Path) -> None:
    async with agent_client(World(), tmp_path, adapter_fetch=fetcher([])) as c:
        await wait_state(c, "standby")
        r = await c.post("/adapters", json=adapter("a1"))
        assert r.status_code == 409 and "only into a ready engine" in r.json()["error"]
        await ready(c)
        r = await c.post("/adapters", json=adapter("a1"))
        assert r.status_code == 409 and "not started with LoRA" in r.json()["error"]
    async with agent_client(World(), tmp_path / "2", adapter_fetch=fetcher([])) as c:
        await ready(c, engine=LORA)
        for name in ("a1", "a2"):
            assert (await c.post("/adapters", json=adapter(name))).status_code == 202
        r = await c.post("/adapters", json=adapter("a3"))
        assert r.status_code == 409 and "holds 2 adapters, its max_loras is 2" in r.json()["error"]


async def test_an_unload_waits_for_the_adapters_requests(tmp_path: Path) -> None:
    world = World()
    async with agent_client(world, tmp_path, adapter_fetch=fetcher([])) as c:
        await ready(c, engine=LORA)
        await c.post("/adapters", json=adapter("a1"))
        await adapter_state(c, "a1", "ready")
        # vLLM reports a1's requests running for three readings, then none.
        world.lora_busy = [{"a1-chat"}, {"a1-chat"}, {"a1-chat", "other"}, {"other"}]
        r = await c.post("/adapters/unload", json={"model": "a1"})
        assert r.status_code == 202 and r.json()["adapters"][0]["state"] == "unloading"
        await adapter_state(c, "a1", None)
        assert world.lora_calls[-1] == ("unload", "a1-chat") and not world.lora_busy[:-1]
        assert not (tmp_path / "adapters").exists() or not any((tmp_path / "adapters").iterdir())
        # Not there: nothing to do.
        assert (await c.post("/adapters/unload", json={"model": "a1"})).status_code == 200


async def test_a_failed_fetch_is_shown_and_an_unload_clears_it(tmp_path: Path) -> None:
    async with agent_client(World(), tmp_path, adapter_fetch=fetcher([], fail=True)) as c:
        await ready(c, engine=LORA)
        await c.post("/adapters", json=adapter("a1"))
        st = await adapter_state(c, "a1", "failed")
        assert "no thaw-manifest.json" in st["adapters"][0]["error"]
        assert (await c.post("/adapters/unload", json={"model": "a1"})).status_code == 202
        await adapter_state(c, "a1", None)


async def test_a_release_takes_the_adapters_with_the_engine(tmp_path: Path) -> None:
    world = World()
    async with agent_client(world, tmp_path, adapter_fetch=fetcher([])) as c:
        await ready(c, engine=LORA)
        await c.post("/adapters", json=adapter("a1"))
        await adapter_state(c, "a1", "ready")
        await c.post("/release", json={"drain_timeout_s": 1})
        st = await wait_state(c, "standby")
        assert st["adapters"] == []
