"""The route table at fleet size: how long the controller takes to build it, and how many
bytes an activator's long poll carries for one change (a full table or a delta).

    python -m loadtests.bench_routes [--sizes 100x10 1000x100 10000x1000] [--repeat 5]

No network and no controller: a synthetic config and fleet handed straight to
``warm_pool.routes`` (every tenth model a LoRA adapter of the one before; one worker in
ten loading, one in ten standing by, the rest serving one model each, with its adapter
where it has one). Prints one JSON line per size:

- ``route_table_ms``: the median of ``--repeat`` builds of the whole table;
- ``full_bytes``: the JSON of the whole table, as a first poll gets it;
- ``delta_bytes``: the JSON of the answer to a poll one version back after one replica
  became ready (a loading worker's model), when the feed answers with deltas.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from thaw.config import ThawConfig, parse_config
from thaw.wire import AdapterView, Phases, WorkerState, WorkerStatus
from warm_pool.fleet.view import WorkerFacts
from warm_pool.policy.decide import PolicyState, WorkerView
from warm_pool.routes import RouteFeed, route_table

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "thaw.yaml"
NOW = 1_000_000.0


def config(models: int) -> ThawConfig:
    """The example config with ``models`` models (every tenth an adapter of the one before)."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["data_dir"] = "/tmp/unused"
    data["models"] = [
        {"name": f"m{i}", "base": f"m{i - 1}", "adapter_uri": f"s3://thaw/adapters/m{i}"} if i % 10 == 9
        else {"name": f"m{i}", "uri": f"s3://thaw/models/m{i}", "shape": "cpu-local"}
        for i in range(models)]
    return parse_config(data)


def fleet(cfg: ThawConfig, workers: int) -> tuple[dict[str, WorkerFacts], dict[str, WorkerView]]:
    """``workers`` workers over the config's base models: most serving, some loading or idle."""
    bases = [m.name for m in cfg.models if m.base is None]
    facts, views = {}, {}
    for i in range(workers):
        wid, model = f"w{i:05d}", bases[i % len(bases)]
        state = WorkerState.LOADING if i % 10 == 1 else WorkerState.STANDBY if i % 10 == 2 else WorkerState.READY
        if state is WorkerState.STANDBY:
            model = None
        ready = state is WorkerState.READY
        j = int(model[1:]) if model else -1
        adapters = [(f"m{j + 1}", "ready")] if ready and j % 10 == 8 and j + 1 < len(cfg.models) else []
        facts[wid], views[wid] = worker(wid, state, model, adapters)
    return facts, views


def worker(wid: str, state: WorkerState, model: str | None,
           adapters: list[tuple[str, str]]) -> tuple[WorkerFacts, WorkerView]:
    """One worker's facts (its last status) and view."""
    ready = state is WorkerState.READY
    aid = f"{model}-{wid}" if model else None
    status = WorkerStatus(
        worker_id=wid, instance_id=f"i-{wid}", shape="cpu-local", state=state, control_url=f"http://{wid}:9000",
        model=model, assignment_id=aid, engine_url=f"http://{wid}:9001" if ready else None, served_model_name=model,
        started_at=NOW - 100, state_since=NOW - 10,
        phases=Phases(assigned=NOW - 20, weights_loaded=NOW - 12, engine_ready=NOW - 10) if ready else Phases(),
        adapters=[AdapterView(model=a, served_model_name=a, state="ready", since=NOW - 5, requested_at=NOW - 6)
                  for a, _ in adapters])
    view = WorkerView(id=wid, shape="cpu-local", state=state, model=model, assignment_id=aid, since=NOW - 10,
                      adapters=tuple(adapters))
    return WorkerFacts(worker_id=wid, shape="cpu-local", status=status, heard_at=NOW), view


def build_ms(cfg: ThawConfig, facts: dict[str, WorkerFacts], views: dict[str, WorkerView], repeat: int) -> float:
    state = PolicyState()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        route_table(cfg, facts, views, state, NOW)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


async def wire_bytes(cfg: ThawConfig, facts: dict[str, WorkerFacts], views: dict[str, WorkerView]) -> dict[str, Any]:
    """The full table's JSON, and the answer to a poll one version back after one loading
    worker's replica became ready."""
    feed = RouteFeed("bench")
    state = PolicyState()
    await feed.publish(route_table(cfg, facts, views, state, NOW), activators=1, keys_version=0)
    before = feed.table.version
    wid = next(w for w, v in views.items() if v.state is WorkerState.LOADING)
    facts[wid], views[wid] = worker(wid, WorkerState.READY, views[wid].model, [])
    await feed.publish(route_table(cfg, facts, views, state, NOW), activators=1, keys_version=0)
    full = await feed.wait(-1, None, 0.0)
    answer = await feed.wait(before, feed.epoch, 0.0, delta=True) if hasattr(feed, "delta") else full
    assert full is not None and answer is not None
    return {"version_moved": feed.table.version == before + 1, "full_bytes": len(full.model_dump_json()),
            "delta_bytes": len(answer.model_dump_json()), "delta_models": len(answer.models)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["100x10", "1000x100", "10000x1000"], help="MODELSxWORKERS")
    p.add_argument("--repeat", type=int, default=5, help="builds timed per size (the median is reported)")
    args = p.parse_args()
    for size in args.sizes:
        models, workers = (int(x) for x in size.split("x"))
        cfg = config(models)
        facts, views = fleet(cfg, workers)
        out = {"models": models, "workers": workers, "route_table_ms": round(build_ms(cfg, facts, views, args.repeat), 2)}
        out.update(asyncio.run(wire_bytes(cfg, facts, views)))
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
