"""The controller's events: the decisions it carried out, what came of them, and what
operators changed; the last EVENTS_KEPT are served by ``/v1/events``, and each is
logged as it happens."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from thaw.log import get_logger
from thaw.wire import PoolEvent

log = get_logger()

EVENTS_KEPT = 5000


class EventLog:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.events: deque[PoolEvent] = deque(maxlen=EVENTS_KEPT)

    def record(self, kind: str, reason: str, *, decision: bool = False, outcome: str = "started",
               worker_id: str | None = None, model: str | None = None, shape: str | None = None,
               inputs: dict[str, Any] | None = None) -> None:
        """Keep and log one event; ``decision``: the policy's (logged as ``pool_decision``)."""
        ev = PoolEvent(at=self.clock(), kind=kind, reason=reason, worker_id=worker_id, model=model, shape=shape,
                       outcome=outcome, inputs=inputs or {})
        self.events.append(ev)
        log.info("pool_decision" if decision else "pool_event", **ev.model_dump(exclude_none=True))
