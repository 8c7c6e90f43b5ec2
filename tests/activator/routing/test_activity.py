"""One model's traffic counts, as reported to the controller."""

from __future__ import annotations

from activator.routing.activity import ModelActivity


def test_reports_carry_arrival_counters_and_take_ttft_samples() -> None:
    a = ModelActivity()
    for _ in range(5):
        a.arrived(now=3.0)
    for t in (0.1, 0.2):
        a.note_ttft(t)
    first = a.report(queued=2)
    assert (first.arrivals, first.ttft_s, first.queued, first.last_request_at) == (5, [0.1, 0.2], 2, 3.0)
    # The counter stays (the controller takes differences); the samples were taken.
    second = a.report(queued=0)
    assert (second.arrivals, second.ttft_s) == (5, [])
    for _ in range(1000):
        a.note_ttft(0.5)
    assert len(a.report(queued=0).ttft_s) == 256  # a bounded sample


def test_a_request_in_flight_is_counted_until_it_ends() -> None:
    a = ModelActivity()
    a.arrived(now=1.0)
    a.started()
    assert a.report(queued=0).in_flight == 1
    a.ended(now=4.0)
    r = a.report(queued=0)
    assert (r.in_flight, r.last_request_at) == (0, 4.0)
