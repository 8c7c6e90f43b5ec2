"""What the schema-fuzzing tests share: one schemathesis config, and a way to keep an
async server (an app with its fakes) running on its own event loop while the sync
schemathesis tests send it requests.

CI runs a few examples per operation, derandomized (the same cases every run, no
example database written); ``THAW_FUZZ_EXAMPLES=N`` runs N per operation with fresh
randomness, e.g. ``THAW_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest tests/fuzz``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any, TypeVar

import schemathesis

T = TypeVar("T")

CI_EXAMPLES = 10
EXAMPLES = int(os.environ.get("THAW_FUZZ_EXAMPLES", CI_EXAMPLES))
# A longer run explores: a new seed each time (a failure prints the case to replay).
DERANDOMIZE = "THAW_FUZZ_EXAMPLES" not in os.environ


def fuzz_config(scheme: str, token: str, *, checks: dict[str, Any] | None = None,
                operations: list[dict[str, Any]] | None = None) -> schemathesis.Config:
    """Positive and negative cases, ``token`` as the bearer of security scheme
    ``scheme``, every response check (``checks`` turns some off or tunes them;
    ``operations``: schemathesis' per-operation settings)."""
    generation = {"mode": "all", "max-examples": EXAMPLES, "deterministic": DERANDOMIZE, "database": "none"}
    return schemathesis.Config.from_dict({
        "generation": generation,
        "auth": {"openapi": {scheme: {"bearer": token}}},
        "checks": checks or {},
        "operations": operations or [],
        # Stateful runs need links between operations; none of these APIs declares them.
        "phases": {"stateful": {"enabled": False}},
    })


@contextmanager
def running(factory: Callable[[], AbstractAsyncContextManager[T]], timeout_s: float = 30.0) -> Iterator[T]:
    """Enter ``factory()`` on an event loop of its own thread and yield what it yields;
    on exit, leave it there (on that loop) and wait for the thread."""
    ready = threading.Event()
    out: dict[str, Any] = {}

    async def main() -> None:
        stop = asyncio.Event()
        out["stop"], out["loop"] = stop, asyncio.get_running_loop()
        try:
            async with factory() as value:
                out["value"] = value
                ready.set()
                await stop.wait()
        except BaseException as exc:
            out["error"] = exc
            raise
        finally:
            ready.set()

    thread = threading.Thread(target=lambda: asyncio.run(main()), name="fuzz-server", daemon=True)
    thread.start()
    if not ready.wait(timeout_s) or "value" not in out:
        raise RuntimeError(f"the server did not start: {out.get('error')!r}")
    try:
        yield out["value"]
    finally:
        out["loop"].call_soon_threadsafe(out["stop"].set)
        thread.join(timeout_s)
        assert not thread.is_alive(), "the server did not stop"
        if "error" in out:
            raise out["error"]


