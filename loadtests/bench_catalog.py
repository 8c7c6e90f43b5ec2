"""The catalog at fleet size: what one deploy costs the controller to answer and an
activator to take in, whole catalog against delta.

    python -m loadtests.bench_catalog [--sizes 100 1000 10000] [--repeat 5]

No network and no controller: a config of that many models (``bench_registry_change``'s:
three shapes, a fifth of them adapters) held by a ``CatalogFeed``, and one model deployed
(``with_change``, as the registry makes it). One JSON line per size, medians of
``--repeat``:

- ``whole_bytes``, ``whole_ms``: the whole catalog's JSON and the time to make it (what
  every activator's fetch cost the controller before; now once per version);
- ``delta_bytes``, ``delta_ms``: the answer to a watcher one version back, and the time to
  note the change (``CatalogFeed.changed``) and make it;
- ``take_whole_ms``: an activator taking the change from a whole catalog, as before
  deltas: parse it, the authenticator's and the router's models (``Router.set_models``),
  and the file kept on disk written anew;
- ``take_delta_ms``: taking it from the delta: parse it, merge it into the catalog held,
  the authenticator's models, the router's for the changed model only
  (``Router.change_models``), and the file kept on disk (each unchanged model's JSON kept);
- ``parse_whole_ms``, ``parse_delta_ms``, ``save_whole_ms``, ``save_kept_ms``: the parts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from activator.auth import Authenticator
from activator.catalog import CatalogCache
from activator.keys import TableCache
from activator.routing.router import Router
from loadtests.bench_registry_change import base_config, entries, timed
from thaw.config import ThawConfig
from thaw.wire import Catalog
from warm_pool.registry.catalog import CatalogFeed
from warm_pool.registry.in_force import with_change, with_models


def timed_ms(fn: Callable[[], object], repeat: int) -> float:
    """The median milliseconds of ``repeat`` calls."""
    return timed(fn, repeat) * 1000


def measure(base: ThawConfig, n: int, repeat: int, directory: Path) -> dict[str, Any]:
    es = entries(n)
    cfg = with_models(base, es)
    spec_of = {e["name"]: {k: v for k, v in e.items() if k != "name"} for e in es}.__getitem__
    deployed = with_change(cfg, base, spec_of, "fresh", {"uri": "s3://thaw/models/fresh", "shape": "gpu-1"})
    held = Catalog(version=1, models=cfg.models, tenants=cfg.tenants)
    whole_body = Catalog(version=2, models=deployed.models, tenants=deployed.tenants).body()

    def delta() -> float:
        """The milliseconds to note the deploy and answer a watcher of the version before."""
        feed = CatalogFeed(1, cfg)
        t0 = time.perf_counter()
        feed.changed(2, deployed)
        feed.body(1, delta=True)
        return (time.perf_counter() - t0) * 1000

    feed = CatalogFeed(1, cfg)
    feed.changed(2, deployed)
    delta_body = feed.body(1, delta=True)
    # The activator: what it held (parsed from the whole catalog, as it took it).
    held = Catalog.model_validate_json(held.body())
    auth, router = Authenticator(held.tenants, held.models), Router(held.models, "http://127.0.0.1:9", "bench")
    before, after = TableCache(directory, "before.json", Catalog), CatalogCache(directory)
    after.save(held)

    def take_whole() -> None:
        c = Catalog.model_validate_json(whole_body)
        auth.update_catalog(c.tenants, c.models)
        router.set_models(c.models)
        before.save(c)

    def take_delta() -> None:
        d = Catalog.model_validate_json(delta_body)
        c = held.merged(d)
        assert c is not None
        auth.update_catalog(c.tenants, c.models)
        router.change_models(d.models, d.removed)
        after.save(c)

    merged = held.merged(Catalog.model_validate_json(delta_body))
    assert merged is not None
    row = {
        "models": n, "whole_bytes": len(whole_body), "delta_bytes": len(delta_body),
        "whole_ms": timed_ms(lambda: Catalog(version=2, models=deployed.models, tenants=deployed.tenants).body(),
                          repeat),
        "delta_ms": statistics.median(delta() for _ in range(repeat)),
        "take_whole_ms": timed_ms(take_whole, repeat),
        "take_delta_ms": timed_ms(take_delta, repeat),
        "parse_whole_ms": timed_ms(lambda: Catalog.model_validate_json(whole_body), repeat),
        "parse_delta_ms": timed_ms(lambda: Catalog.model_validate_json(delta_body), repeat),
        "save_whole_ms": timed_ms(lambda: before.save(merged), repeat),
        "save_kept_ms": timed_ms(lambda: after.save(merged), repeat),
    }
    asyncio.run(router.close())
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    base = base_config()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-catalog-") as d:
        for n in args.sizes:
            rows.append(measure(base, n, args.repeat, Path(d)))
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()}))
    return rows


if __name__ == "__main__":
    main()
