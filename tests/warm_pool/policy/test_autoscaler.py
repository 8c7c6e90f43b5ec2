"""The replica autoscaler's stages, each as a table, then tick by tick with a clock the
test moves."""

from __future__ import annotations

import pytest

from thaw.config import Autoscaling
from warm_pool.policy.autoscaler import (
    ScaleState,
    WindowMetrics,
    autoscale,
    bounds,
    desired,
    observe,
    steady_band,
    ttft_p90,
    window_metrics,
)

A = Autoscaling(min_replicas=0, max_replicas=8, target_concurrency=4, stable_window_s=60, panic_window_s=6,
                panic_threshold=2, upscale_delay_s=0, downscale_delay_s=30, max_scale_up_rate=2, idle_grace_s=300)


def m(stable: float, panic: float | None = None, ttft: float | None = None) -> WindowMetrics:
    return WindowMetrics(stable, stable if panic is None else panic, 0.0, ttft)


@pytest.mark.parametrize(
    ("metrics", "current", "cfg", "want", "panic"),
    [
        # 10 / 4 = 2.5 -> 3
        (m(10), 2, A, 3, False),
        # 8 / 4 = 2 exactly -> 2 (no replica for rounding noise)
        (m(8), 3, A, 2, False),
        # low but not zero: 0.5 / 4 -> 1
        (m(0.5), 3, A, 1, False),
        # panic: 17 >= 2 x 2 x 4 = 16 over the panic window; 17 / 4 = 4.25 -> 5
        (m(6, panic=17), 2, A, 5, True),
        # 15 < 16: no panic, the stable window decides: 6 / 4 -> 2
        (m(6, panic=15), 2, A, 2, False),
        # at zero there is no panic (nothing to be 2x of)
        (m(0, panic=40), 0, A, 0, False),
        # TTFT p90 1.5 s > SLO 1 s at low concurrency (1 / 4 -> 1): one more -> 3
        (m(1, ttft=1.5), 2, A.model_copy(update={"ttft_slo_s": 1.0}), 3, False),
        # TTFT under the SLO: demand decides
        (m(1, ttft=0.5), 2, A.model_copy(update={"ttft_slo_s": 1.0}), 1, False),
        # a breach with no SLO configured changes nothing
        (m(1, ttft=9.0), 2, A, 1, False),
    ],
)
def test_desired(metrics: WindowMetrics, current: int, cfg: Autoscaling, want: int, panic: bool) -> None:
    raw, is_panic, _, reason = desired(metrics, current, cfg)
    assert (raw, is_panic) == (want, panic), reason


@pytest.mark.parametrize("cfg", [A, A.model_copy(update={"panic_threshold": 1.0, "min_replicas": 2}),
                                 A.model_copy(update={"max_replicas": 3})])
def test_the_steady_band_is_where_desired_keeps_the_replicas(cfg: Autoscaling) -> None:
    # The simulator skips judging a model whose demand stays in this band: it must be
    # exactly where desired() and bounds() keep `current` and panic does not trigger
    # (below the floor a model is brought up, not judged by the band).
    floor = max(cfg.min_replicas, 1)
    for current in range(floor, cfg.max_replicas + 1):
        lower, upper = steady_band(current, cfg)
        for tenth in range(0, 20 * 10 * int(cfg.target_concurrency) + 1):
            d = tenth / 10
            raw, panic, _, _ = desired(m(d), current, cfg)
            steady = bounds(raw, current, floor, cfg) == current and not panic
            assert steady == (lower < d <= upper), (current, d, lower, upper, raw, panic)


def test_a_ttft_breach_waits_while_a_replica_loads() -> None:
    cfg = A.model_copy(update={"ttft_slo_s": 1.0})
    # 1 / 4 -> 1, p90 1.5 s > 1 s, but the previous step is still loading: no more yet.
    assert desired(m(1, ttft=1.5), 2, cfg, loading=1)[:3] == (1, False, False)


def test_held_panic_counts_the_panic_window() -> None:
    # 11.5 < 2 x 2 x 4 = 16: no new trigger, but panic mode holds: 11.5 / 4 -> 3
    assert desired(m(5, panic=11.5), 2, A, in_panic=True)[0] == 3


@pytest.mark.parametrize(
    ("raw", "current", "floor", "want"),
    [
        (3, 2, 0, 3),
        # step cap: max(1 + 1, floor(1 x 2)) = 2
        (7, 1, 0, 2),
        # step cap: floor(3 x 2) = 6
        (7, 3, 0, 6),
        # max_replicas 8
        (20, 6, 0, 8),
        # floor 1 (kept warm) over a raw 0
        (0, 2, 1, 1),
        # no cap on the way down
        (0, 5, 0, 0),
    ],
)
def test_bounds(raw: int, current: int, floor: int, want: int) -> None:
    assert bounds(raw, current, floor, A) == want


