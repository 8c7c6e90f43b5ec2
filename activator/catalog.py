"""The models and tenants in force, as the controller's catalog says (``GET /v1/catalog``,
fetched when the route table's ``catalog_version`` moves): models deployed, changed or
removed at run time reach every activator within a second, without a restart.

The activator's config file gives everything else (server, limits, ledger); its
``models`` and ``tenants`` are what it serves only until the first catalog arrives. The
last catalog received is kept in ``<data_dir>/activators/<id>/catalog.json`` (0600), so
a restart while the controller is away serves what was in force.
"""

from __future__ import annotations

from pathlib import Path

from activator.keys import TableCache
from thaw.config import ThawConfig
from thaw.wire import Catalog

CATALOG_FILE = "catalog.json"


class CatalogCache(TableCache[Catalog]):
    def __init__(self, directory: Path) -> None:
        super().__init__(directory, CATALOG_FILE, Catalog)


def apply_catalog(cfg: ThawConfig, catalog: Catalog) -> ThawConfig:
    """``cfg`` serving the catalog's models and tenants (as the controller validated them)."""
    return cfg.model_copy(update={"models": list(catalog.models), "tenants": list(catalog.tenants)})
