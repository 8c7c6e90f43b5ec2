"""The controller's Prometheus metrics: the fleet by state, and the policy's inputs and
outputs (the autoscaler's stages, keep-alive windows, the standby sizer's target and
budget grant), exported after each tick; the per-model ones are read from the last
tick's policy state when scraped."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from thaw.config import Model, ThawConfig
from warm_pool.db import Db
from warm_pool.policy.autoscaler import ttft_p90
from warm_pool.policy.decide import ModelState, PolicyState, WorkerView


class PoolMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.workers = Gauge("thaw_pool_workers", "Workers by shape and state", ["shape", "state"], registry=registry)
        self.decisions = Counter("thaw_pool_decisions_total", "Policy decisions carried out", ["kind", "reason"], registry=registry)
        self.tick = Histogram("thaw_pool_policy_seconds", "Time spent in one policy decision", registry=registry,
                              buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0))
        # A whole turn of the loop (providers, facts, decide, act, publish routes, save), the
        # controller's cost at its fleet's size (`thaw bench control-plane`).
        self.step = Histogram("thaw_pool_step_seconds", "Time spent in one turn of the control loop",
                              registry=registry, buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1,
                                                          0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0))
        # How many models each tick judged (warm_pool.judging: those whose decision can change).
        self.judged = Histogram("thaw_pool_models_judged", "Models judged in one tick", registry=registry,
                                buckets=(0, 1, 10, 100, 1000, 10000, 100000))
        self.launch_backoff = Gauge("thaw_pool_launch_backoff_seconds",
                                    "Seconds left before a shape launches again (capacity errors)", ["shape"],
                                    registry=registry)
        self.launch_failures = Counter("thaw_pool_launch_failures_total", "Launches that failed, by shape and cause",
                                       ["shape", "cause"], registry=registry)
        # warm_pool.fencing: provider actions not made because this controller's term was
        # over (deposed) or its database did not answer.
        self.fenced = Counter("thaw_pool_actions_refused_total",
                              "Provider actions refused before their call, by kind and why", ["kind", "why"],
                              registry=registry)
        self.heartbeats = Counter("thaw_pool_heartbeats_total", "Worker heartbeats, by outcome", ["outcome"],
                                  registry=registry)
        self.standby_seconds = Counter(
            "thaw_pool_standby_seconds", "Standby instance-seconds by shape and use: idle, or lent to batch work",
            ["shape", "use"], registry=registry)
        self.adopted = Gauge("thaw_pool_adopted", "1 once the controller has adopted the fleet after its start",
                             registry=registry)
        # The autoscaler's inputs and outputs and the keep-alive window, per model: read
        # from the last tick's policy state when /metrics is scraped (ModelGauges), not set
        # label by label every tick (with 1,000 models that was 40 % of an idle turn).
        self.models = ModelGauges()
        registry.register(DbStatements())
        registry.register(self.models)
        self.standby_target = Gauge("thaw_pool_standby_target",
                                    "The standby sizer's target, its raw demand and watermarks, and the grant",
                                    ["shape", "value"], registry=registry)
        self.shortfall = Gauge("thaw_pool_budget_shortfall_instances",
                               "Standby instances wanted but not granted by a budget", ["shape"], registry=registry)
        self.spend = Gauge("thaw_pool_spend_usd_per_hour", "Serving + asleep + standby spend", ["shape"],
                           registry=registry)
        self.budget = Gauge("thaw_pool_budget_usd_per_hour",
                            "The budget in force: a pool's (shape), the whole fleet's (shape=\"all\")", ["shape"],
                            registry=registry)
        # Batches (warm_pool/batch/runner.py, updated each of its ticks).
        self.batches = Gauge("thaw_batches", "Batches by status", ["status"], registry=registry)
        self.batch_lines = Gauge("thaw_batch_lines", "Lines of batches not yet ended, by state and model",
                                 ["model", "state"], registry=registry)


# Each per-model gauge: name, help, its labels after ``model``.
MODEL_GAUGES = {
    "thaw_model_backoff_seconds": ("Seconds left in a model's load backoff", ()),
    "thaw_autoscaler_desired_replicas": ("Replicas per stage: raw (demand, TTFT), bounded, target (after delays)",
                                         ("stage",)),
    "thaw_autoscaler_demand": ("Mean requests queued or in flight over a window", ("window",)),
    "thaw_autoscaler_arrivals_per_second": ("Arrivals over the stable window", ()),
    "thaw_autoscaler_ttft_p90_seconds": ("Hot requests' TTFT p90 over the stable window", ()),
    "thaw_autoscaler_panic": ("1 while the model is in panic mode", ()),
    "thaw_keepalive_window_seconds": ("The keep-alive window from the idle start: prewarm (-1: none) and keep_until",
                                      ("edge",)),
    "thaw_keepalive_histogram_in_use": ("1 when the histogram policy decides, 0 when it falls back to fixed", ()),
}


class DbStatements(Collector):
    """Statements this process sent to its databases (``warm_pool.db.Db.statements``)."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("thaw_pool_db_statements", "Statements sent to the state database",
                                  value=Db.statements)


