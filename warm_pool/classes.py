"""Each configured model's engine class, as the controller's placement needs it.

A model's engine class (``thaw.engine_class``) is computed from its ``config.json``
in the store and its engine settings in the config. :class:`ModelClasses` reads each
model's ``config.json`` (a few KiB, in a thread: boto3 blocks) when it has not for
``refresh_s``, and keeps the classes it could compute. A model whose config cannot
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
from collections.abc import Callable
from typing import Any

from thaw.config import ThawConfig
from thaw.engine_class import engine_class_of
from thaw.fit import engine_memory
from thaw.log import get_logger

log = get_logger()

# Reads the config.json at a model URI (None: there is none). Blocking.
ConfigReader = Callable[[str], dict[str, Any] | None]
# The bytes of the weights at a model URI, from its manifest (None: no manifest). Blocking.
SizeReader = Callable[[str], int | None]


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

    def _due(self, uri: str, now: float) -> bool:
        return now - self._read_at.get(uri, -self._refresh_s) >= self._refresh_s

    def due(self, cfg: ThawConfig, now: float) -> bool:
        return any(self._due(m.uri, now) for m in cfg.models if m.base is None)

    async def refresh(self, cfg: ThawConfig) -> dict[str, str]:
        """Read the configs that are due and recompute every model's class."""
        now = self._clock()
        # An adapter has no engine of its own (nor a config.json): its base's is what counts.
        for uri in sorted({m.uri for m in cfg.models if m.base is None}):
            if not self._due(uri, now):
                continue
            self._read_at[uri] = now
            try:
                self._configs[uri] = await asyncio.to_thread(self._read, uri)
            except Exception as exc:  # the store: keep what was read before, say why once
                self._note(uri, f"cannot read config.json: {type(exc).__name__}: {exc}")
            if self._read_size is not None:
                try:
                    self._sizes[uri] = await asyncio.to_thread(self._read_size, uri)
                except Exception as exc:
                    self._note(uri + "#size", f"cannot read the manifest: {type(exc).__name__}: {exc}")
        self.sizes = {m.name: n for m in cfg.models if (n := self._sizes.get(m.uri)) is not None}
        classes: dict[str, str] = {}
        for m in cfg.models:
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
        self.classes = classes
        return classes

    def _note(self, key: str, problem: str) -> None:
        if self._problems.get(key) != problem:
            self._problems[key] = problem
            log.warning("engine_class_unknown", model_or_uri=key, reason=problem)


def engine_bytes(cfg: ThawConfig, classes: ModelClasses | None) -> dict[str, int]:
    """The memory an engine of each model of a packing pool holds, where its size is
    known (thaw.fit.engine_memory)."""
    sizes = classes.sizes if classes is not None else {}
    out = {}
    for m in cfg.models:
        pool, shape = cfg.pool(m.shape), cfg.shape(m.shape)
        if pool is not None and pool.pack and shape is not None and m.name in sizes and m.base is None:
            out[m.name] = engine_memory(sizes[m.name], m.engine, shape)
    return out
