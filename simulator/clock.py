"""The simulation's time: now, and the events due after it, in order."""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulator.fleet import SimWorker

INF = math.inf

# Event kinds, in the order events at the same instant are handled.
WORKER, ADAPTER, DONE, TIMEOUT = 0, 1, 2, 3


class Clock:
    """Simulated time and the events scheduled ahead of it: (time, kind, sequence,
    object, argument), so that events at one instant run by kind, then as scheduled."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, Any, int]] = []
        self.seq = 0
        self.now = 0.0

    def push(self, t: float, kind: int, obj: Any, arg: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, obj, arg))

    def after(self, w: SimWorker, delay: float) -> None:
        """The worker's current step (boot, load, release) ends in ``delay`` seconds
        (void if the worker changes meanwhile: its epoch moves on)."""
        self.push(self.now + delay, WORKER, w, w.epoch)
