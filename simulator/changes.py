"""What changed since the controller last looked: the fleet and the traffic note it as
they go, and the controller reads it to choose whom to judge on its next tick."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.traffic import SimModel


@dataclass(eq=False)
class Changes:
    # The workers' views changed (the next snapshot is rebuilt), and the pools' inputs did.
    views_dirty: bool = True
    pools_dirty: bool = True
    # Models whose decision may change (a worker of theirs moved, a demand signal).
    dirty: set[SimModel] = field(default_factory=set)
    # Models whose traffic changed since the last tick.
    touched: set[SimModel] = field(default_factory=set)
    # Shapes a worker of which changed.
    shapes_changed: set[str] = field(default_factory=set)
    # A request found no ready replica: the activators wake the controller now.
    kick_pending: bool = False

    def rejudge(self, models: Iterable[SimModel]) -> None:
        """The models' inputs changed: judged on the next tick, their band found again."""
        for m in models:
            m.band_for = None
            self.dirty.add(m)

    def worker_changed(self, shape: str) -> None:
        """A worker of ``shape`` changed state: a new snapshot, the pools judged again."""
        self.views_dirty = self.pools_dirty = True
        self.shapes_changed.add(shape)