def test_windows_average_demand_per_tick_and_count_arrivals() -> None:
    s = ScaleState()
    # 60 s at demand 2 (4 ticks a second), then 6 s at demand 10.
    t = 1000.0
    for _ in range(240):
        s = observe(s, t, 2, 1, (), 60)
        t += 0.25
    for _ in range(24):
        s = observe(s, t, 10, 0, (0.2,), 60)
        t += 0.25
    w = window_metrics(s, t, A)
    # panic window (6 s): all demand 10
    assert w.panic_demand == pytest.approx(10)
    # stable window: the last 60 s: 54 s at 2, 6 s at 10 -> (54 x 2 + 6 x 10) / 60 = 2.8
    assert w.stable_demand == pytest.approx(2.8, abs=0.15)
    # 216 arrivals in the window's 54 s of demand 2 (4 a second) / 60 s
    assert w.arrivals_per_s == pytest.approx(216 / 60, abs=0.1)
    # No TTFT SLO: the p90 is not computed for the decision, only on request.
    assert w.ttft_p90_s is None
    assert ttft_p90(s, t, A) == 0.2
    assert window_metrics(s, t, A.model_copy(update={"ttft_slo_s": 1.0})).ttft_p90_s == 0.2
    assert len(s.observations) <= 62  # a second each: the window's, and the one before it


def test_a_seconds_demand_is_its_last_ticks() -> None:
    # A tick at 0 (demand 0) then a demand signal at 0.1 (demand 1) in the same second:
    # the second holds 1, as if the tick at 0 (which saw nothing new) had not been.
    s = observe(observe(ScaleState(), 10.0, 0, 0, (), 60), 10.1, 1, 1, (), 60)
    assert window_metrics(s, 10.5, A).stable_demand == window_metrics(
        observe(ScaleState(), 10.1, 1, 1, (), 60), 10.5, A).stable_demand == 1.0


class Model:
    """One model driven tick by tick: the replicas follow the target at once, and a new
    one loads for ``load_s`` before it is ready."""

    def __init__(self, cfg: Autoscaling = A, replicas: int = 0, t: float = 10_000.0, load_s: float = 5.0) -> None:
        self.cfg, self.replicas, self.t, self.state = cfg, replicas, t, ScaleState()
        self.load_s = load_s
        self.ready_at: list[float] = []
        self.changes: list[tuple[float, int]] = []

    def tick(self, demand: int, dt: float = 1.0, keep_warm: bool = True, ttft: tuple[float, ...] = ()) -> int:
        self.t += dt
        self.state = observe(self.state, self.t, demand, 0, ttft, self.cfg.stable_window_s)
        loading = sum(1 for r in self.ready_at if r > self.t)
        r, self.state = autoscale(self.state, current=self.replicas, now=self.t, a=self.cfg, demand_now=demand,
                                  keep_warm=keep_warm, loading=loading)
        if r.target != self.replicas:
            self.changes.append((self.t, r.target))
            self.ready_at += [self.t + self.load_s] * max(r.target - self.replicas, 0)
        self.replicas = r.target
        return r.target

    def run(self, demand: int, seconds: int, **kw: object) -> None:
        for _ in range(seconds):
            self.tick(demand, **kw)  # type: ignore[arg-type]


def test_a_request_at_zero_bypasses_every_delay() -> None:
    cfg = A.model_copy(update={"upscale_delay_s": 60})
    model = Model(cfg)
    assert model.tick(1) == 1  # the first tick with a request: one replica, no wait


def test_oscillating_load_inside_the_band_changes_nothing() -> None:
    model = Model(replicas=2)
    model.run(7, 120)  # settle: 7 / 4 -> 2
    # Demand swings between 5 and 8 (raw 2 either way: 5/4 -> 2, 8/4 = 2) for ten minutes.
    for i in range(600):
        model.tick(5 if i % 20 < 10 else 8)
    assert model.replicas == 2 and model.changes == []


def test_a_burst_scales_up_at_once_in_panic() -> None:
    cfg = A.model_copy(update={"upscale_delay_s": 60})
    model = Model(cfg, replicas=1)
    model.run(3, 120)  # one replica's worth (3 / 4 -> 1)
    assert model.replicas == 1
    burst_at = model.t
    # A burst of demand 20. Second 2: the 6 s panic window's mean (4 x 3 + 2 x 20) / 6 =
    # 8.7 >= 2 x 1 x 4: panic. Despite the 60 s upscale delay the count rises at once,
    # one bounded step (x2) per tick: 2, 3, 4, 5.
    model.run(20, 5)
    assert model.changes[0][0] - burst_at <= 2
    assert [n for _, n in model.changes] == [2, 3, 4, 5]


