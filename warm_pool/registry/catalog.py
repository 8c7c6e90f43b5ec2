"""The catalog activators fetch (``GET /v1/catalog``): the models and tenants in force at
the registry's version, whole, or as a delta from a version the feed still has the
changes of (docs/REQUEST_PATH.md, "The catalog feed").

The registry tells the feed each version it makes and the config in force at it
(``changed``). The feed keeps the names of the models each of the last
``HISTORY_VERSIONS`` versions changed, found by identity: a change builds anew only the
models it touches (``warm_pool.registry.in_force.with_change``: the model and its
adapters), every other model of the config in force is the very object it was. A
registry that reads the store's rows anew (a start, a controller that starts leading,
``thaw apply``) starts the history over (``restart``): a watcher gets the whole catalog
until the history covers its version.

With 10,000 models a whole catalog is about 11 MB of JSON and takes ~100 ms to make: it
is made once per version, however many activators ask.
"""

from __future__ import annotations

from thaw.config import Model, ThawConfig
from thaw.wire import Catalog
from warm_pool.history import ChangeHistory

# How many versions back a fetch is answered with a delta (older: the whole catalog).
HISTORY_VERSIONS = 256


class CatalogFeed:
    """The catalog at the registry's ``version``, and the answer to a watcher that holds
    another version of it."""

    def __init__(self, version: int, cfg: ThawConfig, *, history: int = HISTORY_VERSIONS) -> None:
        self._size = history
        self.restart(version, cfg)

    def restart(self, version: int, cfg: ThawConfig) -> None:
        """The registry read everything anew: ``cfg`` is in force at ``version``, and no
        change before it is known."""
        self.version = version
        self._whole = Catalog(version=version, models=cfg.models, tenants=cfg.tenants)
        self._body: bytes | None = None
        self._by_name: dict[str, Model] = {m.name: m for m in cfg.models}
        self._history = ChangeHistory(version, self._size)

    def changed(self, version: int, cfg: ThawConfig) -> None:
        """Version ``version`` of the registry serves ``cfg``, one change past the last.
        The models changed are those whose object is not the last version's (a model
        added or removed too); the tenants go whole in every answer."""
        by_name = {m.name: m for m in cfg.models}
        names = frozenset(n for n in by_name.keys() | self._by_name.keys() if by_name.get(n) is not self._by_name.get(n))
        if version <= self.version:  # not past the last: nothing known of what it changed
            self.restart(version, cfg)
            return
        self._history.record(version, names)
        self.version, self._by_name = version, by_name
        self._whole = Catalog(version=version, models=cfg.models, tenants=cfg.tenants)
        self._body = None

    def catalog(self) -> Catalog:
        """The whole catalog in force."""
        return self._whole

    def answer(self, since: int, *, delta: bool = False) -> Catalog:
        """The catalog for a watcher that holds version ``since``: with ``delta``, and that
        version one the history covers, only the models changed since (and the tenants);
        else the whole catalog."""
        if not delta or not self._history.covers(since, self.version):
            return self._whole
        names = self._history.since(since)
        by_name = self._by_name
        return Catalog(version=self.version, models=[by_name[n] for n in sorted(names) if n in by_name],
                       tenants=self._whole.tenants, base_version=since,
                       removed=sorted(n for n in names if n not in by_name))

    def body(self, since: int, *, delta: bool = False) -> bytes:
        """``answer``'s JSON; the whole catalog's is made once per version."""
        answer = self.answer(since, delta=delta)
        if answer is not self._whole:
            return answer.body()
        if self._body is None:
            self._body = answer.body()
        return self._body
