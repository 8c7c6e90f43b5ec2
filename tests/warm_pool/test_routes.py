"""The route table (``warm_pool.routes``): built from the workers grouped by model, and its
feed, which answers a watcher that holds a recent version with a delta that merges into
exactly the table it would have fetched whole."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thaw.config import parse_config
from thaw.wire import (
    AdapterView,
    LoadView,
    ModelRoute,
    Phases,
    ReplicaRoute,
    RouteTable,
    WorkerState,
    WorkerStatus,
)
from warm_pool.fleet.view import WorkerFacts
from warm_pool.policy.decide import ModelState, PolicyState, WorkerView
from warm_pool.routes import RouteFeed, RouteTables, route_changes, route_table

S = WorkerState
NOW = 1000.0
CFG = parse_config({
    "shapes": [{"name": "cpu", "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8, "price_per_hour_usd": 0}],
    "models": [{"name": "a", "uri": "s3://thaw/a", "shape": "cpu"},
               {"name": "b", "uri": "s3://thaw/b", "shape": "cpu", "served_name": "bee"},
               {"name": "a-lora", "base": "a", "adapter_uri": "s3://thaw/a-lora"}],
})


def worker(wid: str, state: WorkerState, model: str | None, adapters: tuple[tuple[str, str], ...] = (),
           revision: int | None = None) -> tuple[WorkerFacts, WorkerView]:
    ready = state is S.READY
    status = WorkerStatus(
        worker_id=wid, instance_id=f"i-{wid}", shape="cpu", state=state, control_url=f"http://{wid}:1",
        model=model, assignment_id=f"{model}-{wid}", engine_url=f"http://{wid}:2" if ready else None,
        started_at=1.0, state_since=NOW, phases=Phases(engine_ready=NOW - 5) if ready else Phases(),
        adapters=[AdapterView(model=a, served_model_name=a, state=st, since=NOW - 1,  # type: ignore[arg-type]
                              requested_at=NOW - 2) for a, st in adapters])
    view = WorkerView(id=wid, shape="cpu", state=state, model=model, assignment_id=f"{model}-{wid}",
                      adapters=adapters, revision=revision)
    return WorkerFacts(worker_id=wid, shape="cpu", status=status, heard_at=NOW), view


def fleet(*workers: tuple[WorkerFacts, WorkerView]) -> tuple[dict[str, WorkerFacts], dict[str, WorkerView]]:
    return {f.worker_id: f for f, _ in workers}, {v.id: v for _, v in workers}


# -- the table ----------------------------------------------------------------------------


def test_each_model_gets_the_workers_that_serve_it_and_an_adapter_the_engines_of_its_base() -> None:
    facts, views = fleet(
        worker("w3", S.READY, "a", adapters=(("a-lora", "ready"),)),
        worker("w1", S.READY, "a", adapters=(("a-lora", "loading"),)),
        worker("w2", S.LOADING, "a"),
        worker("w4", S.READY, "b", adapters=(("a-lora", "ready"),)),  # not a's engine: no route of a-lora
        worker("w5", S.STANDBY, None),
    )
    state = PolicyState(models={"b": ModelState(failures=1, backoff_until=NOW + 30, last_error="boom",
                                                last_failure_kind="engine")})
    routes = route_table(CFG, facts, views, state, NOW)
    assert list(routes) == ["a", "b", "a-lora"]
    # a: two ready (sorted by worker), one loading.
    assert ([r.worker_id for r in routes["a"].replicas], routes["a"].loading) == (["w1", "w3"], 1)
    # b's worker names no served name: the model's own.
    assert ([r.served_model_name for r in routes["b"].replicas], routes["b"].loading) == (["bee"], 0)
    assert (routes["b"].failures, routes["b"].error, routes["b"].backoff_until) == (1, "boom", NOW + 30)
    # a-lora: ready on w3, loading on w1; w4 serves b, whatever its status says.
    [lora] = routes["a-lora"].replicas
    assert (lora.worker_id, lora.adapter, lora.served_model_name, routes["a-lora"].loading) == ("w3", True, "a-lora", 1)
    assert lora.assignment_id == f"a-w3/a-lora@{NOW - 2}" and lora.base_ready_at == NOW - 5


def test_during_a_roll_the_current_revision_takes_the_traffic_once_one_of_it_is_ready() -> None:
    old, new = worker("w1", S.READY, "a", revision=1), worker("w2", S.LOADING, "a", revision=2)
    outdated = {"a": frozenset({1})}
    routes = route_table(CFG, *fleet(old, new), PolicyState(), NOW, revisions=lambda m: 2, outdated=outdated)
    assert [(r.worker_id, r.revision) for r in routes["a"].replicas] == [("w1", 1)]
    new = worker("w2", S.READY, "a", revision=2)
    routes = route_table(CFG, *fleet(old, new), PolicyState(), NOW, revisions=lambda m: 2, outdated=outdated)
    assert [(r.worker_id, r.revision) for r in routes["a"].replicas] == [("w2", 2)]


def test_a_route_unchanged_since_the_last_table_is_that_tables_very_object() -> None:
    """The tick's table reuses the last one's routes that did not change (the feed then
    compares them by identity); the table is the one built without it."""
    facts, views = fleet(worker("w1", S.READY, "a"), worker("w2", S.LOADING, "b"))
    last = route_table(CFG, facts, views, PolicyState(), NOW)
    facts, views = fleet(worker("w1", S.READY, "a"), worker("w2", S.READY, "b"))
    state = PolicyState(models={"a-lora": ModelState(failures=1, last_error="no", backoff_until=NOW + 1)})
    table = route_table(CFG, facts, views, state, NOW, previous=last)
    assert table == route_table(CFG, facts, views, state, NOW)
    # a: unchanged, reused; b: a replica ready; a-lora: a failure.
    assert [name for name in table if table[name] is last[name]] == ["a"]


# One step of a fleet's life, as the incremental tables see it: a worker changes state
# or model (or its adapter), a model fails or recovers, a backoff ends, a roll starts,
# the config loses or gains a model, or nothing happens but a heartbeat.
STEPS = st.lists(st.tuples(st.sampled_from(["worker", "fail", "recover", "time", "roll", "config", "beat"]),
                           st.integers(0, 3), st.sampled_from([S.READY, S.LOADING, S.STANDBY]),
                           st.sampled_from(["a", "b", None])), min_size=1, max_size=25)
SMALLER = parse_config({**CFG.model_dump(mode="json", exclude={"data_dir"}),
                        "models": [m for m in CFG.model_dump(mode="json")["models"] if m["name"] != "b"]})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS)
def test_tables_kept_up_by_what_changed_equal_tables_built_whole(
        steps: list[tuple[str, int, WorkerState, str | None]]) -> None:
    workers = {f"w{i}": worker(f"w{i}", S.STANDBY, None) for i in range(4)}
    cfg, models, now, revision, version = CFG, {}, NOW, 1, 0
    tables = RouteTables()
    for kind, i, state, model in steps:
        wid = f"w{i}"
        if kind == "worker":
            lora = (("a-lora", "ready"),) if model == "a" and i % 2 else ()
            workers[wid] = worker(wid, state if model else S.STANDBY, model, adapters=lora, revision=revision)
        elif kind == "beat":  # the same facts, a new status object
            f, v = workers[wid]
            workers[wid] = (WorkerFacts(worker_id=f.worker_id, shape="cpu", status=f.status.model_copy()
                                        if f.status else None, heard_at=now), v)
        elif kind == "fail":
            models[model or "a-lora"] = ModelState(failures=1, last_error="boom", backoff_until=now + 2 * i,
                                                   last_failure_kind="engine")
        elif kind == "recover":
            models.pop(model or "a", None)
        elif kind == "time":
            now += i
        elif kind == "roll":
            revision, version = revision + 1, version + 1
        else:
            cfg = SMALLER if cfg is CFG else CFG
        facts, views = fleet(*workers.values())
        state = PolicyState(models=dict(models))
        outdated = {"a": frozenset(range(1, revision))} if revision > 1 else {}
        kept = tables.build(cfg, facts, views, state, now, revisions=lambda m, r=revision: r, outdated=outdated,
                            registry_version=version)
        whole = route_table(cfg, facts, views, state, now, revisions=lambda m, r=revision: r, outdated=outdated)
        assert kept == whole
    assert tables.routed <= len(cfg.models)


def test_an_idle_fleet_routes_no_model_again() -> None:
    facts, views = fleet(worker("w1", S.READY, "a"), worker("w2", S.STANDBY, None))
    tables = RouteTables()
    first = tables.build(CFG, facts, views, PolicyState(), NOW, revisions=lambda m: None, outdated={},
                         registry_version=0)
    assert tables.routed == 3
    again = tables.build(CFG, facts, views, PolicyState(), NOW + 1, revisions=lambda m: None, outdated={},
                         registry_version=0)
    assert tables.routed == 0 and again == first and all(again[n] is first[n] for n in first)


# -- the feed's changes and deltas -----------------------------------------------------------


def rep(wid: str, *, tier: str | None = None, ready_at: float | None = None) -> ReplicaRoute:
    return ReplicaRoute(worker_id=wid, url=f"http://{wid}:2", served_model_name="m", assignment_id=f"x-{wid}",
                        phases=Phases(engine_ready=ready_at), load=LoadView(tier=tier) if tier else None)  # type: ignore[arg-type]


def routes(**replicas: list[ReplicaRoute]) -> dict[str, ModelRoute]:
    return {name: ModelRoute(served_name=name, replicas=reps) for name, reps in replicas.items()}


@pytest.mark.parametrize(("old", "new", "changed", "moves"), [
    (routes(a=[], b=[]), routes(a=[], b=[]), set(), False),
    (routes(a=[]), routes(a=[rep("w1")]), {"a"}, True),  # a replica: activators act on it
    (routes(a=[], b=[]), routes(a=[]), {"b"}, True),  # removed
    (routes(a=[]), routes(a=[], b=[]), {"b"}, True),  # added
    # Only a replica's load or phases: changed, the version stays.
    (routes(a=[rep("w1")]), routes(a=[rep("w1", tier="disk")]), {"a"}, False),
    (routes(a=[rep("w1")]), routes(a=[rep("w1", ready_at=5.0)]), {"a"}, False),
], ids=["same", "replica-ready", "model-removed", "model-added", "load-only", "phases-only"])
def test_route_changes_names_every_changed_model_and_moves_only_on_what_activators_act_on(
        old: dict[str, ModelRoute], new: dict[str, ModelRoute], changed: set[str], moves: bool) -> None:
    assert route_changes(old, new) == (changed, moves)


async def published(feed: RouteFeed, models: dict[str, ModelRoute], *, keys_version: int = 0) -> int:
    await feed.publish(models, activators=1, keys_version=keys_version)
    return feed.table.version


async def test_a_watcher_one_version_back_gets_only_the_models_that_changed() -> None:
    feed = RouteFeed("e")
    v1 = await published(feed, routes(a=[], b=[], c=[]))
    v2 = await published(feed, routes(a=[rep("w1")], b=[], c=[]))
    assert v2 == v1 + 1
    delta = feed.answer(v1, "e", delta=True)
    assert (delta.base_version, delta.version, list(delta.models), delta.removed) == (v1, v2, ["a"], [])
    # The answer on the wire is a delta; a whole table carries none of its fields.
    assert '"base_version":1' in delta.body() and "base_version" not in feed.answer(-1, None).body()


async def test_a_delta_reaches_back_over_several_versions_and_names_the_removed_models() -> None:
    feed = RouteFeed("e")
    v1 = await published(feed, routes(a=[], b=[], c=[]))
    await published(feed, routes(a=[rep("w1")], b=[], c=[]))
    await published(feed, routes(a=[rep("w1")], c=[]))  # b removed
    await published(feed, routes(a=[rep("w1")], c=[rep("w2")]), keys_version=3)
    delta = feed.answer(v1, "e", delta=True)
    assert (sorted(delta.models), delta.removed, delta.keys_version) == (["a", "c"], ["b"], 3)
    # Removed, then added back: sent whole, not removed.
    v4 = feed.table.version
    await published(feed, routes(a=[rep("w1")], c=[rep("w2")], b=[]))
    assert feed.table.version == v4 + 1
    delta = feed.answer(v1, "e", delta=True)
    assert (sorted(delta.models), delta.removed) == (["a", "b", "c"], [])


@pytest.mark.parametrize(("since", "epoch", "delta", "why"), [
    (-1, "e", True, "a first poll"),
    (0, "e", True, "no version 0 was ever published"),
    (1, "other", True, "another controller's version"),
    (1, None, True, "no epoch named"),
    (1, "e", True, "older than the history kept (2 versions: bases 2 and 3)"),
    (3, "e", False, "a watcher that merges no deltas"),
    (9, "e", True, "a version not published yet"),
])
async def test_anything_but_a_recent_version_of_this_epoch_gets_the_whole_table(
        since: int, epoch: str | None, delta: bool, why: str) -> None:
    feed = RouteFeed("e", history=2)
    for n in range(4):  # versions 1..4, each a replica more
        await published(feed, routes(a=[rep(f"w{i}") for i in range(n)], b=[]))
    answer = feed.answer(since, epoch, delta=delta)
    assert answer == feed.table and answer.base_version is None, why
    # The oldest kept: version 2, the base of version 3's change.
    assert feed.answer(2, "e", delta=True).base_version == 2


async def test_a_late_joining_watcher_gets_the_whole_table_at_once() -> None:
    feed = RouteFeed("e")
    for n in range(5):
        await published(feed, routes(a=[rep(f"w{i}") for i in range(n)], b=[], c=[rep("w9")]))
    table = await feed.wait(-1, None, 30.0, delta=True)  # answered at once, or this test times out
    assert table == feed.table and table is not None and sorted(table.models) == ["a", "b", "c"]


async def test_what_does_not_move_the_version_rides_along_with_the_next_delta_or_a_timed_out_poll() -> None:
    """A replica's load arrives without moving the version: a watcher that holds the
    version gets it in the answer to its poll when it times out, and one that took its
    copy before gets it in the next version's delta, so the merge is exact either way."""
    feed = RouteFeed("e")
    v1 = await published(feed, routes(a=[rep("w1")], b=[]))
    held = feed.answer(-1, None)
    assert await published(feed, routes(a=[rep("w1", tier="host")], b=[])) == v1
    timed_out = await feed.wait(v1, "e", 0.0, delta=True)
    assert timed_out is not None and (timed_out.base_version, list(timed_out.models)) == (v1, ["a"])
    assert held.merged(timed_out) == feed.table
    v2 = await published(feed, routes(a=[rep("w1", tier="host")], b=[rep("w2")]))
    delta = feed.answer(v1, "e", delta=True)
    assert (delta.version, sorted(delta.models)) == (v2, ["a", "b"])
    assert held.merged(delta) == feed.table


