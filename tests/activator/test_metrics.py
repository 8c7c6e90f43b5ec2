"""The activator's metrics: a family's children kept by label values are the family's own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from activator.metrics import ActivatorMetrics


def test_kept_children_are_the_familys_and_count_in_its_exposition() -> None:
    registry = CollectorRegistry()
    m = ActivatorMetrics(registry)
    child = m.requests.labels("demo", "200")
    assert m.requests.labels("demo", "200") is child
    assert child is m.requests.family.labels("demo", "200")  # the same series, not a copy
    child.inc()
    m.requests.labels("demo", "200").inc(2)
    m.requests.labels("demo", "429").inc()
    m.ttft.labels("demo", "hot").observe(0.02)
    text = generate_latest(registry).decode()
    assert 'thaw_requests_total{model="demo",status="200"} 3.0' in text
    assert 'thaw_requests_total{model="demo",status="429"} 1.0' in text
    assert 'thaw_ttft_seconds_count{model="demo",start="hot"} 1.0' in text
    assert m.requests.describe() == m.requests.family.describe()  # the rest is the family's