class ModelGauges(Collector):
    """The per-model gauges, computed when scraped from the last tick's policy state (a
    frozen value: nothing to copy). Before the first tick, none."""

    def __init__(self) -> None:
        self.latest: tuple[float, ThawConfig, PolicyState] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {name: GaugeMetricFamily(name, help_, labels=["model", *more])
                    for name, (help_, more) in MODEL_GAUGES.items()}
        if self.latest is not None:
            now, cfg, state = self.latest
            for m in cfg.models:
                _model_samples(families, m, state.models.get(m.name), now)
        yield from families.values()


def _model_samples(f: dict[str, GaugeMetricFamily], m: Model, ms: ModelState | None, now: float) -> None:
    name = m.name
    f["thaw_model_backoff_seconds"].add_metric([name], max((ms.backoff_until - now) if ms else 0.0, 0.0))
    r = ms.last_scale if ms else None
    if r is not None:
        for stage, n in (("raw", r.raw), ("bounded", r.bounded), ("target", r.target)):
            f["thaw_autoscaler_desired_replicas"].add_metric([name, stage], n)
        f["thaw_autoscaler_demand"].add_metric([name, "stable"], r.metrics.stable_demand)
        f["thaw_autoscaler_demand"].add_metric([name, "panic"], r.metrics.panic_demand)
        f["thaw_autoscaler_arrivals_per_second"].add_metric([name], r.metrics.arrivals_per_s)
        p90 = r.metrics.ttft_p90_s
        if p90 is None and ms is not None:  # not needed by its decision: found for the gauge
            p90 = ttft_p90(ms.scale, now, m.autoscaling)
        f["thaw_autoscaler_ttft_p90_seconds"].add_metric([name], p90 if p90 is not None else 0.0)
        f["thaw_autoscaler_panic"].add_metric([name], 1 if r.panic else 0)
    w = ms.keep_alive if ms else None
    if w is not None:
        f["thaw_keepalive_window_seconds"].add_metric([name, "prewarm"],
                                                      -1 if w.prewarm_after_s is None else w.prewarm_after_s)
        f["thaw_keepalive_window_seconds"].add_metric([name, "keep_until"], w.keep_until_s)
        f["thaw_keepalive_histogram_in_use"].add_metric([name], 1 if w.mode == "histogram" else 0)


class Backoff(Protocol):
    """A shape's launch backoff, as the metrics read it."""

    @property
    def until(self) -> float: ...


def export(mx: PoolMetrics, now: float, cfg: ThawConfig, views: dict[str, WorkerView], state: PolicyState,
           shape_backoff: Mapping[str, Backoff]) -> None:
    """Set the gauges from one tick's views and policy state."""
    counts: dict[tuple[str, str], int] = {}
    for v in views.values():
        if v.host is not None:
            continue  # a packed engine is no worker of its own: its worker counts
        counts[(v.shape, v.state.value)] = counts.get((v.shape, v.state.value), 0) + 1
    mx.workers.clear()
    for (shape, st), n in counts.items():
        mx.workers.labels(shape, st).set(n)
    mx.models.latest = (now, cfg, state)
    mx.budget.clear()
    if cfg.budget_usd_per_hour is not None:
        mx.budget.labels("all").set(cfg.budget_usd_per_hour)
    for p in cfg.pools:
        if p.budget_usd_per_hour is not None:
            mx.budget.labels(p.shape).set(p.budget_usd_per_hour)
        b = shape_backoff.get(p.shape)
        mx.launch_backoff.labels(p.shape).set(max(b.until - now, 0.0) if b else 0.0)
        ps = state.pools.get(p.shape)
        if ps is not None and ps.target is not None:
            t = ps.target
            for name, value in (("target", t.target), ("raw", t.raw), ("lower_watermark", t.lower_watermark),
                                ("upper_watermark", t.upper_watermark),
                                ("granted", ps.grant.standby if ps.grant else t.target)):
                mx.standby_target.labels(p.shape, name).set(value)
        if ps is not None and ps.grant is not None:
            mx.shortfall.labels(p.shape).set(ps.grant.shortfall)
            mx.spend.labels(p.shape).set(ps.grant.spend_usd_per_hour)
