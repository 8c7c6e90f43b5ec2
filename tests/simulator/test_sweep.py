"""Sweeps: the Pareto frontier, variant building, the comma-list options, and
`thaw simulate --sweep` / `thaw pool recommend` end to end on a small generated trace."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator import generate, sweep
from simulator.run import prepare, simulate
from simulator.sweep import UNLIMITED, Axes, Settings, Variant
from simulator.traces import read_trace, write_generic
from thaw.cli.main import main
from thaw.config import ThawConfig, load_config, parse_config

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# examples/simulate.yaml's structure, smaller: one standby always (standby_min =
# standby_max = 1), so variants differ in replica time, not in standby.
CONFIG: dict[str, Any] = {
    "shapes": [{"name": "g6e-xlarge", "gpu_type": "l40s-48gb", "gpu_count": 1, "gpu_memory_gib": 44.4,
                "host_memory_gib": 32, "price_per_hour_usd": 1.861, "boot_s": 90}],
    "pools": [{"shape": "g6e-xlarge", "standby_min": 1, "standby_max": 1, "max_instances": 40,
               "budget_usd_per_hour": 5, "standby_margin": 0.5, "standby_hold_s": 300}],
    "models": [{"name": "template-8b", "uri": "s3://thaw/models/template-8b", "shape": "g6e-xlarge",
                "max_context_tokens": 4096,
                "autoscaling": {"min_replicas": 0, "max_replicas": 4, "target_concurrency": 16,
                                "max_concurrency_per_replica": 32, "idle_grace_s": 300,
                                "activation_timeout_s": 120, "keep_alive": "fixed"}}],
}
N_MODELS = 5
RANGES = ["--budgets", "0,none", "--idle-grace-s", "30,300", "--keep-alive", "fixed,histogram"]


def base_config() -> ThawConfig:
    return parse_config(CONFIG)


# -- the Pareto frontier ----------------------------------------------------------------

# (usd, cold share, p99) per point; the indices no other point dominates.
PARETO_CASES = [
    pytest.param([(1, 0.5, 10)], [0], id="one point"),
    # b is no worse anywhere and better in usd: a is dominated
    pytest.param([(2, 0.5, 10), (1, 0.5, 10)], [1], id="cheaper, else equal"),
    # equal points dominate neither: both stay
    pytest.param([(1, 0.5, 10), (1, 0.5, 10)], [0, 1], id="ties"),
    # a trade-off: each is better somewhere
    pytest.param([(1, 0.5, 10), (2, 0.1, 10), (3, 0.1, 5)], [0, 1, 2], id="a staircase"),
    # (3, 0.6, 12) is beaten by (1, 0.5, 10) on all three; (2, 0.5, 10) by it on usd only
    pytest.param([(1, 0.5, 10), (3, 0.6, 12), (2, 0.5, 10), (4, 0.0, 20)], [0, 3], id="dominated twice"),
    # a run that served nothing has p99 inf: dominated by any equal-cost run that did
    pytest.param([(1, 0.2, math.inf), (1, 0.2, 30)], [1], id="inf p99"),
]


@pytest.mark.parametrize(("costs", "front"), PARETO_CASES)
def test_pareto_front(costs: list[tuple[float, ...]], front: list[int]) -> None:
    assert sweep.pareto_front(costs) == front


def test_objectives_of_a_run_that_served_nothing() -> None:
    assert sweep.objectives({"usd": 2.0, "cold_start_share": 1.0, "ttft_s": {"p99": None}}) == (2.0, 1.0, math.inf)


# -- variants -----------------------------------------------------------------------------


def test_every_knob_lands_on_every_pool_and_model() -> None:
    base = base_config().model_copy(update={"models": [
        m.model_copy(update={"name": n}) for n in ("a", "b") for m in base_config().models]})
    s = Settings(budget_usd_per_hour=UNLIMITED, idle_grace_s=60.0, keep_alive="histogram", standby_max=0)
    cfg = sweep.apply_settings(base, s)
    pool = cfg.pools[0]
    # standby_max 0 pulls standby_min (1) down with it; "none" is no budget
    assert (pool.budget_usd_per_hour, pool.standby_min, pool.standby_max) == (None, 0, 0)
    assert pool.max_instances == 40 and pool.standby_hold_s == 300  # the rest untouched
    assert [(m.autoscaling.idle_grace_s, m.autoscaling.keep_alive) for m in cfg.models] == [(60.0, "histogram")] * 2
    assert all(m.autoscaling.max_replicas == 4 for m in cfg.models)
    assert base.pools[0].standby_min == 1 and base.models[0].autoscaling.keep_alive == "fixed"  # base unchanged
    assert sweep.variant_name(s) == "budget=none idle_grace=60 keep_alive=histogram standby_max=0"
    assert s.to_json() == {"budget_usd_per_hour": None, "standby_max": 0, "idle_grace_s": 60.0,
                           "keep_alive": "histogram"}


@pytest.mark.parametrize(("name", "pool", "autoscaling"), [
    ("always-on", (5.0, 1, 1), (1, 300.0, "fixed")),  # the trace's models only: see below
    ("knative-defaults", (5.0, 1, 1), (0, 90.0, "fixed")),  # 60 s stable window + 30 s grace
    ("keepalive-10min", (5.0, 1, 1), (0, 600.0, "fixed")),
    ("no-standby", (5.0, 0, 0), (0, 300.0, "fixed")),
])
def test_baselines(name: str, pool: tuple[Any, ...], autoscaling: tuple[Any, ...]) -> None:
    cfg = sweep.apply_settings(base_config(), sweep.BASELINES[name][0], traced=["template-8b"])
    p, a = cfg.pools[0], cfg.models[0].autoscaling
    assert (p.budget_usd_per_hour, p.standby_min, p.standby_max) == pool
    assert (a.min_replicas, a.idle_grace_s, a.keep_alive) == autoscaling


def test_always_on_leaves_models_the_trace_never_requests_at_zero() -> None:
    cfg = sweep.apply_settings(base_config(), sweep.BASELINES["always-on"][0], traced=["m000"])
    assert cfg.models[0].autoscaling.min_replicas == 0


def test_sweep_variants_cover_the_axes_in_order() -> None:
    variants = sweep.sweep_variants(Axes((0.0, UNLIMITED), (30.0, 300.0), ("fixed", "histogram")))
    assert len(variants) == 2 * 2 * 2
    assert variants[0].name == "budget=0 idle_grace=30 keep_alive=fixed"
    assert variants[-1].name == "budget=none idle_grace=300 keep_alive=histogram"
    assert len({v.name for v in variants}) == len(variants)


def test_an_impossible_variant_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"pool g6e-xlarge: standby_max \(50\) must not exceed max_instances"):
        sweep.apply_settings(base_config(), Settings(standby_max=50))


# -- the comma-list options ---------------------------------------------------------------


@pytest.mark.parametrize(("parse", "text", "message"), [
    (sweep.budgets_arg, "1,x", "'x' is not a number"),
    (sweep.budgets_arg, "-1", "must be a finite number >= 0"),
    (sweep.budgets_arg, "inf", "must be a finite number >= 0"),
    (sweep.budgets_arg, "1,,2", "empty item"),
    (sweep.budgets_arg, "5,none,5", "lists 5 more than once"),
    (sweep.seconds_list_arg, "30,1m", "'1m' is not a number"),
    (sweep.keep_alive_arg, "fixed,lru", "unknown policy 'lru'; valid: fixed, histogram"),
    (sweep.counts_arg, "1.5", "'1.5' is not a whole number"),
    (sweep.counts_arg, "-2", "must be >= 0"),
    (sweep.positive_int_arg, "0", "must be >= 1"),
    (sweep.share_arg, "5", "between 0 and 1"),
])
def test_comma_list_errors(parse: Any, text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        parse(text)


def test_comma_lists_parse() -> None:
    assert sweep.budgets_arg("0, 2.5,None") == (0.0, 2.5, UNLIMITED)
    assert sweep.keep_alive_arg("histogram") == ("histogram",)
    assert sweep.counts_arg("0,4") == (0, 4)


def test_a_bad_list_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--sweep", "--keep-alive", "lru"])
    assert exc.value.code == 2
    assert "unknown policy 'lru'" in capsys.readouterr().err


# -- end to end ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("sweep")
    cfg = d / "thaw.yaml"
    cfg.write_text(yaml.safe_dump({"data_dir": str(d / ".thaw"), **CONFIG}))
    # About 6 requests an hour per model: minutes apart, so replicas come and go.
    write_generic(generate.poisson(N_MODELS, 3 * 3600.0, rate_per_hour=6.0, seed=11), d / "trace.csv")
    return cfg, d / "trace.csv"


def _inputs(files: tuple[Path, Path]) -> list[str]:
    cfg, trace = files
    return ["--trace", str(trace), "--config", str(cfg), "--model-template", "template-8b"]


@pytest.fixture(scope="module")
def swept(files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    outs = {}
    for jobs in (1, 2):
        out = tmp_path_factory.mktemp(f"jobs{jobs}")
        assert main(["simulate", *_inputs(files), *RANGES, "--sweep", "--jobs", str(jobs), "--out-dir", str(out)]) == 0
        outs[jobs] = out
    return {"outs": outs, "doc": json.loads((outs[1] / "sweep.json").read_text())}


def test_sweep_does_not_depend_on_jobs(swept: dict[str, Any]) -> None:
    one, two = (swept["outs"][j] / "sweep.json" for j in (1, 2))
    assert one.read_text() == two.read_text()


def test_sweep_writes_points_frontier_and_plot(swept: dict[str, Any]) -> None:
    doc = swept["doc"]
    points = {p["name"]: p for p in doc["points"]}
    assert len(points) == 4 + 2 * 2 * 2  # baselines + budgets x idle graces x keep-alives
    assert set(doc["baselines"]) == {"always-on", "knative-defaults", "keepalive-10min", "no-standby"}
    assert all("per_model" not in p["summary"] for p in doc["points"])
    assert doc["frontier"] == [p["name"] for p in doc["points"] if p["frontier"]] != []
    assert points["budget=none idle_grace=30 keep_alive=fixed"]["settings"] == {
        "budget_usd_per_hour": None, "idle_grace_s": 30.0, "keep_alive": "fixed"}
    assert (swept["outs"][1] / "frontier.png").read_bytes().startswith(PNG_SIGNATURE)
    # Each point against the keep-alive oracle at its idle replica time. A fixed keep-alive
    # never does better than it; always-on does (its replicas are up before the first
    # requests, which the oracle, a keep-alive policy, counts as cold).
    assert doc["oracle"]["models"] == N_MODELS
    for p in doc["points"]:
        o = p["oracle"]
        assert o["cold_starts"] == p["summary"]["cold_starts"], (p["name"], o)
        if p["settings"].get("keep_alive") == "fixed":
            assert o["extra_cold_starts"] >= 0, (p["name"], o)
    assert points["always-on"]["oracle"]["extra_cold_starts"] < 0
    # A learned keep-alive point against the fixed ones of its budget, where its idle
    # time lies between theirs; no other point has that.
    for p in doc["points"]:
        if p["versus_fixed"] is not None:
            assert p["settings"]["keep_alive"] == "histogram"
            assert p["versus_fixed"]["fixed_cold_starts_at_same_idle"] > 0


def test_a_learned_keep_alive_is_put_against_the_fixed_timeouts_of_its_settings_at_its_idle_time() -> None:
    def point(budget: float, grace: float, keep: str) -> sweep.Point:
        s = Settings(budget_usd_per_hour=budget, idle_grace_s=grace, keep_alive=keep)  # type: ignore[arg-type]
        return sweep.Point(Variant(sweep.variant_name(s), "sweep", s), {}, False)

    points = [point(10, 60, "fixed"), point(10, 600, "fixed"), point(10, 300, "histogram"),
              point(10, 6000, "histogram"), point(20, 300, "histogram"), point(20, 60, "fixed")]
    oracle = [{"idle_replica_hours": h, "cold_starts": c} for h, c in
              [(10.0, 1000), (50.0, 200), (20.0, 300), (80.0, 50), (20.0, 300), (5.0, 900)]]
    out = sweep.versus_fixed(points, oracle)
    # Budget 10: fixed at (10 h, 1000) and (50 h, 200); at 20 h the line gives 800, the
    # learned point's 300 is 0.375 of it. 80 h is past the fixed points: none. Budget 20
    # has one fixed point: no line. Fixed points themselves are not compared.
    assert out == [None, None, {"fixed_cold_starts_at_same_idle": 800.0, "vs_fixed": 0.375}, None, None, None]


def test_always_on_costs_most_and_cold_starts_only_on_first_loads(swept: dict[str, Any],
                                                                  files: tuple[Path, Path]) -> None:
    points = {p["name"]: p["summary"] for p in swept["doc"]["points"]}
    always = points.pop("always-on")
    assert all(always["usd"] >= s["usd"] for s in points.values()), (always["usd"], max(
        (s["usd"], n) for n, s in points.items()))
    # A replica per model all the time: a model waits only for its first load, so at
    # most one cold start per model of the trace, none after.
    assert always["cold_starts"] <= N_MODELS and always["activation_timeouts"] == 0
    cfg, trace_file = files
    inputs = prepare(load_config(cfg), read_trace(trace_file), template="template-8b")
    tr = inputs.trace
    result, _ = simulate(inputs, cfg=sweep.apply_settings(inputs.cfg, sweep.BASELINES["always-on"][0], tr.models))
    first = {name: tr.t[tr.model.index(i)] for i, name in enumerate(tr.models)}
    assert len(result.cold_starts) == always["cold_starts"]
    assert all(c.at == first[c.model] for c in result.cold_starts)


def test_recommend_prints_the_cheapest_point_as_yaml(files: tuple[Path, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    target = 1000.0  # every point that timed nothing out meets it: the cheapest of them wins
    rc = main(["pool", "recommend", *_inputs(files), *RANGES, "--ttft-p99-s", str(target), "--jobs", "1",
               "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads((tmp_path / "sweep.json").read_text())
    ok = [p for p in doc["points"] if p["name"] != "always-on" and p["summary"]["activation_timeouts"] == 0
          and p["summary"]["ttft_s"]["p99"] <= target]
    chosen = min(ok, key=lambda p: p["summary"]["usd"])
    fragment = yaml.safe_load(out)
    pool, model = fragment["pools"][0], fragment["models"][0]
    assert pool["shape"] == "g6e-xlarge" and model["name"] == "template-8b"  # the file's model, not the copies
    base = {"budget_usd_per_hour": 5.0, "standby_min": 1, "standby_max": 1, "idle_grace_s": 300.0,
            "keep_alive": "fixed", "min_replicas": 0}
    want = base | chosen["settings"]
    assert {k: pool[k] for k in ("budget_usd_per_hour", "standby_min", "standby_max")} == {
        k: want[k] for k in ("budget_usd_per_hour", "standby_min", "standby_max")}
    # only the autoscaling keys that changed
    assert model["autoscaling"] == {k: v for k, v in chosen["settings"].items()
                                    if k in ("idle_grace_s", "keep_alive", "min_replicas") and v != base[k]}
    assert f"${chosen['summary']['usd']:.2f}" in out and chosen["name"] in out
    assert re.search(r"^# vs always-on .*: \$\d+\.\d\d", out, re.M)


def test_recommend_fails_when_no_variant_meets_the_slo(files: tuple[Path, Path],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["pool", "recommend", *_inputs(files), "--budgets", "none", "--idle-grace-s", "300",
               "--keep-alive", "fixed", "--ttft-p99-s", "0.001", "--jobs", "1"])
    captured = capsys.readouterr()
    assert rc == 1 and captured.out == ""
    assert "no variant meets TTFT p99 <= 0.001 s" in captured.err
    assert re.search(r"closest: \S.*\(\$\d+\.\d\d, TTFT p99 \d+\.\d\d s", captured.err)
