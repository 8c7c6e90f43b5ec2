"""Several engines on one worker in the simulator (``pools[].pack``): the policy's
``Pack`` carried out as a replica that is no instance, the room it takes and frees, and
`thaw simulate --compare-packing`."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.costs import CostModel
from simulator.packing import fit_notes, packing_variants
from simulator.run import Inputs
from simulator.sim import Simulator, engine_sizes
from tests.simulator.support import cli_args, config, costs, equivalence_cfg, trace
from thaw.config import ThawConfig
from thaw.fit import engine_capacity
from thaw.units import GiB
from warm_pool.policy.decisions import Pack


def pack_config(models: int = 3, *, pack: bool = True, shares: list[float] | None = None, **kw: object) -> ThawConfig:
    """``config()`` (one 44.4 GiB L40S per worker, $3.60/h) with every model's engine a
    share of the GPU (``gpu_memory_utilization``, default 0.3: 13.3 GiB, three fit)."""
    data = config(models, **kw).model_dump()  # type: ignore[arg-type]
    data["pools"][0]["pack"] = pack
    for i, m in enumerate(data["models"]):
        m["engine"]["gpu_memory_utilization"] = (shares or [0.3] * models)[i]
    return ThawConfig.model_validate(data)


# m0, m1 and m2 each ask once, 20 s apart: sparse traffic of three models.
THREE = [(0.0, "m0", 100, 100), (20.0, "m1", 100, 100), (40.0, "m2", 100, 100)]


def test_packed_engines_share_one_instance_and_cost_less() -> None:
    cfg = pack_config(idle_grace_s=100)
    r = Simulator(cfg, costs(cfg), trace(THREE), record_decisions=True).run()
    s = r.summary
    # t=0: m0 takes the standby A (10 s load); the pool launches B (60 s boot). At 20 m1
    # goes into A's free room (13.3 of 44.4 GiB held), at 40 m2 (3 x 13.3 = 40.0 GiB):
    # no standby taken, a full start of 10 s each, no boot. Each TTFT 10 + 0.1 s.
    packs = [(t, d.worker_id, d.model) for t, d in r.decisions if isinstance(d, Pack)]
    assert packs == [(20.0, "gpu-000001", "m1"), (40.0, "gpu-000001", "m2")]
    assert s["cold_starts_by_tier"] == {"s3": 1, "packed": 2}
    assert s["ttft_s"]["p99"] == pytest.approx(10.1)
    # The last answer at 40 + 10.1 + 100 x 0.01 = 51.1 ends the run. Instances: A and B,
    # 51.1 s each; the packed engines are none.
    assert s["instance_seconds"] == pytest.approx(2 * 51.1)
    assert s["usd"] == pytest.approx(2 * 51.1 * 0.001)  # $3.60/h is $0.001/s
    # Replica-seconds are each engine's: 51.1 + 31.1 + 11.1.
    assert s["replica_seconds"] == pytest.approx(51.1 + 31.1 + 11.1)
    # A's cost is shared by the engines on it: m0 alone for 20 s, with m1 for 20 s, with
    # m1 and m2 for 11.1 s; B stands by.
    per = s["per_model"]
    assert per["m0"]["usd"] == pytest.approx((20 + 20 / 2 + 11.1 / 3) * 0.001)
    assert per["m2"]["usd"] == pytest.approx(11.1 / 3 * 0.001)
    assert s["standby_seconds"] == pytest.approx(51.1)

    unpacked = Simulator(pack_config(pack=False, idle_grace_s=100), costs(cfg), trace(THREE)).run().summary
    assert "packed" not in unpacked["cold_starts_by_tier"]
    assert unpacked["instance_seconds"] > 2.5 * s["instance_seconds"]
    assert unpacked["usd"] > 2.5 * s["usd"]


def test_packing_lowers_instance_hours_on_a_sparse_multi_model_trace() -> None:
    """Twelve models, each a short burst every 15 minutes or so, over 3 hours."""
    rnd = random.Random(7)
    rows = [(round(t + rnd.uniform(0, 30), 3), f"m{i}", 200, 50)
            for i in range(12) for t in range(rnd.randint(0, 900), 3 * 3600, rnd.randint(600, 1200))]

    def run(pack: bool) -> dict[str, object]:
        cfg = pack_config(12, pack=pack, idle_grace_s=300, standby_max=2, max_instances=20)
        return Simulator(cfg, costs(cfg), trace(rows)).run().summary

    off, on = run(False), run(True)
    assert on["requests"] == off["requests"] == len(rows)
    assert on["cold_starts_by_tier"]["packed"] > 0  # type: ignore[index]
    assert on["instance_seconds"] < 0.75 * off["instance_seconds"]  # type: ignore[operator]
    assert on["usd"] < off["usd"]  # type: ignore[operator]


def test_a_model_that_does_not_fit_takes_a_standby() -> None:
    # m0 holds 0.5 x 44.4 = 22.2 GiB of A. m1 (0.6: 26.6 GiB) does not fit beside it
    # and takes the standby B; m2 (0.3: 13.3 GiB) fits beside either, and goes where
    # the least room is left (best fit): B, 17.8 GiB free against A's 22.2.
    cfg = pack_config(shares=[0.5, 0.6, 0.3], idle_grace_s=100, standby_max=2, standby_min=2)
    r = Simulator(cfg, costs(cfg), trace(THREE), record_decisions=True).run()
    assert [(d.model, d.worker_id) for _, d in r.decisions if isinstance(d, Pack)] == [("m2", "gpu-000002")]
    assert [(c.model, c.tier) for c in r.cold_starts] == [("m0", "s3"), ("m1", "s3"), ("m2", "packed")]
    assert engine_sizes(cfg, costs(cfg)) == {m: int(44.4 * GiB * share)
                                              for m, share in (("m0", 0.5), ("m1", 0.6), ("m2", 0.3))}


def test_workers_report_capacity_only_where_their_pool_packs() -> None:
    for pack, cap in ((True, engine_capacity(pack_config().shapes[0])), (False, 0)):
        sim = Simulator(pack_config(pack=pack), costs(pack_config()), trace(THREE))
        [w] = sim.fleet.workers.values()
        assert w.view.capacity_bytes == cap and w.view.memory_bytes == 0
    assert engine_capacity(pack_config().shapes[0]) == int(44.4 * GiB)


def test_a_released_engine_frees_its_room_at_once_in_both_modes() -> None:
    """One instance at most, two engines fit (0.5 each). m2 waits at zero behind m0 and
    the packed m1, whose engine drains; its release frees the room, which must re-judge
    m2 in the fast mode (its shape changed) exactly when the controller would."""
    cfg = pack_config(shares=[0.5] * 3, idle_grace_s=30, standby_min=0, standby_max=0, max_instances=1, boot_s=20,
                      activation_timeout_s=600)
    c = costs(cfg, load_s=10, release_s=2)
    tr = trace([(0.0, "m0", 100, 100), (40.0, "m1", 100, 100), (50.0, "m2", 100, 100), (60.0, "m0", 100, 100),
                (83.0, "m2", 100, 100)])
    fast = Simulator(cfg, c, tr, record_decisions=True).run()
    exact = Simulator(cfg, c, tr, exact=True, record_decisions=True).run()
    assert fast.decisions == exact.decisions and fast.summary == exact.summary
    # m1 packed at 40 (its load ends at 50) and m0 (hosting it) serve the one instance:
    # m2 at 50 is refused past its grace, at 53 (nothing on its way, nothing to evict:
    # packed engines and their hosts never are). m1 done at 51.1, idle 30 s: released at 82, gone 2 s
    # later; m2 at 83 waits for that room, is packed into it at 84, ready at 94: 11 s.
    kinds = [(t, type(d).__name__, getattr(d, "model", None)) for t, d in fast.decisions]
    assert (40.0, "Pack", "m1") in kinds and (82.0, "Release", "m1") in kinds and (84.0, "Pack", "m2") in kinds
    assert fast.summary["per_model"]["m2"]["capacity_refusals"] == 1 and fast.summary["evictions"] == 0
    assert [round(x.ready_after_s, 3) for x in fast.cold_starts if x.model == "m2"] == [11.0]
    # A worker whose own engine went keeps standing for its packed one: never a free
    # standby, never terminated (one instance all along).
    assert fast.summary["instance_seconds"] == pytest.approx(fast.end_s)


@pytest.mark.parametrize("variant", [6, 7])
def test_the_fast_mode_makes_the_controllers_decisions_when_packing(variant: int) -> None:
    """Seeded traces beside the property test's: room taken and freed by packed engines
    of four models, with the asleep tier and a disk cache in variant 7."""
    cfg = equivalence_cfg(variant)
    c = costs(cfg, load_s=7, prefill=2000, tpot_s=0.05, release_s=2)
    packed = 0
    for seed in range(12):
        rnd = random.Random(seed)
        span = rnd.choice([100, 400, 2000])
        tr = trace([(round(rnd.uniform(0, span), 3), f"m{rnd.randint(0, 3)}", rnd.randint(1, 4000),
                     rnd.randint(1, 400)) for _ in range(rnd.randint(5, 80))])
        fast = Simulator(cfg, c, tr, record_decisions=True).run()
        exact = Simulator(cfg, c, tr, exact=True, record_decisions=True).run()
        assert fast.decisions == exact.decisions, seed
        assert fast.summary == exact.summary, seed
        packed += fast.summary["cold_starts_by_tier"].get("packed", 0)
    assert packed > 0


def test_packing_variants_differ_only_in_pack_and_the_engine_share() -> None:
    off, on = packing_variants(pack_config(pack=False), gpu_memory_utilization=0.45)
    assert [p.pack for p in off.pools] == [False] and [p.pack for p in on.pools] == [True]
    assert {m.engine.gpu_memory_utilization for m in off.models + on.models} == {0.45}
    assert off.model_copy(update={"pools": on.pools}) == on
    data = config(2).model_dump()
    data["pools"][0]["prebuild"] = ["m0"]
    with pytest.raises(ValueError, match="remove prebuild"):
        packing_variants(ThawConfig.model_validate(data))


def test_fit_notes_say_how_many_engines_fit_and_warn_of_weights_that_fill_their_share() -> None:
    cfg = pack_config(shares=[0.3, 0.3, 0.5])
    c = costs(cfg)
    inputs = Inputs(cfg, trace(THREE), CostModel({**c.models, "m2": replace(c.models["m2"], weights_gib=30.0)}))
    # 44.4 GiB: three engines of 13.3 GiB, or two of 22.2; m2's 30 GiB of weights fill its 22.2.
    assert fit_notes(cfg, inputs) == [
        "packing gpu: 44.4 GiB per instance; 2 model(s) of 13.3 GiB: 3 per instance; "
        "1 model(s) of 22.2 GiB: 2 per instance",
        "warning: 1 model(s) (m2) have weights as large as their engine's share of the GPU: no room for a KV "
        "cache (raise --gpu-memory-utilization)"]


def test_the_cli_compares_packing_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from thaw.cli.main import main

    args = cli_args(tmp_path, config(3, idle_grace_s=100), THREE, prefill=1000, tpot_s=0.01)
    out = tmp_path / "packing.json"
    assert main([*args, "--compare-packing", "--gpu-memory-utilization", "0.3", "--out-dir", str(out)]) == 0
    captured = capsys.readouterr()
    rows = {line[:20].strip(): line[20:].split() for line in captured.out.splitlines()}
    # The first test's runs: 304.4 instance-seconds without packing (0.08 h); A and B
    # for 51.1 s each with it (0.03 h), m1 and m2 packed into A.
    assert rows[""] == ["one", "per", "instance", "packed"]
    assert rows["instance-hours"] == ["0.08", "0.03"] and rows["packed"] == ["0", "2"]
    assert rows["cold-start share"] == ["100.00%", "100.00%"] and rows["TTFT p99 (s)"][1] == "10.10"
    assert "packing gpu: 44.4 GiB per instance; 3 model(s) of 13.3 GiB: 3 per instance" in captured.err
    doc = json.loads(out.read_text())
    runs = doc["runs"]
    assert set(runs) == {"one_per_instance", "packed"} and doc["gpu_memory_utilization"] == 0.3
    assert runs["packed"]["summary"]["instance_seconds"] == pytest.approx(2 * 51.1)
    assert runs["packed"]["summary"]["cold_starts_by_tier"] == {"s3": 1, "packed": 2}
    assert doc["capacity_bytes"] == {"gpu": int(44.4 * GiB)}
    # Without a .json name, --out-dir is the directory of compare-packing.json.
    assert main([*args, "--compare-packing", "--out-dir", str(tmp_path / "d")]) == 0
    assert (tmp_path / "d" / "compare-packing.json").exists()
    # The engine share goes with the comparison; the comparison not with a sweep.
    assert main([*args, "--gpu-memory-utilization", "0.3"]) == 2
    assert main([*args, "--compare-packing", "--sweep"]) == 2
    assert "choose one" in capsys.readouterr().err
