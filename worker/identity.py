"""What a model is to an engine that may take it by a swap: its engine class and the
digest of its vocabulary files, read from the store (its manifest and config.json).

Two models can share one engine when both are equal: the class covers everything the
engine is built from (``thaw.engine_class``); the vocabulary covers the tokenizer the
engine core keeps for structured output, which a swap does not replace. Chat
templates and generation defaults may differ: the engine host's front end takes the
new model's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from thaw.config import EngineArgs
from thaw.engine_class import EngineClass, engine_class_of
from weight_streaming.manifest import Manifest

# The files that define a tokenizer's vocabulary (whichever a model has).
VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt",
               "added_tokens.json", "special_tokens_map.json")


@dataclass(frozen=True)
class ModelIdentity:
    engine_class: EngineClass
    vocab: str


def vocab_digest(manifest: Manifest) -> str:
    """One digest over the vocabulary files' paths and sha256s (from the manifest)."""
    h = hashlib.sha256()
    for entry in sorted(manifest.files, key=lambda e: e.path):
        if entry.path in VOCAB_FILES:
            h.update(f"{entry.path}\0{entry.sha256}\n".encode())
    return h.hexdigest()[:16]


def identity_of(manifest: object, config: Mapping[str, Any] | None, engine: EngineArgs,
                max_model_len: int) -> ModelIdentity:
    """The identity of a model from its manifest and config.json (ValueError: none)."""
    if not isinstance(manifest, Manifest):
        raise ValueError("the model has no manifest")
    if config is None:
        raise ValueError("the model has no config.json")
    return ModelIdentity(engine_class_of(config, engine, max_model_len=max_model_len), vocab_digest(manifest))
