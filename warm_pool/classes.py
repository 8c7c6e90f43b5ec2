"""Each configured model's engine class, as the controller's placement needs it.

A model's engine class (``thaw.engine_class``) is computed from its ``config.json``
in the store and its engine settings in the config. :class:`ModelClasses` reads each
model's ``config.json`` (a few KiB, in a thread: boto3 blocks) when it has not for
``refresh_s``, and keeps the classes it could compute. A model whose config cannot
be read, or is not a model vLLM can build, has no class: it is placed as before
(never a swap), and the reason is logged once per change.

The worker never takes the controller's word for a class: it computes the class of
the model it is assigned from the same file and swaps only when the two agree.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from thaw.config import ThawConfig
from thaw.engine_class import engine_class_of
from thaw.log import get_logger

log = get_logger()

# Reads the config.json at a model URI (None: there is none). Blocking.
ConfigReader = Callable[[str], dict[str, Any] | None]


class ModelClasses:
    def __init__(self, read_config: ConfigReader, *, clock: Callable[[], float], refresh_s: float = 60.0) -> None:
        self._read = read_config
        self._clock = clock
        self._refresh_s = refresh_s
        self._configs: dict[str, dict[str, Any] | None] = {}
        self._read_at: dict[str, float] = {}
        self._problems: dict[str, str] = {}
        self.classes: dict[str, str] = {}

    def _due(self, uri: str, now: float) -> bool:
        return now - self._read_at.get(uri, -self._refresh_s) >= self._refresh_s

    def due(self, cfg: ThawConfig, now: float) -> bool:
        return any(self._due(m.uri, now) for m in cfg.models)

    async def refresh(self, cfg: ThawConfig) -> dict[str, str]:
        """Read the configs that are due and recompute every model's class."""
        now = self._clock()
        for uri in sorted({m.uri for m in cfg.models}):
            if not self._due(uri, now):
                continue
            self._read_at[uri] = now
            try:
                self._configs[uri] = await asyncio.to_thread(self._read, uri)
            except Exception as exc:  # the store: keep what was read before, say why once
                self._note(uri, f"cannot read config.json: {type(exc).__name__}: {exc}")
        classes: dict[str, str] = {}
        for m in cfg.models:
            config = self._configs.get(m.uri)
            if config is None:
                if m.uri in self._configs:
                    self._note(m.name, "no config.json in the store")
                continue
            try:
                classes[m.name] = engine_class_of(config, m.engine, max_model_len=m.max_context_tokens).id
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
