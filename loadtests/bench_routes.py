"""`thaw bench routes`: the route table at fleet size: how long the controller takes to
build it, and how many bytes an activator's long poll carries for one change (a full
table or a delta).

    thaw bench routes [--out bench_routes.json] [--sizes 100x10 1000x100 10000x1000] [--repeat 5]
    (or python -m loadtests.bench_routes ...)

No network and no controller: a synthetic config and fleet handed straight to
``warm_pool.routes`` (every tenth model a LoRA adapter of the one before; one worker in
ten loading, one in ten standing by, the rest serving one model each, with its adapter
where it has one). Prints one JSON line per size:

- ``route_table_ms``: the median of ``--repeat`` builds of the whole table, every route
  anew (as at a controller's start);
- ``route_table_steady_ms``: the same with the last table given and nothing changed (a
  tick's build: each route reused);
- ``full_bytes``: the JSON of the whole table, as a first poll gets it;
- ``delta_bytes``: the JSON of the answer to a poll one version back after one replica
  became ready (a loading worker's model), when the feed answers with deltas;
- ``publish_unchanged_ms``: publishing a tick's table with nothing changed (the feed
  compares it with the last, model by model: here each an identity check).
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
        state = WorkerState.LOADING if i % 10 == 1 else WorkerState.STANDBY if i % 10 == 2 else WorkerState.READY
        wid, model = f"w{i:05d}", None if state is WorkerState.STANDBY else bases[i % len(bases)]
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


def build_ms(cfg: ThawConfig, facts: dict[str, WorkerFacts], views: dict[str, WorkerView], repeat: int,
             *, steady: bool = False) -> float:
    """The median build of the whole table: anew, or (``steady``) with the last table
    given, as the controller's tick does, nothing having changed."""
    state = PolicyState()
    previous = route_table(cfg, facts, views, state, NOW) if steady else None
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        route_table(cfg, facts, views, state, NOW, previous=previous)
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
    full, delta = feed.answer(-1, None), feed.answer(before, feed.epoch, delta=True)
    # A tick with nothing changed: the table built with the last one given, compared with it.
    models = route_table(cfg, facts, views, state, NOW, previous=feed.table.models)
    t0 = time.perf_counter()
    await feed.publish(models, activators=1, keys_version=0)
    return {"version_moved": feed.table.version == before + 1, "publish_unchanged_ms":
            round((time.perf_counter() - t0) * 1000, 2), "full_bytes": len(full.body()),
            "delta_bytes": len(delta.body()), "delta_models": len(delta.models)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="FILE", type=Path, default=Path("bench_routes.json"))
    p.add_argument("--sizes", nargs="+", default=["100x10", "1000x100", "10000x1000"],
                   help="MODELSxWORKERS at each size (default 100x10 1000x100 10000x1000)")
    p.add_argument("--repeat", type=int, default=5, help="builds timed per size (the median is reported)")


def run(args: argparse.Namespace) -> int:
    sizes = []
    for size in args.sizes:
        models, workers = (int(x) for x in size.lower().split("x"))
        cfg = config(models)
        facts, views = fleet(cfg, workers)
        out: dict[str, Any] = {
            "models": models, "workers": workers,
            "route_table_ms": round(build_ms(cfg, facts, views, args.repeat), 2),
            "route_table_steady_ms": round(build_ms(cfg, facts, views, args.repeat, steady=True), 2)}
        out.update(asyncio.run(wire_bytes(cfg, facts, views)))
        print(json.dumps(out), flush=True)
        sizes.append(out)
    args.out.write_text(json.dumps({"sizes": sizes}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(p)
    raise SystemExit(run(p.parse_args()))