def test_outside_panic_an_increase_waits_for_the_upscale_delay() -> None:
    cfg = A.model_copy(update={"upscale_delay_s": 20, "panic_threshold": 10})
    model = Model(cfg, replicas=1)
    model.run(4, 60)
    model.run(12, 70)  # 12 / 4 = 3 wanted once the stable window has caught up
    first_up = model.changes[0][0]
    # The mean passes one replica's worth within seconds; the increase lands 20 s later.
    assert first_up - (model.t - 70) >= 20


def test_falling_traffic_scales_down_one_step_per_downscale_delay() -> None:
    model = Model(replicas=4)
    model.run(16, 120)  # four replicas' worth (16 / 4)
    assert model.replicas == 4
    model.run(4, 300)  # one replica's worth
    assert model.replicas == 1
    downs = [(t, n) for t, n in model.changes]
    assert [n for _, n in downs] == [3, 2, 1]
    # Each step waited a whole downscale_delay_s (30 s) after the previous one.
    assert all(b[0] - a[0] >= 30 for a, b in zip(downs, downs[1:], strict=False))


def test_no_scale_down_while_in_panic() -> None:
    model = Model(replicas=1)
    model.run(3, 60)
    model.run(30, 5)  # panic: up
    peak = model.replicas
    model.run(0, 30)  # demand gone, but panic holds for the stable window after the burst
    assert model.replicas == peak


def test_zero_traffic_reaches_zero_when_the_keep_alive_ends() -> None:
    model = Model(replicas=2)
    model.run(6, 60)
    # The keep-alive policy keeps the model warm for a while (one replica at least)...
    model.run(0, 100, keep_warm=True)
    assert model.replicas == 1
    # ... and the tick it lets go, the model is at zero, whatever the windows say.
    assert model.tick(0, keep_warm=False) == 0


def test_a_ttft_breach_at_low_concurrency_adds_a_replica() -> None:
    cfg = A.model_copy(update={"ttft_slo_s": 1.0})
    model = Model(cfg, replicas=1)
    model.run(2, 60, ttft=(0.4,))
    assert model.replicas == 1
    # Two slow first tokens a second: once they are more than a tenth of the window's
    # samples (4 s: 8 of 64 > 6.4), the p90 is 2.5 s > 1 s at concurrency 2 < 4: one more.
    for _ in range(4):
        model.tick(2, ttft=(2.5, 2.5))
    assert model.replicas == 2 and len(model.changes) == 1
    # While it loads (5 s) slow first tokens go on, and add nothing more.
    model.run(2, 4, ttft=(2.5, 2.5))
    assert model.replicas == 2
    # Judged on what the whole set serves after that: good first tokens, no more steps
    # (for 20 s: after downscale_delay_s, demand alone would take it back to one).
    model.run(2, 20, ttft=(0.4,))
    assert model.replicas == 2 and len(model.changes) == 1


def test_a_seconds_demand_holds_until_the_next_observation() -> None:
    # Demand 4 from t=0, 0 from t=30 (the controller ticked only at those two times),
    # read at t=59.5: the window (0, 59] holds 4 for seconds 0..29 and 0 for 30..59
    # -> 30 x 4 / 60 = 2; the panic window (53, 59] only 0.
    s = observe(ScaleState(), 0.0, 4, 0, (), 60)
    s = observe(s, 30.0, 0, 0, (), 60)
    w = window_metrics(s, 59.5, A)
    assert w.stable_demand == pytest.approx(2.0)
    assert w.panic_demand == 0.0


def test_skipping_ticks_whose_demand_did_not_change_changes_no_metric() -> None:
    every, changes_only = ScaleState(), ScaleState()
    demand = [0] * 20 + [3] * 15 + [1] * 40 + [0] * 90
    last = None
    for i, d in enumerate(demand):
        t = 500.0 + i
        every = observe(every, t, d, 0, (), 60)
        if d != last:
            changes_only = observe(changes_only, t, d, 0, (), 60)
            last = d
        assert window_metrics(every, t, A) == window_metrics(changes_only, t, A), t
    # Before the first observation nothing counts: one second at 3 is a mean of 3.
    assert window_metrics(observe(ScaleState(), 7.0, 3, 0, (), 60), 7.0, A).stable_demand == 3.0
