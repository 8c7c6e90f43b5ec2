"""A worker's local copies of model weights: the host-memory and disk tiers.

A launch with Thaw's loader reads through a host-memory tier (a tmpfs directory of
this worker's own, ``host_cache_gib``) and a disk tier (the shape's ``cache``),
fastest first, and fills the tiers that missed as the weights stream
(``weight_streaming.s3_loader``). :class:`WeightCaches` opens the tiers, tells the
loader where they are, looks at what they hold (the status lists it as ``cached``,
which the controller's placement reads) and keeps the bytes per second recent
loads read from each source. The host tier is emptied when the agent stops: it is
memory.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from thaw.config import EngineArgs
from thaw.log import get_logger
from thaw.wire import CachedWeights, LoadView
from weight_streaming.cache import DiskCache
from worker.metrics import WorkerMetrics
from worker.settings import AgentSettings

log = get_logger()

# In a host cache directory: the pid of the agent it belongs to.
HOST_CACHE_OWNER = ".owner"


class WeightCaches:
    def __init__(self, settings: AgentSettings, metrics: WorkerMetrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self._caches: dict[str, DiskCache] = {}
        # What the tiers held at the last look.
        self.cached: list[CachedWeights] = []
        # Bytes per second that recent loads read from each source (moving averages).
        self.load_rates: dict[str, float] = {}

    def open(self) -> None:
        """Open the configured tiers (blocking: run it in a thread). A tier that cannot
        be opened is logged and left out: serving goes on from the store."""
        s = self._settings
        for tier, root, budget in (("host", s.host_cache_dir, s.host_cache_max_bytes),
                                   ("disk", s.disk_cache_dir, s.disk_cache_max_bytes)):
            if root is None or budget <= 0:
                continue
            try:
                if tier == "host":
                    _sweep_orphaned_host_caches(root.parent)
                self._caches[tier] = DiskCache(root, budget)
                if tier == "host":
                    (root / HOST_CACHE_OWNER).write_text(str(os.getpid()))
            except OSError as exc:
                log.error("cache_unavailable", tier=tier, dir=str(root), error=str(exc))

    async def close(self) -> None:
        host = self._caches.get("host")
        if host is not None:
            # Memory: nothing else would ever give it back.
            await asyncio.to_thread(shutil.rmtree, host.root, True)

    def _read(self) -> list[CachedWeights]:
        out: list[CachedWeights] = []
        for tier, cache in self._caches.items():
            try:
                models = cache.models()
            except OSError as exc:
                log.warning("cache_scan_failed", tier=tier, dir=str(cache.root), error=str(exc))
                continue
            out.extend(CachedWeights(uri=m.uri, tier=tier, bytes=m.bytes,  # type: ignore[arg-type]
                                     total_bytes=m.total_bytes) for m in models)
        return sorted(out, key=lambda c: (c.uri, c.tier))

    async def scan(self) -> list[CachedWeights]:
        """Look at what the tiers hold now (the status lists it)."""
        if self._caches:
            self.cached = await asyncio.to_thread(self._read)
            for tier in self._caches:
                self._metrics.cache_bytes.labels(tier).set(sum(c.bytes for c in self.cached if c.tier == tier))
        return self.cached

    async def scan_every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.scan()

    def loader_args(self, engine: EngineArgs) -> EngineArgs:
        """``engine`` plus this worker's tiers for Thaw's loader, which checks every file
        against the manifest's sha256 with or without caches (a corrupt object in the
        store is never served)."""
        if engine.load_format != "thaw":
            return engine
        extra = dict(engine.extra.get("model_loader_extra_config") or {})
        gib = float(1 << 30)
        for tier, dir_key, budget_key in (("host", "host_cache_dir", "host_cache_max_gib"),
                                          ("disk", "cache_dir", "cache_max_gib")):
            cache = self._caches.get(tier)
            if cache is not None:
                extra[dir_key] = str(cache.root)
                extra[budget_key] = cache.max_bytes / gib
        extra.setdefault("verify_sha256", self._settings.cache_verify_sha256)
        extra.setdefault("verify_tensors", self._settings.cache_verify_tensors)
        return engine.model_copy(update={"extra": {**engine.extra, "model_loader_extra_config": extra}})

    def note_load(self, lv: LoadView) -> None:
        """Keep the rate of a load that read from one source (a moving average)."""
        if lv.seconds and lv.bytes and len(lv.sources) == 1:
            [src] = lv.sources
            rate = lv.bytes / lv.seconds
            prev = self.load_rates.get(src)
            self.load_rates[src] = round(rate if prev is None else 0.5 * prev + 0.5 * rate, 1)


def _sweep_orphaned_host_caches(parent: Path) -> None:
    """Remove the host caches of agents that died without giving theirs back (SIGKILL):
    on a tmpfs, nothing else ever would."""
    try:
        dirs = [d for d in parent.iterdir() if d.is_dir()]
    except FileNotFoundError:
        return
    for d in dirs:
        try:
            pid = int((d / HOST_CACHE_OWNER).read_text().strip())
        except (OSError, ValueError):
            continue  # not an agent's (or still being set up)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            log.info("host_cache_orphan_removed", dir=str(d), pid=pid)
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass
