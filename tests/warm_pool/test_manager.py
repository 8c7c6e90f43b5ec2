"""The controller's manager with fakes of its small protocols (a provider, the worker
control) and a clock the test steps: restarts, registration, boot timeouts, capacity
backoff. The same manager over HTTP is in test_controller.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from tests.warm_pool.in_process import EXAMPLE, FakeStoreReader
from thaw.config import ThawConfig, parse_config
from thaw.engine_class import engine_class_of
from thaw.units import GiB
from thaw.wire import (
    AdapterRequest,
    AdapterUnload,
    AdapterView,
    AssignRequest,
    ModelSpec,
    ModelUpdate,
    Phases,
    PrebuildRequest,
    PrebuiltView,
    ReleaseRequest,
    SleepRequest,
    WorkerState,
    WorkerStatus,
)
from warm_pool.assembly import build_pool
from warm_pool.classes import ModelClasses
from warm_pool.fleet.actuator import assign_request
from warm_pool.fleet.control import ControlError
from warm_pool.fleet.facts import UnknownInstance
from warm_pool.manager import PoolManager
from warm_pool.policy.decide import ModelActivity
from warm_pool.policy.evict import CAPACITY_GRACE_S
from warm_pool.providers.provider import CapacityError, Instance, InstanceState
from warm_pool.providers.static import StaticProvider

S = WorkerState


class Clock:
    def __init__(self, t: float = 10_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class FakeProvider:
    clock: Clock
    kind: str = "ec2"
    running: dict[str, Instance] = field(default_factory=dict)
    launches: list[str] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)
    # Launches that raise CapacityError, counted down.
    no_capacity: int = 0

    async def launch(self, shape: str, worker_id: str, *, term: int | None = None) -> Instance:
        self.launches.append(worker_id)
        if self.no_capacity:
            self.no_capacity -= 1
            raise CapacityError(shape, f"no {shape} capacity in any subnet")
        inst = Instance(f"i-{worker_id}", worker_id, shape, self.clock(), InstanceState.RUNNING)
        self.running[worker_id] = inst
        return inst

    async def instances(self) -> list[Instance]:
        return list(self.running.values())

    async def terminate(self, instance_id: str) -> None:
        self.terminated.append(instance_id)
        self.running = {w: i for w, i in self.running.items() if i.instance_id != instance_id}

    async def stop(self, instance_id: str) -> None: ...
    async def start(self, instance_id: str) -> None: ...
    async def close(self) -> None: ...


@dataclass
class FakeControl:
    """Workers that do what they are told at once (their answer is their new status)."""

    clock: Clock
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    refuse_pack: bool = False

    def _status(self, url: str, state: WorkerState, **kw: Any) -> WorkerStatus:
        wid = url.removeprefix("http://")
        return WorkerStatus(worker_id=wid, instance_id=f"i-{wid}", shape="gpu", state=state, control_url=url,
                            started_at=0.0, state_since=self.clock(), **kw)

    async def assign(self, control_url: str, req: AssignRequest) -> WorkerStatus:
        self.calls.append(("assign", control_url, req))
        return self._status(control_url, S.LOADING, model=req.model, assignment_id=req.assignment_id)

    async def release(self, control_url: str, req: ReleaseRequest) -> WorkerStatus:
        self.calls.append(("release", control_url, req))
        return self._status(control_url, S.DRAINING)

    async def sleep(self, control_url: str, req: SleepRequest) -> WorkerStatus:
        self.calls.append(("sleep", control_url, req))
        return self._status(control_url, S.ASLEEP)

    async def prebuild(self, control_url: str, req: PrebuildRequest) -> WorkerStatus:
        self.calls.append(("prebuild", control_url, req))
        return self._status(control_url, S.STANDBY, prebuilt=PrebuiltView(
            engine_class=req.engine_class, model=req.model, state="building"))

    async def load_adapter(self, control_url: str, req: AdapterRequest) -> WorkerStatus:
        self.calls.append(("load_adapter", control_url, req))
        return self._status(control_url, S.READY, model="demo", assignment_id="demo-1", engine_url="http://e:1",
                            adapters=[AdapterView(model=req.model, served_model_name=req.served_model_name,
                                                  state="loading", since=self.clock(),
                                                  requested_at=self.clock())])

    async def unload_adapter(self, control_url: str, req: AdapterUnload) -> WorkerStatus:
        self.calls.append(("unload_adapter", control_url, req))
        return self._status(control_url, S.READY, model="demo", assignment_id="demo-1", engine_url="http://e:1")

    async def pack(self, control_url: str, req: AssignRequest) -> WorkerStatus:
        self.calls.append(("pack", control_url, req))
        if self.refuse_pack:
            raise ControlError("/engines refused (409): does not fit", 409)
        host = control_url.removeprefix("http://")
        assert req.engine_id is not None
        return WorkerStatus(worker_id=req.engine_id, instance_id=f"i-{host}", shape="gpu", state=S.LOADING,
                            control_url=f"{control_url}/engines/{req.engine_id}", started_at=self.clock(),
                            state_since=self.clock(), model=req.model, assignment_id=req.assignment_id,
                            memory_bytes=req.memory_bytes, host_worker_id=host)

    def fence(self, term: Any, until: Any = None) -> None: ...

    async def close(self) -> None: ...


def config(provider: str = "ec2", standby: int = 1) -> ThawConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["shapes"] = [{"name": "gpu", "gpu_type": "l40s-48gb", "gpu_count": 1, "gpu_memory_gib": 48,
                       "host_memory_gib": 64, "price_per_hour_usd": 1.5, "boot_timeout_s": 300}]
    pool: dict[str, Any] = {"shape": "gpu", "provider": provider, "standby_min": standby, "standby_max": standby,
                            "max_instances": 4}
    if provider == "ec2":
        pool["ec2"] = {"region": "us-east-1", "launch_template": "thaw-worker", "subnets": ["subnet-a"],
                       "instance_types": ["g6e.xlarge"], "backoff_base_s": 30, "backoff_max_s": 600}
    data["pools"] = [pool]
    data["models"][0].update({"shape": "gpu"})
    data["models"][0]["autoscaling"].update({"idle_grace_s": 60})
    data["cluster"] = {"heartbeat_interval_s": 2, "worker_timeout_s": 15}
    data["controller"] = {"url": "http://controller.internal:8100"}
    return parse_config(data)


def beat(m: PoolManager, wid: str, state: WorkerState, clock: Clock, **kw: Any) -> None:
    m.heartbeat(WorkerStatus(worker_id=wid, instance_id=f"i-{wid}", shape="gpu", state=state,
                             control_url=f"http://{wid}", started_at=0.0, state_since=clock(), **kw))


async def manager(cfg: ThawConfig, provider: FakeProvider, control: FakeControl, clock: Clock,
                  classes: ModelClasses | None = None) -> PoolManager:
    m = build_pool(cfg, {"gpu": provider}, control, clock=clock, refresh_interval_s=0.0, model_classes=classes)
    await m.start(loop=False)
    return m


async def step(m: PoolManager) -> None:
    await m.step()
    await m.actuator.settle()


def metrics_text(m: PoolManager) -> str:
    from prometheus_client import generate_latest

    return generate_latest(m.parts.registry).decode()


def views(m: PoolManager) -> dict[str, str]:
    return {w: v.state.value for w, v in m.fleet.views(m.clock()).items()}


async def test_a_restarted_controller_adopts_the_fleet_and_launches_nothing() -> None:
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock)
    # What the last controller left: one worker serving the model, one standing by.
    for wid in ("w-ready", "w-standby"):
        provider.running[wid] = Instance(f"i-{wid}", wid, "gpu", clock() - 3600, InstanceState.RUNNING)
    m = await manager(config(), provider, control, clock)
    # Within the adoption grace: nothing is decided and no route table is published.
    await step(m)
    assert provider.launches == [] and control.calls == [] and not m.adopted
    assert await m.feed.wait(-1, None, 0.0) is None
    beat(m, "w-ready", S.READY, clock, model="demo", assignment_id="demo-old-1", engine_url="http://w-ready:9000",
         served_model_name="thaw-demo")
    beat(m, "w-standby", S.STANDBY, clock)
    clock.t += m.adopt_grace_s
    await step(m)
    assert m.adopted
    # Each turn of the loop is timed (the controller's cost at its fleet's size).
    text = metrics_text(m)
    assert "thaw_pool_step_seconds_count 2.0" in text
    # The per-model gauges, read from the tick's policy state when scraped.
    assert 'thaw_model_backoff_seconds{model="demo"} 0.0' in text
    assert 'thaw_autoscaler_desired_replicas{model="demo",stage="target"} 1.0' in text
    assert 'thaw_keepalive_window_seconds{edge="keep_until",model="demo"} 60.0' in text
    # No activator has reported yet: the serving replica is kept (its idle grace starts
    # now), nothing is launched (the standby target is met), nothing is released.
    assert provider.launches == [] and control.calls == [] and provider.terminated == []
    routes = await m.feed.wait(-1, "another-epoch", 0.0)
    assert routes is not None and routes.epoch == m.epoch
    assert [r.worker_id for r in routes.models["demo"].replicas] == ["w-ready"]
    # An activator reports for the first time, with a large counter from before the
    # restart: that is no burst of arrivals, and the replica stays.
    m.traffic.report("act-1", {"demo": ModelActivity(last_request_at=clock() - 100)}, arrivals={"demo": 5000})
    await step(m)
    assert control.calls == []
    # 61 s later with no traffic at all (idle_grace_s 60): now it goes.
    clock.t += 61
    beat(m, "w-ready", S.READY, clock, model="demo", assignment_id="demo-old-1", engine_url="http://w-ready:9000")
    beat(m, "w-standby", S.STANDBY, clock)
    await step(m)
    assert [c[0] for c in control.calls] == ["release"]


async def test_adoption_waits_for_every_running_worker_to_report() -> None:
    """A serving worker slow to report after a restart looks like one still booting: a
    controller that decided then would count two standbys and terminate the real one."""
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock)
    for wid in ("w-ready", "w-standby", "w-silent"):
        provider.running[wid] = Instance(f"i-{wid}", wid, "gpu", clock() - 3600, InstanceState.RUNNING)
    m = await manager(config(), provider, control, clock)
    beat(m, "w-standby", S.STANDBY, clock)
    clock.t += m.adopt_grace_s
    await step(m)
    assert not m.adopted and m.fleet.unreported() == ["w-ready", "w-silent"]
    beat(m, "w-ready", S.READY, clock, model="demo", assignment_id="demo-old-1", engine_url="http://w-ready:9000",
         served_model_name="thaw-demo")
    clock.t += 1
    await step(m)
    assert not m.adopted  # w-silent still has not reported
    # worker_timeout_s (15) after the grace: adopted without it, and it is unreachable.
    clock.t += 14.5
    beat(m, "w-ready", S.READY, clock, model="demo", assignment_id="demo-old-1", engine_url="http://w-ready:9000")
    beat(m, "w-standby", S.STANDBY, clock)
    await step(m)
    assert m.adopted
    assert views(m)["w-ready"] == "ready" and views(m)["w-standby"] == "standby"
    assert "i-w-standby" not in provider.terminated and "i-w-ready" not in provider.terminated


async def test_a_worker_first_heard_after_the_adoption_keeps_its_replica_as_one_found_at_it() -> None:
    """A static pool's workers are known by their heartbeats alone, so a new leader adopts
    once its grace has passed; a serving worker whose first heartbeat comes later (it was
    still trying the dead leader) holds a model this leader never saw used. Its idle
    grace starts when it is first heard, as for one found at the adoption: a takeover
    must not let go of a replica it found serving (it was released at once, as if never
    used)."""
    clock = Clock()
    control = FakeControl(clock)
    m = await manager(config("static", standby=1), StaticProvider(), control, clock)
    beat(m, "w-standby", S.STANDBY, clock)
    clock.t += m.adopt_grace_s
    await step(m)
    assert m.adopted and m.traffic.adopted_serving == {}
    clock.t += 5
    late = {"model": "demo", "assignment_id": "demo-old-1", "engine_url": "http://w-late:9000",
            "served_model_name": "thaw-demo"}
    beat(m, "w-late", S.READY, clock, **late)
    await step(m)
    assert control.calls == [] and views(m)["w-late"] == "ready"
    # Its idle grace (60 s) runs from when it was heard: kept at 59 s, released at 61 s.
    for dt, calls in ((59, []), (2, ["release"])):
        clock.t += dt
        beat(m, "w-late", S.READY, clock, **late)
        beat(m, "w-standby", S.STANDBY, clock)
        await step(m)
        assert [c[0] for c in control.calls] == calls


async def test_standby_time_lent_to_batch_is_counted_and_shown() -> None:
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock)
    for wid in ("w1", "w2"):
        provider.running[wid] = Instance(f"i-{wid}", wid, "gpu", clock() - 3600, InstanceState.RUNNING)
    data = config(standby=2).model_dump(mode="json")
    data["cluster"]["token"] = None
    m = await manager(parse_config(data), provider, control, clock)
    beat(m, "w1", S.STANDBY, clock)
    beat(m, "w2", S.READY, clock, model="demo", assignment_id="demo-b-1", engine_url="http://w2:9000", batch=True)
    clock.t += m.adopt_grace_s
    await step(m)
    for _ in range(3):  # 30 s: one standby idle, one lent to batch
        clock.t += 10
        beat(m, "w1", S.STANDBY, clock)
        beat(m, "w2", S.READY, clock, model="demo", assignment_id="demo-b-1", engine_url="http://w2:9000", batch=True)
        await step(m)
    assert control.calls == [] and provider.launches == []  # the lent one is a standby of the band
    assert m.standby_seconds["gpu"] == pytest.approx((30.0, 30.0))
    row = m.status().shapes[0]
    assert row.standby_lent_to_batch == 1 and row.standby_batch_share == pytest.approx(0.5)
    assert [d.batch for d in m.status().worker_details] == [False, True]
    text = generate_latest(m.parts.registry).decode()
    assert 'thaw_pool_standby_seconds_total{shape="gpu",use="batch"} 30.0' in text


async def test_an_instance_that_never_registers_is_terminated_and_replaced() -> None:
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock)
    m = await manager(config(), provider, control, clock)
    clock.t += m.adopt_grace_s
    await step(m)
    assert len(provider.launches) == 1  # the standby target
    wid = provider.launches[0]
    clock.t += 299
    await step(m)
    assert views(m)[wid] == "starting" and provider.terminated == []
    # boot_timeout_s 300 passed without a heartbeat: terminated, and a new one launched.
    clock.t += 2
    await step(m)
    assert provider.terminated == [f"i-{wid}"]
    await step(m)
    assert len(provider.launches) == 2 and wid not in m.fleet.facts


async def test_heartbeats_from_unknown_instances_are_refused_on_cloud_pools() -> None:
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock)
    m = await manager(config("ec2", standby=0), provider, control, clock)
    with pytest.raises(UnknownInstance, match="not launched by this cluster"):
        beat(m, "w-stranger", S.STANDBY, clock)
    assert "w-stranger" not in m.fleet.facts
    # On a local pool, a worker started by hand may register itself.
    local = await manager(config("local", standby=0), FakeProvider(clock, kind="local"), control, clock)
    beat(local, "w-by-hand", S.STANDBY, clock)
    assert views(local)["w-by-hand"] == "standby"


async def test_a_static_pool_has_the_workers_that_registered_and_launches_none() -> None:
    clock = Clock()
    control = FakeControl(clock)
    m = await manager(config("static", standby=2), StaticProvider(), control, clock)
    beat(m, "w-a", S.STANDBY, clock)
    clock.t += m.adopt_grace_s
    await step(m)
    # It wants two standbys and has one: a launch is asked, the pool is at capacity.
    row = m.status().shapes[0]
    assert row.backoff_until is not None and "static" in (row.backoff_reason or "")
    assert views(m) == {"w-a": "standby"}
    beat(m, "w-b", S.STANDBY, clock)
    assert views(m) == {"w-a": "standby", "w-b": "standby"}


async def test_capacity_errors_back_the_shape_off_exponentially() -> None:
    clock = Clock()
    provider, control = FakeProvider(clock, no_capacity=2), FakeControl(clock)
    m = await manager(config(), provider, control, clock)
    clock.t += m.adopt_grace_s
    await step(m)
    assert len(provider.launches) == 1 and not provider.running
    row = m.status().shapes[0]
    assert row.backoff_until == pytest.approx(clock() + 30) and "no gpu capacity" in (row.backoff_reason or "")
    clock.t += 29
    await step(m)
    assert len(provider.launches) == 1  # still backed off
    clock.t += 2
    await step(m)
    assert len(provider.launches) == 2  # tried again: fails, 30 x 2 = 60 s now
    assert m.status().shapes[0].backoff_until == pytest.approx(clock() + 60)
    clock.t += 61
    await step(m)
    assert len(provider.running) == 1 and m.status().shapes[0].backoff_until is None
    events = [(e.kind, e.outcome) for e in m.parts.event_log.events]
    assert events.count(("launch", "failed")) == 2 and ("launched", "done") in events


async def test_demand_assigns_a_standby_and_the_intent_holds_until_the_worker_reflects_it() -> None:
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock)
    provider.running["w1"] = Instance("i-w1", "w1", "gpu", clock(), InstanceState.RUNNING)
    m = await manager(config(), provider, control, clock)
    beat(m, "w1", S.STANDBY, clock)
    clock.t += m.adopt_grace_s
    await step(m)
    m.traffic.report("act-1", {"demo": ModelActivity(queued=1, last_request_at=clock())})
    # A stale heartbeat (sent before the assign arrived) must not undo the assignment:
    # the next tick would otherwise assign the worker twice.
    await m.step()
    beat(m, "w1", S.STANDBY, clock)
    await step(m)
    assigns = [c for c in control.calls if c[0] == "assign"]
    assert len(assigns) == 1 and views(m)["w1"] == "loading"
    req = assigns[0][2]
    assert req.assignment_id.startswith(f"demo-{m.epoch}-")
    ev = next(e for e in m.parts.event_log.events if e.kind == "assign")
    assert ev.inputs["activity"]["queued"] == 1 and ev.model == "demo"


async def test_the_keep_alive_histogram_survives_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock)
    data = config().model_dump(mode="json")
    data["models"][0]["autoscaling"]["keep_alive"] = "histogram"
    data["cluster"]["token"] = None
    cfg = parse_config(data)
    m = build_pool(cfg, {"gpu": provider}, control, clock=clock, refresh_interval_s=0.0, state_dir=tmp_path)
    await m.start(loop=False)
    clock.t += m.adopt_grace_s
    # The controller sees the model unused for 300 s: the wait for its first request is
    # its first idle interval.
    await step(m)
    clock.t += 300
    # Three idle gaps of 600 s: a request, then nothing, then the next one.
    for _ in range(3):
        m.traffic.report("a", {"demo": ModelActivity(in_flight=1, last_request_at=clock())})
        await step(m)
        m.traffic.report("a", {"demo": ModelActivity(last_request_at=clock())})
        await step(m)
        clock.t += 600
    m.traffic.report("a", {"demo": ModelActivity(in_flight=1, last_request_at=clock())})
    await step(m)
    learnt = m.state.models["demo"].idle_histogram
    assert learnt.total() == 4 and learnt.counts[10] == 3 and learnt.counts[5] == 1
    # A new controller reads it back; with another bin width it starts afresh.
    again = build_pool(cfg, {"gpu": provider}, control, clock=clock, state_dir=tmp_path,
                       store_reader=FakeStoreReader())
    assert again.state.models["demo"].idle_histogram == learnt
    # The model's settings change (in the registry: the file's models were its seed).
    await again.parts.model_admin.update("demo", ModelUpdate(revision=1, spec=ModelSpec.model_validate(
        {"autoscaling": {"keep_alive": "histogram", "keep_alive_histogram": {"bin_s": 30}}})), "test")
    other = build_pool(cfg, {"gpu": provider}, control, clock=clock, state_dir=tmp_path)
    assert other.cfg.models[0].autoscaling.keep_alive_histogram.bin_s == 30
    assert "demo" not in other.state.models


LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_hidden_layers": 4, "vocab_size": 4096}


async def test_prebuild_asks_a_standby_for_an_engine_and_assignments_carry_the_class() -> None:
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock)
    cfg = config(standby=1)
    cfg = cfg.model_copy(update={"pools": [cfg.pools[0].model_copy(update={"prebuild": ["demo"]})]})
    reads: list[str] = []

    def read(uri: str) -> dict[str, object]:
        reads.append(uri)
        return LLAMA

    classes = ModelClasses(read, clock=clock, refresh_s=60)
    provider.running["w-1"] = Instance("i-w-1", "w-1", "gpu", clock() - 60, InstanceState.RUNNING)
    m = await manager(cfg, provider, control, clock, classes)
    beat(m, "w-1", S.STANDBY, clock)
    clock.t += m.adopt_grace_s
    await step(m)
    demo = cfg.models[0]
    expected = engine_class_of(LLAMA, demo.engine, max_model_len=demo.max_context_tokens).id
    assert classes.classes == {"demo": expected} and reads == [demo.uri]
    # Operators see it (GET /v1/state, thaw models ls).
    assert {r.name: r.engine_class for r in m.status().models} == {"demo": expected}
    [(kind, url, req)] = control.calls
    assert (kind, url) == ("prebuild", "http://w-1")
    assert (req.model, req.uri, req.engine_class, req.max_model_len) == (
        "demo", demo.uri, expected, demo.max_context_tokens)
    # The answer shows the engine building: nothing is asked again, the config is not read again.
    await step(m)
    assert len(control.calls) == 1 and reads == [demo.uri]
    # Built: a request at zero is a swap into it, and the assignment names the class.
    beat(m, "w-1", S.STANDBY, clock, prebuilt=PrebuiltView(engine_class=expected, model="demo", state="ready"))
    m.traffic.report("act-1", {"demo": ModelActivity(queued=1, last_request_at=clock())})
    await step(m)
    [(kind, _, areq)] = [c for c in control.calls if c[0] == "assign"]
    assert areq.engine_class == expected
    assert any(e.kind == "assign" and e.worker_id == "w-1" for e in m.parts.event_log.events)




def packing_config() -> ThawConfig:
    """The gpu pool packs; demo and tuned each take 0.4 of the device."""
    data = config(standby=0).model_dump(mode="json")
    data["pools"][0]["pack"] = True
    demo = data["models"][0]
    demo["engine"]["gpu_memory_utilization"] = 0.4
    data["models"].append({**demo, "name": "tuned", "served_name": "tuned", "uri": "s3://thaw/models/tuned"})
    return parse_config(data)


async def test_a_packed_engine_is_asked_of_a_serving_worker_and_tracked_as_a_replica() -> None:
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock)
    cfg = packing_config()
    classes = ModelClasses(lambda uri: LLAMA, clock=clock, refresh_s=60, read_size=lambda uri: 100 << 20)
    provider.running["w-1"] = Instance("i-w-1", "w-1", "gpu", clock() - 60, InstanceState.RUNNING)
    m = await manager(cfg, provider, control, clock, classes)
    share = int(48 * GiB * 0.4)
    beat(m, "w-1", S.READY, clock, model="demo", assignment_id="demo-1", engine_url="http://w-1:9001",
         memory_bytes=share, capacity_bytes=48 * GiB)
    clock.t += m.adopt_grace_s
    m.traffic.report("act-1", {"demo": ModelActivity(in_flight=1, last_request_at=clock()),
                               "tuned": ModelActivity(queued=1, last_request_at=clock())})
    await step(m)
    [(kind, url, req)] = [c for c in control.calls if c[0] == "pack"]
    assert (kind, url, req.model, req.memory_bytes) == ("pack", "http://w-1", "tuned", share)
    engine_id = req.engine_id
    assert engine_id == f"w-1.{req.assignment_id}" and not provider.launches
    # Its answer is the packed engine's status: a replica loading, not a worker to bill.
    assert views(m)[engine_id] == "loading"
    await step(m)
    assert len([c for c in control.calls if c[0] == "pack"]) == 1
    st = m.status()
    assert st.shapes[0].counts == {"ready": 1} and st.shapes[0].spend_usd_per_hour == 1.5
    detail = next(d for d in st.worker_details if d.id == engine_id)
    assert (detail.host_worker_id, detail.memory_bytes) == ("w-1", share)
    # It reports ready under its own id: a route of its model, marked packed.
    m.heartbeat(WorkerStatus(worker_id=engine_id, instance_id="i-w-1", shape="gpu", state=S.READY,
                             control_url=f"http://w-1/engines/{engine_id}", started_at=clock(), state_since=clock(),
                             model="tuned", assignment_id=req.assignment_id, engine_url="http://w-1:9002",
                             memory_bytes=share, host_worker_id="w-1", phases=Phases(engine_ready=clock())))
    [route] = m.route_table(clock())["tuned"].replicas
    assert (route.worker_id, route.url, route.packed) == (engine_id, "http://w-1:9002", True)
    assert not m.route_table(clock())["demo"].replicas[0].packed
    # Idle: released through its own control API.
    clock.t += 120
    m.traffic.report("act-1", {"demo": ModelActivity(in_flight=1, last_request_at=clock()),
                               "tuned": ModelActivity(last_request_at=clock() - 100)})
    await step(m)
    [(_, url, _)] = [c for c in control.calls if c[0] == "release"]
    assert url == f"http://w-1/engines/{engine_id}"
    # Gone from the worker's list: forgotten, and a late heartbeat of it is refused.
    clock.t += 20
    beat(m, "w-1", S.READY, clock, model="demo", assignment_id="demo-1", engine_url="http://w-1:9001",
         memory_bytes=share, capacity_bytes=48 * GiB, engines=[])
    assert engine_id not in m.fleet.facts
    with pytest.raises(UnknownInstance):
        m.heartbeat(WorkerStatus(worker_id=engine_id, instance_id="i-w-1", shape="gpu", state=S.DRAINING,
                                 control_url=f"http://w-1/engines/{engine_id}", started_at=0.0,
                                 state_since=clock(), host_worker_id="w-1"))


async def test_a_packed_engine_of_an_unknown_worker_is_refused_and_a_refused_pack_is_not_repeated() -> None:
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock, refuse_pack=True)
    classes = ModelClasses(lambda uri: LLAMA, clock=clock, refresh_s=60, read_size=lambda uri: 100 << 20)
    provider.running["w-1"] = Instance("i-w-1", "w-1", "gpu", clock() - 60, InstanceState.RUNNING)
    m = await manager(packing_config(), provider, control, clock, classes)
    with pytest.raises(UnknownInstance):
        m.heartbeat(WorkerStatus(worker_id="w-9.x", instance_id="i-w-9", shape="gpu", state=S.READY,
                                 control_url="http://w-9/engines/w-9.x", started_at=0.0, state_since=clock(),
                                 host_worker_id="w-9"))
    beat(m, "w-1", S.READY, clock, model="demo", assignment_id="demo-1", engine_url="http://w-1:9001",
         memory_bytes=int(48 * GiB * 0.4), capacity_bytes=48 * GiB)
    clock.t += m.adopt_grace_s
    m.traffic.report("act-1", {"demo": ModelActivity(in_flight=1, last_request_at=clock()),
                               "tuned": ModelActivity(queued=1, last_request_at=clock())})
    await step(m)
    await step(m)
    assert len([c for c in control.calls if c[0] == "pack"]) == 1
    assert [e for e in m.parts.event_log.events if e.kind == "pack" and e.outcome == "failed"]
    # The model waits for a launch instead.
    assert provider.launches


async def test_an_adapter_is_loaded_into_a_serving_base_and_routed_under_its_own_name() -> None:
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock)
    data = config(standby=0).model_dump(mode="json")
    data["models"].append({"name": "a1", "served_name": "a1-chat", "base": "demo",
                           "adapter_uri": "s3://thaw/adapters/a1"})
    cfg = parse_config(data)
    provider.running["w-1"] = Instance("i-w-1", "w-1", "gpu", clock() - 60, InstanceState.RUNNING)
    m = await manager(cfg, provider, control, clock)
    beat(m, "w-1", S.READY, clock, model="demo", assignment_id="demo-1", engine_url="http://e:1",
         phases=Phases(engine_ready=clock()))
    clock.t += m.adopt_grace_s
    m.traffic.report("act-1", {"a1": ModelActivity(queued=1, last_request_at=clock())})
    await step(m)
    [(_, url, req)] = [c for c in control.calls if c[0] == "load_adapter"]
    assert (url, req.model, req.uri, req.served_model_name) == ("http://w-1", "a1", "s3://thaw/adapters/a1", "a1-chat")
    routes = m.route_table(clock())
    assert routes["a1"].loading == 1 and not routes["a1"].replicas
    await step(m)  # shown loading: not asked again
    assert len([c for c in control.calls if c[0] == "load_adapter"]) == 1
    beat(m, "w-1", S.READY, clock, model="demo", assignment_id="demo-1", engine_url="http://e:1",
         phases=Phases(engine_ready=clock()),
         adapters=[AdapterView(model="a1", served_model_name="a1-chat", state="ready", since=clock(),
                               requested_at=clock() - 1)])
    [r] = m.route_table(clock())["a1"].replicas
    assert (r.worker_id, r.url, r.served_model_name, r.adapter) == ("w-1", "http://e:1", "a1-chat", True)
    # Its phases are its load's; each load is a replica of its own (its cold start is recorded).
    assert (r.phases.assigned, r.phases.engine_ready) == (clock() - 1, clock()) and r.base_ready_at is not None
    assert r.assignment_id == f"demo-1/a1@{clock() - 1}"
    [b] = m.route_table(clock())["demo"].replicas
    assert b.served_model_name == "thaw-demo" and not b.adapter
    row = next(x for x in m.status().models if x.name == "a1")
    assert row.replicas == {"ready": 1}
    # The base's engine starts with LoRA: an assignment of demo carries the flags.
    req2 = assign_request(cfg, m.parts.model_classes, cfg.models[0], "demo-2", None)
    assert req2.engine.extra["enable_lora"] is True and req2.engine.extra["max_loras"] == 4


async def test_a_worker_terminated_takes_its_packed_engines_with_it() -> None:
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock)
    provider.running["w-1"] = Instance("i-w-1", "w-1", "gpu", clock() - 60, InstanceState.RUNNING)
    m = await manager(packing_config(), provider, control, clock)
    beat(m, "w-1", S.READY, clock, model="demo", assignment_id="demo-1", engine_url="http://w-1:9001",
         capacity_bytes=48 * GiB, engines=["w-1.e"])

    def engine_beat() -> None:
        m.heartbeat(WorkerStatus(worker_id="w-1.e", instance_id="i-w-1", shape="gpu", state=S.READY,
                                 control_url="http://w-1/engines/w-1.e", started_at=0.0, state_since=clock(),
                                 model="tuned", assignment_id="tuned-1", engine_url="http://w-1:9002",
                                 host_worker_id="w-1"))

    engine_beat()
    clock.t += m.adopt_grace_s
    await step(m)
    assert views(m) == {"w-1": "ready", "w-1.e": "ready"}
    # The worker falls silent (its engine's last heartbeat is fresh): it is terminated, and
    # its packed engine is forgotten with it instead of being routed to until it too is silent.
    clock.t += 20
    engine_beat()
    await step(m)
    assert provider.terminated == ["i-w-1"] and "w-1.e" not in m.fleet.facts
    assert not m.route_table(clock())["tuned"].replicas
    with pytest.raises(UnknownInstance):
        engine_beat()


async def test_a_failed_load_reaches_the_routes_with_its_kind() -> None:
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock)
    provider.running["w-1"] = Instance("i-w-1", "w-1", "gpu", clock() - 60, InstanceState.RUNNING)
    m = await manager(config(standby=0), provider, control, clock)
    beat(m, "w-1", S.FAILED, clock, model="demo", assignment_id="demo-1",
         error="cannot read the model's manifest at s3://thaw/models/demo: Could not connect", failure_kind="store")
    clock.t += m.adopt_grace_s
    await step(m)
    route = m.route_table(clock())["demo"]
    assert (route.failures, route.failure_kind) == (1, "store") and "Could not connect" in (route.error or "")


async def test_an_eviction_is_an_event_with_its_inputs_and_a_full_pool_reaches_the_routes() -> None:
    # One instance, serving demo; "other" waits at zero. demo busy: other is refused by
    # its failure kind once its grace is over. demo idle 30 s (kept 60 s): its replica is
    # released for other.
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock)
    provider.running["w-1"] = Instance("i-w-1", "w-1", "gpu", clock() - 60, InstanceState.RUNNING)
    data = config(standby=0).model_dump(mode="json")
    data["pools"][0]["max_instances"] = 1
    data["models"].append({**data["models"][0], "name": "other", "served_name": "other",
                           "uri": "s3://thaw/models/other"})
    m = await manager(parse_config(data), provider, control, clock)
    beat(m, "w-1", S.READY, clock, model="demo", assignment_id="demo-1", engine_url="http://e:1")
    clock.t += m.adopt_grace_s
    busy = {"demo": ModelActivity(in_flight=1, last_request_at=clock()),
            "other": ModelActivity(queued=1, last_request_at=clock())}
    m.traffic.report("act-1", busy)
    await step(m)
    assert m.route_table(clock())["other"].failure_kind is None  # within its grace: it waits
    clock.t += CAPACITY_GRACE_S
    m.traffic.report("act-1", busy)
    await step(m)
    route = m.route_table(clock())["other"]
    assert (route.failure_kind, route.error) == ("capacity", "pool gpu is at max_instances 1 and every replica is busy")
    assert not [c for c in control.calls if c[0] == "release"]
    clock.t += 30
    m.traffic.report("act-1", {"demo": ModelActivity(last_request_at=clock() - 30),
                               "other": ModelActivity(queued=1, last_request_at=clock())})
    await step(m)
    assert [c[1] for c in control.calls if c[0] == "release"] == ["http://w-1"]
    ev = next(e for e in m.parts.event_log.events if e.kind == "release")
    assert (ev.reason, ev.model, ev.worker_id, ev.shape) == ("evicted", "demo", "w-1", "gpu")
    assert (ev.inputs["for_model"], ev.inputs["idle_s"]) == ("other", 30.0)
    assert m.route_table(clock())["other"].failure_kind is None


def test_ids_of_packed_engines_gone_are_remembered_within_a_bound() -> None:
    from warm_pool.fleet.facts import RELEASED_ENGINES_KEPT

    clock = Clock()
    m = build_pool(config(), {"gpu": FakeProvider(clock)}, FakeControl(clock), clock=clock)
    for n in range(RELEASED_ENGINES_KEPT + 5):
        m.fleet.engine_gone(f"w-1.e{n}")
    assert len(m.fleet.released_engines) == RELEASED_ENGINES_KEPT
    assert "w-1.e0" not in m.fleet.released_engines and f"w-1.e{RELEASED_ENGINES_KEPT + 4}" in m.fleet.released_engines


async def test_stored_responses_past_their_retention_are_deleted() -> None:
    clock = Clock()
    provider, control = FakeProvider(clock), FakeControl(clock)
    m = await manager(config(standby=0), provider, control, clock)
    clock.t += m.adopt_grace_s
    m.parts.responses.save("acme", {"id": "resp_old00001", "output": []}, [], replica=None, at=clock())
    await step(m)
    clock.t += 29 * 86400
    m.parts.responses.save("acme", {"id": "resp_new00001", "output": []}, [], replica=None, at=clock())
    await step(m)
    assert m.parts.responses.get("acme", "resp_old00001") is not None  # 29 days: kept
    clock.t += 2 * 86400  # 31 days after the first: past responses.retention_days (30)
    await step(m)
    assert m.parts.responses.get("acme", "resp_old00001") is None and m.parts.responses.get("acme", "resp_new00001") is not None


async def test_a_heartbeat_sent_before_an_assignment_was_answered_does_not_undo_it() -> None:
    clock = Clock()
    control = FakeControl(clock)
    m = await manager(config("static", standby=1), StaticProvider(), control, clock)
    beat(m, "w-a", S.STANDBY, clock, seq=1)
    clock.t += m.adopt_grace_s
    await step(m)
    # The worker's next heartbeat (seq 2, standby) is on its way when it is assigned and
    # answers (seq 3, loading); the heartbeat arrives last.
    m.fleet.answered("w-a", WorkerStatus(worker_id="w-a", instance_id="i-w-a", shape="gpu", state=S.LOADING,
                                         control_url="http://w-a", started_at=0.0, state_since=clock(), seq=3,
                                         model="demo", assignment_id="demo-1"))
    beat(m, "w-a", S.STANDBY, clock, seq=2)
    assert m.fleet.facts["w-a"].status is not None and m.fleet.facts["w-a"].status.seq == 3
    assert views(m)["w-a"] == "loading"
    assert 'thaw_pool_heartbeats_total{outcome="stale"} 1.0' in metrics_text(m)
    # A worker started again counts from 1: its first heartbeat is news.
    m.heartbeat(WorkerStatus(worker_id="w-a", instance_id="i-w-a", shape="gpu", state=S.STANDBY,
                             control_url="http://w-a", started_at=5.0, state_since=clock(), seq=1))
    assert views(m)["w-a"] == "standby"
    # An uncounted status (an older worker: seq 0) is always taken.
    beat(m, "w-a", S.LOADING, clock, model="demo", assignment_id="demo-2")
    assert views(m)["w-a"] == "loading"
