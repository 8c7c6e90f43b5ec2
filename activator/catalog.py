"""The models and tenants in force, as the controller's catalog says (``GET /v1/catalog``,
fetched when the route table's ``catalog_version`` moves): models deployed, changed or
removed at run time reach every activator within a second, without a restart.

The activator's config file gives everything else (server, limits, ledger); its
``models`` and ``tenants`` are what it serves only until the first catalog arrives. The
last catalog received is kept in ``<data_dir>/activators/<id>/catalog.json`` (0600), so
a restart while the controller is away serves what was in force.

A change arrives as a delta (``activator.routing.feed``, docs/REQUEST_PATH.md, "The
catalog feed") merged into the catalog held: only the models it names are parsed, and
the router takes in only those (``Router.change_models``).
"""

from __future__ import annotations

from pathlib import Path

from activator.keys import TableCache
from thaw.config import Model, ThawConfig
from thaw.private_files import write_private
from thaw.wire import Catalog

CATALOG_FILE = "catalog.json"


class CatalogCache(TableCache[Catalog]):
    """The last catalog, on disk. Each model's JSON is kept from one save to the next,
    by the model object (a merged delta keeps every model it does not name), so a save
    at 10,000 models writes ~11 MB without serializing them all again."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, CATALOG_FILE, Catalog)
        self._json: dict[str, tuple[Model, bytes]] = {}

    def save(self, table: Catalog) -> None:
        """The whole catalog ``table``, its JSON as ``Catalog.body`` makes it."""
        assert table.base_version is None, "a delta is merged before it is kept"
        held, parts = self._json, {}
        for m in table.models:
            kept = held.get(m.name)
            parts[m.name] = kept if kept is not None and kept[0] is m else (m, m.model_dump_json().encode())
        self._json = parts
        models = b",".join(j for _, j in parts.values())
        tenants = b",".join(t.model_dump_json().encode() for t in table.tenants)
        write_private(self.path, b'{"version":%d,"models":[%b],"tenants":[%b]}' % (table.version, models, tenants))


def apply_catalog(cfg: ThawConfig, catalog: Catalog) -> ThawConfig:
    """``cfg`` serving the catalog's models and tenants (as the controller validated them)."""
    return cfg.model_copy(update={"models": list(catalog.models), "tenants": list(catalog.tenants)})
