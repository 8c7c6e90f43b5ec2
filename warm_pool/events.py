"""The controller's events: the decisions it carried out, what came of them, and what
operators changed; the last EVENTS_KEPT are served by ``/v1/events``, each is logged as
it happens, and each is saved to the state database (the manager flushes them every
tick), named by the controller and the leader's term it was taken in."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from thaw.log import get_logger
from thaw.wire import PoolEvent

log = get_logger()

EVENTS_KEPT = 5000


# Events not saved yet beyond this (the database away for long) are dropped, oldest first.
UNSAVED_KEPT = 20000


@dataclass(frozen=True)
class SavedEvent:
    """An event as the state database keeps it."""

    controller: str
    term: int
    seq: int
    event: PoolEvent
    decision: bool


class EventLog:
    def __init__(self, clock: Callable[[], float], *, controller: str = "", term: int = 0) -> None:
        self.clock = clock
        self.controller = controller
        self.term = term  # the leader's term (0: a controller that leads alone)
        self.events: deque[PoolEvent] = deque(maxlen=EVENTS_KEPT)
        self._seq = 0
        self._unsaved: deque[SavedEvent] = deque(maxlen=UNSAVED_KEPT)

    def take_unsaved(self) -> list[SavedEvent]:
        out = list(self._unsaved)
        self._unsaved.clear()
        return out

    def put_back(self, batch: list[SavedEvent]) -> None:
        """A batch that could not be saved: it goes first next time."""
        self._unsaved.extendleft(reversed(batch))

    def record(self, kind: str, reason: str, *, decision: bool = False, outcome: str = "started",
               worker_id: str | None = None, model: str | None = None, shape: str | None = None,
               inputs: dict[str, Any] | None = None) -> None:
        """Keep and log one event; ``decision``: the policy's (logged as ``pool_decision``)."""
        ev = PoolEvent(at=self.clock(), kind=kind, reason=reason, worker_id=worker_id, model=model, shape=shape,
                       outcome=outcome, inputs=inputs or {})
        self.events.append(ev)
        self._seq += 1
        self._unsaved.append(SavedEvent(self.controller, self.term, self._seq, ev, decision))
        log.info("pool_decision" if decision else "pool_event", **ev.model_dump(exclude_none=True))
