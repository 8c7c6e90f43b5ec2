"""Prompt length with the model's own tokenizer, before any GPU work.

The tokenizer (``tokenizer.json``) and chat template (``tokenizer_config.json``) are
fetched from the model's prefix in the store once per model and cached. A chat prompt
is rendered with the template, as the engine will, then encoded.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Protocol

from thaw.log import get_logger

log = get_logger()


class FileFetcher(Protocol):
    """Reads one small file of a model from the store (blocking; run in a thread)."""

    def __call__(self, uri: str, name: str) -> bytes | None: ...


@dataclass
class ModelTokenizer:
    tokenizer: Any  # tokenizers.Tokenizer
    template: Any | None  # jinja2.Template
    special: dict[str, str]

    def count(self, kind: str, body: dict[str, Any]) -> int:
        if kind == "chat":
            if self.template is None:
                text = "\n".join(_text(m.get("content")) for m in body["messages"])
                return len(self.tokenizer.encode(text, add_special_tokens=True).ids)
            text = self.template.render(messages=body["messages"], add_generation_prompt=True,
                                        tools=body.get("tools"), **self.special)
            return len(self.tokenizer.encode(text, add_special_tokens=False).ids)
        prompt = body["prompt"]
        if isinstance(prompt, str):
            return len(self.tokenizer.encode(prompt, add_special_tokens=True).ids)
        if prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        # A batch of prompts: the longest one decides whether it fits.
        return max((len(p) if isinstance(p, list) else len(self.tokenizer.encode(str(p)).ids)) for p in prompt)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def build_tokenizer(tokenizer_json: bytes, tokenizer_config: bytes | None) -> ModelTokenizer:
    import jinja2.sandbox
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json.decode())
    template = None
    special: dict[str, str] = {}
    if tokenizer_config:
        cfg = json.loads(tokenizer_config)
        for k in ("bos_token", "eos_token"):
            v = cfg.get(k)
            special[k] = v.get("content", "") if isinstance(v, dict) else (v or "")
        if isinstance(cfg.get("chat_template"), str):
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

            def raise_exception(message: str) -> None:
                raise jinja2.exceptions.TemplateError(message)

            env.globals["raise_exception"] = raise_exception
            template = env.from_string(cfg["chat_template"])
    return ModelTokenizer(tok, template, special)


class TokenCounter:
    """Per-model tokenizers, loaded once from the store; None when the model has none."""

    def __init__(self, fetch: FileFetcher) -> None:
        self._fetch = fetch
        self._cache: dict[str, ModelTokenizer | None] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, uri: str) -> ModelTokenizer | None:
        if uri in self._cache:
            return self._cache[uri]
        lock = self._locks.setdefault(uri, asyncio.Lock())
        async with lock:
            if uri not in self._cache:
                self._cache[uri] = await asyncio.to_thread(self._load, uri)
        return self._cache[uri]

    def _load(self, uri: str) -> ModelTokenizer | None:
        try:
            tj = self._fetch(uri, "tokenizer.json")
            if tj is None:
                log.warning("tokenizer_missing", uri=uri)
                return None
            return build_tokenizer(tj, self._fetch(uri, "tokenizer_config.json"))
        except Exception as exc:  # a bad tokenizer must not take the API down
            log.warning("tokenizer_unusable", uri=uri, error=str(exc))
            return None


def s3_fetcher(client: Any) -> FileFetcher:
    """A FileFetcher over a boto3 S3 client."""
    import botocore.exceptions

    from thaw.s3uri import join_key, parse_s3_uri

    def fetch(uri: str, name: str) -> bytes | None:
        bucket, prefix = parse_s3_uri(uri)
        try:
            return client.get_object(Bucket=bucket, Key=join_key(prefix, name))["Body"].read()  # type: ignore[no-any-return]
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise

    return fetch
