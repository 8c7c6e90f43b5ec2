"""A worker refuses control calls of a leader term older than one it has heard of."""

from __future__ import annotations

from worker.fence import Fence


def test_calls_without_a_term_are_always_admitted() -> None:
    f = Fence()
    assert f.admits(None) and f.term is None
    f.observe(3)
    assert f.admits(None)


def test_an_older_term_is_refused_once_a_newer_one_is_heard_of() -> None:
    f = Fence()
    assert f.admits(1) and f.term == 1
    f.observe(2)  # a heartbeat reply from the new leader
    assert not f.admits(1)
    assert f.admits(2) and f.admits(3) and f.term == 3
    assert not f.admits(2)
    f.observe(1)  # never goes back
    assert f.term == 3


def test_a_call_arriving_after_its_senders_lease_ended_is_refused() -> None:
    # The sender's lease ends at 100.0 by its own count: a call that arrives later (the
    # sender was paused, the call held on the way) is refused although no newer term has
    # been heard of; one in time is admitted.
    f = Fence()
    assert f.admits(4, until=100.0, now=99.9) and f.term == 4
    assert not f.admits(4, until=100.0, now=100.1)
    assert not f.admits(5, until=100.0, now=100.1) and f.term == 4  # refused: nothing learnt from it
    assert f.admits(5, until=200.0, now=100.1) and f.term == 5
