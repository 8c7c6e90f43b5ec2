"""What changed in each of the last versions of a table the controller versions (the
route table, the catalog), to answer a watcher with only what changed since the version
it holds (``warm_pool.routes.RouteFeed``, ``warm_pool.registry.catalog.CatalogFeed``)."""

from __future__ import annotations

from collections import deque


class ChangeHistory:
    """The names each of the last ``size`` versions changed, oldest first, and ``start``:
    the oldest version a watcher may hold and still be answered with the changes since
    (the version the oldest change kept was made from)."""

    def __init__(self, start: int, size: int) -> None:
        self.start = start
        self._changes: deque[tuple[int, frozenset[str]]] = deque(maxlen=size)

    def record(self, version: int, names: frozenset[str]) -> None:
        """Version ``version`` changed ``names`` (one version past the last recorded)."""
        if len(self._changes) == self._changes.maxlen:
            self.start = self._changes[0][0]  # the oldest change is forgotten: its version is the start
        self._changes.append((version, names))

    def covers(self, since: int, version: int) -> bool:
        """Whether a watcher holding ``since`` can be brought to ``version`` by changes."""
        return self.start <= since <= version

    def since(self, since: int) -> set[str]:
        """The names changed by every version after ``since``."""
        names: set[str] = set()
        for version, changed in reversed(self._changes):
            if version <= since:
                break
            names |= changed
        return names
