"""Fencing a controller that no longer leads: the highest leader term a worker has heard
of (``warm_pool.leader``). The leader's control calls carry its term (``X-Thaw-Term``)
and its heartbeat replies say it; a call from an older term is refused (409), so a
controller that lost its lease but has not noticed yet changes nothing here. Calls
without a term (a controller that leads alone) are always admitted."""

from __future__ import annotations


class Fence:
    def __init__(self) -> None:
        self.term: int | None = None

    def observe(self, term: int | None) -> None:
        if term is not None and (self.term is None or term > self.term):
            self.term = term

    def admits(self, term: int | None) -> bool:
        """A call of ``term``: admitted unless a newer term has been heard of (then it
        becomes the newest heard of)."""
        if term is not None and self.term is not None and term < self.term:
            return False
        self.observe(term)
        return True
