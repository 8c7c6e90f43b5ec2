"""The controller with the ec2 provider against moto (server mode, the real wire), and a
real `thaw worker` process that stands in for the booted instance: it registers with
the moto instance id the controller launched.

- the standby fleet is launched from the template, tagged;
- a restarted controller with instances present launches none and keeps the worker;
- an instance that never registers is terminated after ``boot_timeout_s`` and replaced;
- a heartbeat from an instance id the provider does not know is refused (403).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.waiting import until
from tests.warm_pool.in_process import serve, steps_pass
from tests.warm_pool.moto_ec2 import TOKEN_PARAM, Aws, NoCapacity
from thaw.config import ThawConfig, parse_config
from thaw.embedded_store import free_port
from thaw.process import stop_group
from thaw.wire import BudgetChange, WorkerState, WorkerStatus
from warm_pool.app import create_pool_app
from warm_pool.assembly import build_pool
from warm_pool.fleet.control import HttpWorkerControl
from warm_pool.manager import PoolManager

pytestmark = pytest.mark.integration

TOKEN = "moto-fleet-token"


def config(aws: Aws, data_dir: Path, controller_port: int, boot_timeout_s: float = 600) -> dict[str, Any]:
    return {
        "data_dir": str(data_dir),
        "cluster": {"name": aws.cluster, "token": TOKEN, "token_ssm_parameter": TOKEN_PARAM,
                    "heartbeat_interval_s": 0.5, "worker_timeout_s": 10},
        "controller": {"port": controller_port, "url": f"http://127.0.0.1:{controller_port}"},
        "object_store": {"kind": "s3", "endpoint_url": "http://127.0.0.1:9", "credentials": {"source": "env"}},
        # A CPU shape, so that a real worker process can stand in for the GPU instance.
        "shapes": [{"name": "gpu", "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8,
                    "price_per_hour_usd": 1.0, "boot_timeout_s": boot_timeout_s}],
        "pools": [{"shape": "gpu", "provider": "ec2", "standby_min": 1, "standby_max": 1, "max_instances": 2,
                   "ec2": aws.pool().model_dump(mode="json")}],
    }


@asynccontextmanager
async def controller(cfg: ThawConfig, aws: Aws, port: int, **provider_kw: Any) -> AsyncIterator[PoolManager]:
    provider = aws.provider(aws.pool(), **provider_kw)
    m = build_pool(cfg, {"gpu": provider}, HttpWorkerControl(TOKEN), poll_interval_s=0.1,
                   refresh_interval_s=0.5)
    server, task = await serve(create_pool_app(m, TOKEN), port)
    try:
        yield m
    finally:
        await m.stop_deciding()
        server.should_exit = True
        await task


@contextmanager
def worker_process(cfg_path: Path, instance_id: str, worker_id: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "thaw.cli.main", "worker", "--config", str(cfg_path), "--shape", "gpu",
             "--instance-id", instance_id, "--worker-id", worker_id, "--port", str(free_port()),
             "--data-dir", str(cfg_path.parent / "workers" / worker_id)],
            stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        stop_group(proc, 30)


def live(aws: Aws) -> list[dict[str, Any]]:
    return [i for i in aws.described() if i["State"]["Name"] in ("pending", "running")]


def tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


async def test_restart_with_instances_present_launches_none(aws: Aws, tmp_path: Path) -> None:
    port = free_port()
    raw = config(aws, tmp_path, port)
    cfg = parse_config(raw)
    cfg_path = tmp_path / "thaw.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    with contextlib.ExitStack() as processes:
        async with controller(cfg, aws, port) as a:
            await until("the standby launch", lambda: len(live(aws)) == 1)
            inst = live(aws)[0]
            t = tags(inst)
            assert t["thaw:cluster"] == aws.cluster and t["thaw:shape"] == "gpu" and t["thaw:pool"] == "gpu"
            worker_id, instance_id = t["thaw:worker-id"], inst["InstanceId"]
            proc = processes.enter_context(worker_process(cfg_path, instance_id, worker_id, tmp_path / "worker.log"))
            # The booted instance registers: the controller hears it (under its moto id).
            await until("the worker's heartbeat", lambda: a.fleet.facts.get(worker_id) is not None
                        and a.fleet.facts[worker_id].status is not None, timeout_s=60)
            assert [w.instance_id for w in a.status().workers] == [instance_id]
            epoch = a.epoch
        # The controller is gone; the worker keeps running. A new one starts.
        async with controller(cfg, aws, port) as b:
            await until("adopted", lambda: b.adopted)
            await until("the worker heard again", lambda: b.fleet.facts.get(worker_id) is not None
                        and b.fleet.facts[worker_id].status is not None, timeout_s=30)
            await steps_pass(b, 10)  # several turns after adoption
            assert b.epoch != epoch and proc.poll() is None
            assert [i["InstanceId"] for i in live(aws)] == [instance_id]
            assert not [e for e in b.parts.event_log.events if e.kind in ("launch", "terminate")]
            row = b.status().workers[0]
            assert (row.id, row.instance_id) == (worker_id, instance_id)
            assert row.state.value in ("starting", "standby")


async def test_an_instance_that_never_registers_is_terminated_and_replaced(aws: Aws, tmp_path: Path) -> None:
    port = free_port()
    cfg = parse_config(config(aws, tmp_path, port, boot_timeout_s=2))
    async with controller(cfg, aws, port) as m:
        await until("the standby launch", lambda: len(live(aws)) == 1)
        first = live(aws)[0]["InstanceId"]
        # 2 s without a heartbeat: terminated, and another launched in its place.
        await until("the replacement", lambda: [i["InstanceId"] for i in live(aws)] not in ([], [first]),
                    timeout_s=30)
        states = {i["InstanceId"]: i["State"]["Name"] for i in aws.described()}
        assert states[first] in ("shutting-down", "terminated")
        ev = next(e for e in m.parts.event_log.events if e.kind == "terminate")
        assert ev.reason == "unreachable" and ev.worker_id is not None


async def test_an_unknown_instance_ids_heartbeat_is_refused(aws: Aws, tmp_path: Path) -> None:
    port = free_port()
    raw = config(aws, tmp_path, port)
    raw["pools"][0].update({"standby_min": 0, "standby_max": 0})
    cfg_path = tmp_path / "thaw.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    log = tmp_path / "stranger.log"
    async with controller(parse_config(raw), aws, port) as m:
        with worker_process(cfg_path, "i-0123456789abcdef0", "w-stranger", log):
            await until("the refusal", lambda: log.exists() and "heartbeat_refused" in log.read_text(),
                        timeout_s=60)
            assert '"status": 403' in log.read_text()
            assert "w-stranger" not in m.fleet.facts and m.status().workers == []
        async with httpx.AsyncClient() as http:
            r = await http.get(f"http://127.0.0.1:{port}/v1/state", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.json()["workers"] == []


async def test_no_capacity_anywhere_backs_the_shape_off(aws: Aws, tmp_path: Path) -> None:
    port = free_port()
    raw = config(aws, tmp_path, port)
    raw["pools"][0]["ec2"].update({"backoff_base_s": 2, "backoff_max_s": 60})
    nocap = NoCapacity(lambda subnet, itype, market: True)
    async with controller(parse_config(raw), aws, port, on_client=nocap.register) as m:
        # Both subnets x both instance types, on-demand: 4 tries, then the shape backs off.
        await until("the first failed launch", lambda: any(e.outcome == "failed" for e in m.parts.event_log.events))
        assert len(nocap.attempts) == 4 and live(aws) == []
        row = m.status().shapes[0]
        assert row.backoff_until is not None and row.backoff_until - time.time() <= 2
        assert "InsufficientInstanceCapacity" in (row.backoff_reason or "")
        assert row.provider_status["outcome"] == "no_capacity"
        # Within the backoff nothing is tried; after it, one more round (then 4 s).
        await asyncio.sleep(1.0)  # quiet: within the backoff nothing is tried
        assert len(nocap.attempts) == 4
        await until("the retry after the backoff", lambda: len(nocap.attempts) == 8, timeout_s=10)
        await until("the second failure", lambda: sum(e.outcome == "failed" for e in m.parts.event_log.events) == 2)
        row = m.status().shapes[0]
        assert row.backoff_until is not None and 2 < row.backoff_until - time.time() <= 4


async def test_excess_standby_is_stopped_then_started_again_before_any_launch(aws: Aws, tmp_path: Path) -> None:
    port = free_port()
    raw = config(aws, tmp_path, port)
    raw["pools"][0].update({"standby_min": 2, "standby_max": 2, "max_instances": 3,
                            "stopped_standby_min": 0, "stopped_standby_max": 1})
    async with controller(parse_config(raw), aws, port) as m:
        await until("two standby instances", lambda: len(live(aws)) == 2)

        async def booted() -> None:
            # What the worker on each running instance says once it stands by.
            while True:
                for inst in live(aws):
                    wid = tags(inst)["thaw:worker-id"]
                    m.heartbeat(WorkerStatus(worker_id=wid, instance_id=inst["InstanceId"], shape="gpu",
                                             state=WorkerState.STANDBY, control_url="http://127.0.0.1:9",
                                             started_at=0, state_since=0))
                await asyncio.sleep(0.3)  # not a poll: the workers' heartbeat interval

        beats = asyncio.create_task(booted())
        try:
            await until("both standing by", lambda: list(
                v.state.value for v in m.fleet.views(time.time()).values()) == ["standby", "standby"])
            await m.parts.budgets.change(BudgetChange(shape="gpu", standby_min=1, standby_max=1), "test")
            # One too many: stopped (storage only), not terminated.
            await until("one stopped", lambda: [i["State"]["Name"] for i in aws.described()].count("stopped") == 1)
            assert len(live(aws)) == 1 and not [e for e in m.parts.event_log.events if e.kind == "terminate"]
            stopped_id = next(i["InstanceId"] for i in aws.described() if i["State"]["Name"] == "stopped")
            await until("the view says stopped",
                        lambda: "stopped" in {v.state.value for v in m.fleet.views(time.time()).values()})
            # Wanted again: the stopped one is started; nothing is launched.
            await m.parts.budgets.change(BudgetChange(shape="gpu", standby_min=2, standby_max=2), "test")
            await until("started again", lambda: len(live(aws)) == 2)
        finally:
            beats.cancel()
        assert stopped_id in [i["InstanceId"] for i in live(aws)] and len(aws.described()) == 2
        kinds = [e.kind for e in m.parts.event_log.events]
        assert kinds.count("launch") == 2 and "stop" in kinds and "start" in kinds
