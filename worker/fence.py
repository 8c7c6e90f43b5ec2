"""Fencing a controller that no longer leads: the highest leader term a worker has heard
of (``warm_pool.leader``). The leader's control calls carry its term (``X-Thaw-Term``)
and its heartbeat replies say it; a call from an older term is refused (409), so a
controller that lost its lease but has not noticed yet changes nothing here. A call also
says when its sender's lease ends by the sender's own count (``X-Thaw-Lease-Until``,
epoch seconds): one that arrives later (its sender paused, or the call held on the way)
is refused too, before this worker has heard of the next term. Calls without a term (a
controller that leads alone) are always admitted."""

from __future__ import annotations


class Fence:
    def __init__(self) -> None:
        self.term: int | None = None

    def observe(self, term: int | None) -> None:
        if term is not None and (self.term is None or term > self.term):
            self.term = term

    def admits(self, term: int | None, until: float | None = None, now: float = 0.0) -> bool:
        """A call of ``term`` whose sender's lease ends at ``until``, arriving at ``now``:
        admitted unless a newer term has been heard of or the lease has ended (then, if
        admitted, its term becomes the newest heard of)."""
        if term is not None and self.term is not None and term < self.term:
            return False
        if until is not None and now > until:
            return False
        self.observe(term)
        return True