async def test_any_copy_a_watcher_took_merges_with_its_delta_into_the_whole_table() -> None:
    """Copies taken after every publication, each brought up to date by a delta from its
    version after every later one: always the table a fresh watcher gets whole."""
    steps = [
        routes(a=[], b=[], c=[]),
        routes(a=[rep("w1")], b=[], c=[]),
        routes(a=[rep("w1", tier="disk")], b=[], c=[]),  # load only: the version stays
        routes(a=[rep("w1", tier="disk")], b=[rep("w2")], c=[]),
        routes(a=[rep("w1", tier="disk")], b=[rep("w2", ready_at=3.0)]),  # c removed
        routes(a=[rep("w1", tier="disk"), rep("w3")], b=[rep("w2", ready_at=3.0)], c=[]),
        routes(a=[rep("w1", tier="disk"), rep("w3")], b=[rep("w2", ready_at=3.0)], c=[]),  # nothing
    ]
    feed = RouteFeed("e", history=3)
    copies: list[RouteTable] = []
    for models in steps:
        await published(feed, models)
        copies.append(feed.answer(-1, None))
        for held in copies:
            answer = feed.answer(held.version, "e", delta=True)
            assert held.merged(answer) == feed.table
    assert feed.table.version == 5


def test_a_delta_merges_only_into_the_version_it_was_made_from() -> None:
    held = RouteTable(epoch="e", version=3, models=routes(a=[], b=[]))
    delta = RouteTable(epoch="e", version=5, base_version=3, models=routes(a=[rep("w1")]), removed=["b"])
    assert held.merged(delta) == RouteTable(epoch="e", version=5, models=routes(a=[rep("w1")]))
    assert held.model_copy(update={"version": 4}).merged(delta) is None
    assert held.model_copy(update={"epoch": "other"}).merged(delta) is None
    whole = RouteTable(epoch="other", version=1, models={})
    assert held.merged(whole) is whole
