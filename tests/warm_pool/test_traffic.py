"""Activators' traffic as the controller takes it in (warm_pool.traffic)."""

from __future__ import annotations

from warm_pool.policy.decide import ModelActivity
from warm_pool.traffic import Traffic


def test_arrivals_are_the_differences_of_each_activators_counter() -> None:
    traffic = Traffic(clock=lambda: 10_000.0, wake=lambda: None)
    idle = {"demo": ModelActivity()}
    traffic.report("a", idle, arrivals={"demo": 5}, ttfts={"demo": [0.1]})
    traffic.report("b", idle, arrivals={"demo": 2})
    # The first report of each activator is a baseline (after a controller restart its
    # counter holds everything since the activator started).
    taken = traffic.take({})
    assert (taken["demo"].arrivals, taken["demo"].ttfts) == (0, (0.1,))
    traffic.report("a", idle, arrivals={"demo": 8})
    traffic.report("b", idle, arrivals={"demo": 2})
    taken = traffic.take({})
    assert (taken["demo"].arrivals, taken["demo"].ttfts) == (3, ())  # 8 - 5 and 2 - 2
    traffic.report("a", idle, arrivals={"demo": 1})  # a restarted activator counts from zero
    assert traffic.take({})["demo"].arrivals == 1
    assert traffic.take({}) == {}  # taken once


def test_a_model_first_reported_by_a_known_activator_counts_all_its_arrivals() -> None:
    # An activator leaves out the models it never had a request for: when one first
    # appears in its reports, its counter holds only new arrivals. (Only an activator's
    # very first report to this controller sets baselines.)
    traffic = Traffic(clock=lambda: 100.0, wake=lambda: None)
    traffic.report("a", {}, arrivals={"hot": 7})
    assert traffic.take({})["hot"].arrivals == 0  # a baseline: arrivals before this controller
    traffic.report("a", {"tail": ModelActivity(queued=1, last_request_at=99.0)}, arrivals={"hot": 7, "tail": 1})
    taken = traffic.take({})
    assert taken["tail"].arrivals == 1 and taken["hot"].arrivals == 0
