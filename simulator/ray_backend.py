"""Run one function over many small items as tasks on a Ray cluster, a large input shared
by all: `thaw simulate --sweep --backend ray` and `thaw pool recommend --backend ray`
(:func:`simulator.sweep.run_variants`).

The shared input (a sweep's ``Inputs``: the trace and the config) goes to the cluster's
object store once, with ``ray.put``; each task gets its reference and one item (a
variant's ``Settings``), so a task carries a few hundred bytes, not the trace. Results
come back in the items' order, whichever task finished first.

Ray is an optional extra (``pip install 'thaw-serve[ray]'``), imported here and only when
a run asks for it: the simulator works without it. A task imports the function it runs
by name (``simulator.sweep.run_one``), so every node of a cluster needs the same
thaw-serve installed.

Which cluster: ``address``, else ``RAY_ADDRESS``, else a local Ray instance started for
the run and stopped after it (``"local"``: a bare ``ray.init()`` would join a
``ray start`` instance on this machine instead). A driver already connected, by a caller
that called ``ray.init`` itself, is used as it is and left connected.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any, TypeVar

EXTRA = "thaw-serve[ray]"

_S = TypeVar("_S")
_I = TypeVar("_I")
_R = TypeVar("_R")


class RayMissing(RuntimeError):
    """Ray is not installed here: nothing ran."""


class RayUnreachable(RuntimeError):
    """No Ray cluster at the address asked for: nothing ran."""


def import_ray() -> ModuleType:
    """The ``ray`` module, or :class:`RayMissing` saying which extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise RayMissing(f"--backend ray needs Ray, which is not installed: pip install '{EXTRA}'") from exc
    return ray


@contextmanager
def _connected(ray: ModuleType, address: str | None) -> Iterator[None]:
    """Joined to a Ray cluster for the block. A connection made here is closed after it,
    even on error, which stops the local instance it started."""
    if ray.is_initialized():
        yield
        return
    target = address or os.environ.get("RAY_ADDRESS") or "local"
    try:
        try:
            # Ray's INFO and WARNING lines (instance started, token authentication) and
            # the workers' output would bury the sweep's table; errors still show.
            ray.init(address=target, include_dashboard=False, log_to_driver=False,
                     configure_logging=True, logging_level=logging.ERROR)
        except ConnectionError as exc:
            raise RayUnreachable(f"could not join the Ray cluster at {target!r}: {exc}") from exc
        yield
    finally:
        ray.shutdown()


def map_shared(fn: Callable[[_S, _I], _R], shared: _S, items: Sequence[_I], *,
               max_in_flight: int | None = None, address: str | None = None) -> list[_R]:
    """``[fn(shared, item) for item in items]``, each call a Ray task; ``shared`` is put in
    the object store once. At most ``max_in_flight`` tasks are submitted at a time (None:
    all at once, and the cluster's CPUs decide how many run). Raises :class:`RayMissing`
    or :class:`RayUnreachable` before anything runs; a task's error is raised here."""
    ray = import_ray()
    with _connected(ray, address):
        shared_ref = ray.put(shared)
        task = ray.remote(fn)
        refs: list[Any] = []
        pending: list[Any] = []
        for item in items:
            if max_in_flight is not None and len(pending) >= max_in_flight:
                _, pending = ray.wait(pending, num_returns=1)
            # A top-level reference argument reaches fn as the object itself.
            ref = task.remote(shared_ref, item)
            refs.append(ref)
            pending.append(ref)
        return list(ray.get(refs))
