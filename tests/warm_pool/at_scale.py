"""The control plane at fleet size in one process, for the tests of issue 45's sizes: a
config of a thousand models on one pool, the simulated fleet (loadtests/sim_fleet.py:
workers that speak the worker protocol, their engines simulated) heartbeating to the
in-process controller (tests/warm_pool/in_process.py), and an activator's real app on a
loopback port, all on the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from activator.app import create_app
from loadtests.sim_fleet import SimFleet
from tests.warm_pool.in_process import EXAMPLE, TOKEN, serving
from thaw.config import ThawConfig, hash_api_key, parse_config
from thaw.embedded_store import free_port
from thaw.wire import RouteTable

SHAPE = "cpu-local"  # the example's pool, its provider replaced by the static one
API_KEY = "scale-test-key"


def name(i: int) -> str:
    return f"m{i:04d}"


def served(model: str) -> str:
    """The name clients send for ``model`` (and its engine streams back)."""
    return f"{model}-chat"


def scale_config(data_dir: Path, *, models: int, workers: int, idle_grace_s: float,
                 heartbeat_s: float = 2.0) -> ThawConfig:
    """``models`` copies of the example's model (``m0000``...), each at most one replica,
    on one pool of the ``workers`` that register themselves: its standby band and cap the
    fleet's size, so the controller launches nothing and every worker stands by until
    assigned. Workers are found dead only after 30 s: a loaded two-core machine may hold
    a heartbeat up for seconds, and these tests are not about dead workers."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["data_dir"] = str(data_dir)
    data["cluster"] = {"heartbeat_interval_s": heartbeat_s, "worker_timeout_s": 30.0}
    data["ledger"]["ship"] = False
    demo = data["models"][0]
    demo.pop("demo_if_missing")
    demo["autoscaling"].update({"idle_grace_s": idle_grace_s, "activation_timeout_s": 120, "max_replicas": 1})
    data["models"] = [{**copy.deepcopy(demo), "name": name(i), "served_name": served(name(i)),
                       "uri": f"s3://thaw/models/{name(i)}"} for i in range(models)]
    data["pools"][0].update({"standby_min": workers, "standby_max": workers, "max_instances": workers})
    data["tenants"] = [{"name": "scale", "api_key_hashes": [hash_api_key(API_KEY)], "allowed_models": ["*"]}]
    return parse_config(data)


@contextlib.asynccontextmanager
async def sim_fleet(controller_url: str, workers: int, **kw: Any) -> AsyncIterator[SimFleet]:
    """``workers`` simulated workers of the pool's shape, heartbeating to ``controller_url``
    (``URL[,URL]``: to the leader), served on a loopback port until the block ends."""
    fleet = SimFleet(free_port(), controller_url, TOKEN, workers=workers, shape=SHAPE, **kw)
    ready = asyncio.Event()
    task = asyncio.create_task(fleet.serve(ready))
    await asyncio.wait_for(ready.wait(), 10)
    try:
        yield fleet
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def activator(cfg: ThawConfig, controller_url: str) -> AsyncIterator[str]:
    """The activator's app (`thaw activator`'s, its route feed and reports to
    ``controller_url`` with the cluster token) on a loopback port: its base URL."""
    async with serving(create_app(cfg, controller_url, activator_id="scale-act", token=TOKEN)) as url:
        yield url


def ready_replicas(table: RouteTable | None) -> set[tuple[str, str, str, str | None]]:
    """A route table's ready replicas as (model, worker, engine URL, assignment id)."""
    if table is None:
        return set()
    return {(m, r.worker_id, r.url, r.assignment_id) for m, route in table.models.items() for r in route.replicas}
