"""The controller's clock: the wall clock, or (``controller.stepped_clock``) the wall
clock moved forward by steps an operator asks for (``POST /v1/pool/clock``), so a test
or a rehearsal of a schedule reaches a window's opening without waiting for it.

Every time the controller reads is on this one clock: its decisions (the scheduled
pre-warm's cron among them), the ages of heartbeats and the stamps of its events. A
step is time that passed at once, and it never goes back. A worker heard just before a
step reads as silent for the step as well, so a step that would leave a live worker
silent past ``cluster.worker_timeout_s`` is refused. Each controller steps its own
clock; the leader's lease is on the database's clock and is not moved by it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from thaw.config import ThawConfig
from thaw.wire import ClockStep, ClockView
from warm_pool.api.errors import Conflict, Unprocessable
from warm_pool.events import EventLog


class SteppedClock:
    """The wall clock plus every step taken so far."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self.stepped_s = 0.0

    def __call__(self) -> float:
        return self._wall() + self.stepped_s

    def advance(self, s: float) -> None:
        if s <= 0:
            raise ValueError(f"a clock steps forward only, not by {s} s")
        self.stepped_s += s


def largest_step_s(cfg: ThawConfig) -> float:
    """The longest step no live worker reads as silence from: one heard up to a
    heartbeat interval before it (and a heartbeat's lateness: another interval) must
    still be inside the worker timeout after it."""
    return max(0.0, cfg.cluster.worker_timeout_s - 2 * cfg.cluster.heartbeat_interval_s)


class ClockAdmin:
    """``/v1/pool/clock``: what the controller's clock says, and its steps."""

    def __init__(self, clock: Callable[[], float], events: EventLog, config: Callable[[], ThawConfig],
                 wake: Callable[[], None]) -> None:
        self.clock = clock
        self._events = events
        self._config = config
        self._wake = wake

    def view(self) -> ClockView:
        stepped = self.clock if isinstance(self.clock, SteppedClock) else None
        return ClockView(now=self.clock(), steppable=stepped is not None,
                         stepped_s=stepped.stepped_s if stepped else 0.0,
                         largest_step_s=largest_step_s(self._config()) if stepped else 0.0)

    def advance(self, body: ClockStep, who: str) -> ClockView:
        """Step the clock forward (Conflict: it is the wall clock; Unprocessable: a step
        the workers' heartbeats would read as silence), log it and decide at once."""
        if not isinstance(self.clock, SteppedClock):
            raise Conflict("this controller keeps the wall clock (controller.stepped_clock is false): "
                           "its clock cannot be stepped")
        cfg = self._config()
        most = largest_step_s(cfg)
        if body.advance_s > most:
            raise Unprocessable(
                f"advance_s: a step of {body.advance_s:g} s would read as silence from every worker "
                f"(cluster.worker_timeout_s {cfg.cluster.worker_timeout_s:g} s, heartbeats every "
                f"{cfg.cluster.heartbeat_interval_s:g} s): step at most {most:g} s at a time")
        before = self.clock()
        self.clock.advance(body.advance_s)
        self._events.record("clock", "stepped", outcome="done",
                            inputs={"from": before, "advance_s": body.advance_s,
                                    "stepped_s": self.clock.stepped_s, "by": who})
        self._wake()
        return self.view()
