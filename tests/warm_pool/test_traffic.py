"""Activators' traffic as the controller takes it in (warm_pool.traffic)."""

from __future__ import annotations

from warm_pool.policy.decide import ModelActivity
from warm_pool.traffic import REPORT_TTL_S, Traffic


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


def test_a_demand_signal_counts_as_queued_until_reported_and_is_forgotten_with_the_reports_of_its_age() -> None:
    traffic = Traffic(clock=lambda: 100.0, wake=lambda: None)
    traffic.demand("cold")
    # A request waits at zero: queued, until a report covers it or 2 s pass.
    assert traffic.activity(101.0)["cold"] == ModelActivity(queued=1, last_request_at=100.0)
    assert traffic.activity(103.0)["cold"] == ModelActivity(last_request_at=100.0)
    # As old as a report that no longer counts (REPORT_TTL_S): forgotten, so the models
    # of a burst long past cost no tick anything.
    assert traffic.activity(100.0 + REPORT_TTL_S + 0.1) == {}
    assert traffic.demand_at == {}


def test_a_model_one_activator_reports_is_taken_as_it_came_and_one_several_report_is_summed() -> None:
    traffic = Traffic(clock=lambda: 100.0, wake=lambda: None)
    alone = ModelActivity(queued=1, in_flight=2, last_request_at=99.0)
    traffic.report("a", {"m": alone, "n": ModelActivity(in_flight=1, last_request_at=98.0)})
    traffic.report("b", {"n": ModelActivity(queued=2, last_request_at=99.5)})
    out = traffic.activity(100.0)
    # The very object reported: every tick between two reports finds it unchanged by
    # identity (judging compares each model's activity with the last tick's).
    assert out["m"] is alone and traffic.activity(100.5)["m"] is alone
    assert out["n"] == ModelActivity(queued=2, in_flight=1, last_request_at=99.5)  # 0 + 2, 1 + 0, the later
