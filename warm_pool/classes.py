"""Each configured model's engine class, as the controller's placement needs it.

A model's engine class (``thaw.engine_class``) is computed from its ``config.json``
in the store and its engine settings in the config. :class:`ModelClasses` reads each
model's ``config.json`` (a few KiB, in a thread: boto3 blocks) when it has not for
``refresh_s`` (at most ``READS_PER_REFRESH`` a turn, the longest due first: with
thousands of models the reads spread over turns), and keeps the classes it could
compute, recomputing only those of models whose files or entry changed. A model whose config cannot
be read, or is not a model vLLM can build, has no class: it is placed as before
(never a swap), and the reason is logged once per change.

The worker never takes the controller's word for a class: it computes the class of
the model it is assigned from the same file and swaps only when the two agree.

Where a pool packs engines (``pools[].pack``) it also reads each model's manifest for
the size of its weights (``sizes``): the memory an engine of it holds is computed from
that (``thaw.fit.engine_memory``), and a model of unknown size is never packed.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable
from typing import Any

from thaw.config import Model, ThawConfig
from thaw.engine_class import engine_class_of
from thaw.fit import engine_memory
from thaw.log import get_logger

log = get_logger()

# Reads the config.json at a model URI (None: there is none). Blocking.
ConfigReader = Callable[[str], dict[str, Any] | None]
# The bytes of the weights at a model URI, from its manifest (None: no manifest). Blocking.
SizeReader = Callable[[str], int | None]


# At most this many URIs are read per refresh (one turn of the controller's loop), this
# many at a time: with thousands of models the reads spread over turns instead of
# holding one turn for minutes.
READS_PER_REFRESH = 64
READ_CONCURRENCY = 8


class ModelClasses:
    def __init__(self, read_config: ConfigReader, *, clock: Callable[[], float], refresh_s: float = 60.0,
                 read_size: SizeReader | None = None) -> None:
        self._read = read_config
        self._read_size = read_size
        self._sizes: dict[str, int | None] = {}
        # Bytes of each model's weights, where a manifest says (only with read_size).
        self.sizes: dict[str, int] = {}
        self._clock = clock
        self._refresh_s = refresh_s
        self._configs: dict[str, dict[str, Any] | None] = {}
        self._read_at: dict[str, float] = {}
        self._problems: dict[str, str] = {}
        self.classes: dict[str, str] = {}
        # The URIs to read, soonest due first (an entry is current while its time is the
        # URI's in _due_at), and the models list they were taken from.
        self._queue: list[tuple[float, str]] = []
        self._due_at: dict[str, float] = {}
        self._models: list[Model] | None = None
        # Each model as its class and size were last computed (its entry, and its adapters:
        # a base with adapters starts its engine with LoRA flags).
        self._computed: dict[str, tuple[Model, tuple[str, ...]]] = {}

    def _due(self, uri: str, now: float) -> bool:
        return now - self._read_at.get(uri, -self._refresh_s) >= self._refresh_s

    def due(self, cfg: ThawConfig, now: float) -> bool:
        """Whether a refresh would read or recompute anything (a new models list, or a
        URI not read for ``refresh_s``)."""
        return cfg.models is not self._models or bool(self._queue and self._queue[0][0] <= now)

    def _track(self, cfg: ThawConfig) -> None:
        """Queue the URIs of a new models list's engines that were never read."""
        if cfg.models is self._models:
            return
        self._models = cfg.models
        # An adapter has no engine of its own (nor a config.json): its base's is what counts.
        for uri in sorted({m.uri for m in cfg.models if m.base is None} - self._due_at.keys()):
            self._due_at[uri] = -math.inf
            heapq.heappush(self._queue, (-math.inf, uri))

    async def refresh(self, cfg: ThawConfig) -> dict[str, str]:
        """Read the configs that are due (at most ``READS_PER_REFRESH``, the longest due
        first) and recompute the classes of the models they or the config changed."""
        now = self._clock()
        self._track(cfg)
        uris = {m.uri for m in cfg.models if m.base is None}
        batch: list[str] = []
        while self._queue and self._queue[0][0] <= now and len(batch) < READS_PER_REFRESH:
            at, uri = heapq.heappop(self._queue)
            if self._due_at.get(uri) != at:
                continue  # an old entry
            if uri not in uris:
                del self._due_at[uri]  # no model reads it any more
                continue
            batch.append(uri)
        gate = asyncio.Semaphore(READ_CONCURRENCY)
        read = await asyncio.gather(*(self._read_one(uri, now, gate) for uri in batch))
        changed = {uri for uri, moved in zip(batch, read, strict=True) if moved}
        self._recompute(cfg, changed)
        return self.classes

    async def _read_one(self, uri: str, now: float, gate: asyncio.Semaphore) -> bool:
        """Read one URI's config (and size); whether what is known of it changed."""
        async with gate:
            self._read_at[uri] = now
            self._due_at[uri] = now + self._refresh_s
            heapq.heappush(self._queue, (now + self._refresh_s, uri))
            before = (self._configs.get(uri), uri in self._configs, self._sizes.get(uri))
            try:
                self._configs[uri] = await asyncio.to_thread(self._read, uri)
            except Exception as exc:  # the store: keep what was read before, say why once
                self._note(uri, f"cannot read config.json: {type(exc).__name__}: {exc}")
            if self._read_size is not None:
                try:
                    self._sizes[uri] = await asyncio.to_thread(self._read_size, uri)
                except Exception as exc:
                    self._note(uri + "#size", f"cannot read the manifest: {type(exc).__name__}: {exc}")
            return before != (self._configs.get(uri), uri in self._configs, self._sizes.get(uri))

    def _recompute(self, cfg: ThawConfig, changed: set[str]) -> None:
        """The classes and sizes of the models whose URI's files changed, or whose entry
        is new or changed; the others keep theirs. New dicts only when something moved
        (so a caller can tell a change by identity)."""
        models = {m.name: m for m in cfg.models}
        stale = self._computed.keys() - models.keys()
        def basis(m: Model) -> tuple[Model, tuple[str, ...]]:
            return m, tuple(a.name for a in cfg.adapters_of(m.name))

        todo = [m for m in cfg.models if m.uri in changed or (c := self._computed.get(m.name)) is None
                or c[0] is not m or c[1] != basis(m)[1]]
        if not todo and not stale:
            return
        classes, sizes = dict(self.classes), dict(self.sizes)
        for name in stale:
            classes.pop(name, None)
            sizes.pop(name, None)
            del self._computed[name]
        for m in todo:
            self._computed[m.name] = basis(m)
            classes.pop(m.name, None)
            sizes.pop(m.name, None)
            if (n := self._sizes.get(m.uri)) is not None:
                sizes[m.name] = n
            if m.base is not None:
                continue
            config = self._configs.get(m.uri)
            if config is None:
                if m.uri in self._configs:
                    self._note(m.name, "no config.json in the store")
                continue
            try:
                classes[m.name] = engine_class_of(config, cfg.engine_args(m), max_model_len=m.max_context_tokens).id
            except ValueError as exc:
                self._note(m.name, str(exc))
                continue
            self._problems.pop(m.name, None)
        if classes != self.classes:
            self.classes = classes
        if sizes != self.sizes:
            self.sizes = sizes

    def _note(self, key: str, problem: str) -> None:
        if self._problems.get(key) != problem:
            self._problems[key] = problem
            log.warning("engine_class_unknown", model_or_uri=key, reason=problem)


_last_engine_bytes: tuple[ThawConfig, dict[str, int], dict[str, int]] | None = None
_NO_SIZES: dict[str, int] = {}


def engine_bytes(cfg: ThawConfig, classes: ModelClasses | None) -> dict[str, int]:
    """The memory an engine of each model of a packing pool holds, where its size is
    known (thaw.fit.engine_memory). Kept for the last config and sizes (both replaced,
    never changed, when they change): each turn and each assignment asks."""
    global _last_engine_bytes
    sizes = classes.sizes if classes is not None else _NO_SIZES
    last = _last_engine_bytes
    if last is not None and last[0] is cfg and last[1] is sizes:
        return last[2]
    out = {}
    packing = {p.shape for p in cfg.pools if p.pack}
    for m in cfg.models:
        shape = cfg.shape(m.shape) if m.shape in packing else None
        if shape is not None and m.name in sizes and m.base is None:
            out[m.name] = engine_memory(sizes[m.name], m.engine, shape)
    _last_engine_bytes = (cfg, sizes, out)
    return out
