"""Prompt length as the engine counts it, before any GPU work.

The model's tokenizer files are fetched from its prefix in the store once per model,
loaded with ``transformers`` as vLLM loads them, and cached. A chat is rendered as
vLLM renders it (``activator.chat_render``: its message parsing, content format,
template arguments) with the tokenizer's own ``apply_chat_template``, then encoded
without special tokens; a completions prompt is encoded with them. vLLM 0.32 does the
same, so the count is its ``usage.prompt_tokens``.

Counting is the slow way: the activator first bounds a prompt from its bytes
(``ModelTokenizer.prompt_bounds``, ``activator.token_bound``, measured against the
template here when the tokenizer is loaded) and counts only where the bound cannot
decide (``activator.service``).

``AutoTokenizer`` is not used: it imports torch (through ``AutoConfig``), which the
activator never loads. The tokenizer class is resolved from ``tokenizer_config.json``
as ``AutoTokenizer`` does for a model without remote code: the class it names when
``transformers`` has that fast tokenizer, else the generic ``TokenizersBackend``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from activator import token_bound
from activator.chat_render import (
    Unsupported,
    accepted_kwargs,
    content_format,
    conversation,
    developer_as_system,
    supports_developer_role,
    template_kwargs,
    tool_dicts,
)
from activator.protocol import max_new_tokens
from thaw.log import get_logger
from thaw.s3errors import is_missing_key

log = get_logger()

# What transformers reads from a tokenizer directory (chat_template.jinja: the template
# saved on its own, as newer models ship it).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja")
# vLLM's CompletionRequest.max_tokens default (and OpenAI's).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class FileFetcher(Protocol):
    """Reads one small file of a model from the store (blocking; run in a thread)."""

    def __call__(self, uri: str, name: str) -> bytes | None: ...


class PromptRejected(ValueError):
    """The chat template refused these messages (vLLM answers 400 with this reason)."""


# Segments shorter than this are encoded each time (a dict lookup would not be cheaper
# by much); the cache holds at most this many segments per model, least recent out.
MIN_CACHED_SEGMENT_CHARS = 64
MAX_CACHED_SEGMENTS = 8192
# One count in this many is also made whole and compared (a tokenizer whose segments do
# not add up is caught, logged and counted whole from then on).
CHECK_EVERY = 256


class SegmentCounter:
    """Token counts of a text as the sum of its segments' between special tokens.

    A Hugging Face tokenizer splits its input on added tokens before it normalizes,
    pre-tokenizes or merges anything, so the tokens of a text are its special tokens
    plus the tokens of each piece between them, counted on its own. A conversation's
    next turn repeats every earlier message: each message is such a piece, counted once
    and cached, so only the new tail is encoded. Only special tokens that match their
    exact text (no stripping, no normalization) split; a tokenizer whose sample texts do
    not add up this way is counted whole (:meth:`for_tokenizer` returns None).
    """

    def __init__(self, backend: Any, specials: list[str]) -> None:
        import re

        self.backend = backend
        self.split = re.compile("(" + "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)) + ")")
        self.specials = frozenset(specials)
        self.cache: dict[str, int] = {}  # insertion-ordered: the oldest first
        # Large prompts are counted on a thread beside the event loop's own counting.
        self.lock = threading.Lock()
        self.added = {flag: len(backend.encode("", add_special_tokens=flag)) for flag in (False, True)}
        self.hits = self.misses = self.calls = 0
        self.broken = False

    @classmethod
    def for_tokenizer(cls, backend: Any, samples: Iterable[str]) -> SegmentCounter | None:
        specials = [t.content for t in backend.get_added_tokens_decoder().values()
                    if t.special and t.content and not (t.lstrip or t.rstrip or t.single_word or t.normalized)]
        if not specials:
            return None
        counter = cls(backend, specials)
        for text in samples:
            for flag in (False, True):
                if counter.count(text, flag) != len(backend.encode(text, add_special_tokens=flag)):
                    return None
        counter.cache.clear()
        return counter

    def count(self, text: str, add_special: bool) -> int:
        n = self.added[add_special]
        for piece in self.split.split(text):
            if not piece:
                continue
            if piece in self.specials:
                n += 1
                continue
            if len(piece) < MIN_CACHED_SEGMENT_CHARS:
                n += len(self.backend.encode(piece, add_special_tokens=False))
                continue
            with self.lock:
                got = self.cache.pop(piece, None)  # re-inserted below: now the most recent
            if got is None:
                self.misses += 1
                got = len(self.backend.encode(piece, add_special_tokens=False))
            else:
                self.hits += 1
            with self.lock:
                if len(self.cache) >= MAX_CACHED_SEGMENTS:
                    del self.cache[next(iter(self.cache))]
                self.cache[piece] = got
            n += got
        return n


# A prompt of at least this many characters is counted on a thread: rendering and
# encoding it takes milliseconds, which every stream on the event loop would wait.
INLINE_COUNT_CHARS = 16_384


def prompt_chars(kind: str, body: dict[str, Any]) -> int:
    """About how many characters a request's prompt has (cheap: no rendering)."""
    if kind == "chat":
        total = 0
        for m in body.get("messages") or ():
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
        return total
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(p) for p in prompt if isinstance(p, str)) if isinstance(prompt, list) else 0


@dataclass
class ModelTokenizer:
    tokenizer: Any  # a transformers TokenizersBackend
    apply_params: frozenset[str]  # what its apply_chat_template takes by name
    segments: SegmentCounter | None = None
    # The upper bound on its prompts without counting them (activator.token_bound);
    # None: every prompt is counted exactly.
    bound: token_bound.PromptBound | None = None

    def prompt_bounds(self, kind: str, body: dict[str, Any]) -> list[int] | None:
        """An upper bound on each of :meth:`prompt_lengths`, from the request's bytes
        (no rendering, no encoding); None where the bound does not cover it."""
        return None if self.bound is None else token_bound.prompt_bounds(kind, body, self.bound)

    def prompt_lengths(self, kind: str, body: dict[str, Any], *, max_model_len: int | None = None) -> list[int] | None:
        """Tokens in each prompt the engine runs for ``body`` (a chat: one; a batch of
        completion prompts: one each), after ``truncate_prompt_tokens``; None when the
        engine alone can count it (media, a template sent with the request, ...).
        Raises ``PromptRejected`` when the chat template raises, as vLLM does."""
        try:
            lengths = self._chat(body) if kind == "chat" else self._completions(body)
        except Unsupported:
            return None
        return [_truncated(n, kind, body, max_model_len) for n in lengths]

    def count(self, kind: str, body: dict[str, Any], *, max_model_len: int | None = None) -> int | None:
        """The request's prompt tokens as the engine reports them in ``usage``."""
        lengths = self.prompt_lengths(kind, body, max_model_len=max_model_len)
        return None if lengths is None else sum(lengths)

    def _chat(self, body: dict[str, Any]) -> list[int]:
        text, add_special = self.render_chat(body)
        return [self._length(text, add_special)]

    def render_chat(self, body: dict[str, Any]) -> tuple[str, bool]:
        """The text the engine encodes for a chat, and whether with special tokens.
        Raises ``Unsupported`` or ``PromptRejected`` as :meth:`prompt_lengths` says."""
        if body.get("chat_template") is not None:
            raise Unsupported("chat_template")  # refused by the engine unless it trusts it
        kwargs = template_kwargs(body, tool_dicts(body.get("tools")))
        tools = kwargs.pop("tools", None)
        try:
            template = self.tokenizer.get_chat_template(None, tools=tools)
        except ValueError:
            raise Unsupported("no chat template") from None  # the engine refuses the chat
        messages = conversation(body["messages"], content_format(template))
        if any(m["role"] == "developer" for m in messages) and not supports_developer_role(template):
            messages = developer_as_system(messages)
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, chat_template=template, tokenize=False,
                **accepted_kwargs(template, kwargs, self.apply_params))
        except Exception as exc:
            raise PromptRejected(_template_error_reason(exc)) from None
        add_special = body.get("add_special_tokens", False)
        if not isinstance(add_special, bool):
            raise Unsupported("add_special_tokens")
        return text, add_special

    def _completions(self, body: dict[str, Any]) -> list[int]:
        if body.get("prompt_embeds") is not None or body.get("suffix") is not None:
            raise Unsupported("prompt_embeds or suffix")  # embeddings; fill-in-the-middle rendering
        add_special = body.get("add_special_tokens", True)
        if not isinstance(add_special, bool):
            raise Unsupported("add_special_tokens")
        prompt = body["prompt"]
        prompts = [prompt] if isinstance(prompt, str) or all(isinstance(t, int) for t in prompt) else prompt
        return [len(p) if isinstance(p, list) else self._length(p, add_special) for p in prompts]

    def _length(self, text: str, add_special: bool) -> int:
        """Tokens in ``text``: the Rust tokenizer's own encode, which is what the
        transformers call (``tokenizer(text)["input_ids"]``) runs underneath, without
        the Python around it (a fifth of the activator's CPU per request)."""
        backend = self.tokenizer.backend_tokenizer
        seg = self.segments
        if seg is None or seg.broken:
            return len(backend.encode(text, add_special_tokens=add_special))
        n = seg.count(text, add_special)
        seg.calls += 1
        if seg.calls % CHECK_EVERY == 0:
            whole = len(backend.encode(text, add_special_tokens=add_special))
            if whole != n:
                seg.broken = True
                log.warning("segment_count_mismatch", segments=n, whole=whole)
                return whole
        return n


def _truncated(n: int, kind: str, body: dict[str, Any], max_model_len: int | None) -> int:
    """vLLM's TokenizeParams: ``truncate_prompt_tokens`` keeps that many; -1 keeps the
    context, less one token for the output when the request asks for any."""
    keep = body.get("truncate_prompt_tokens")
    if not isinstance(keep, int) or isinstance(keep, bool):
        return n
    if keep < 0:
        if max_model_len is None:
            return n
        if kind == "chat":
            max_out = max_new_tokens(body) or 0
        else:
            max_out = body.get("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS) or 0
        keep = max_model_len if max_out == 0 else max(0, max_model_len - 1)
    return min(n, keep)


def _template_error_reason(exc: BaseException) -> str:
    """The most specific reason in the chain: the template's own message (vLLM's
    ``_template_error_reason``)."""
    import jinja2

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, jinja2.TemplateError):
            return str(current)
        current = current.__cause__ or current.__context__
    return str(exc)


def _tokenizer_class(tokenizer_config: dict[str, Any]) -> Any:
    import transformers
    from transformers import TokenizersBackend

    name = tokenizer_config.get("tokenizer_class")
    if isinstance(name, str) and "auto_map" not in tokenizer_config:
        name = name.removesuffix("Fast")
        # Only tokenizer classes: any other name could import a torch module.
        cls = getattr(transformers, name, None) if name.endswith("Tokenizer") else None
        if isinstance(cls, type) and issubclass(cls, TokenizersBackend):
            return cls
    return TokenizersBackend


def build_tokenizer(files: Mapping[str, bytes]) -> ModelTokenizer:
    """A tokenizer from the files of ``TOKENIZER_FILES`` that the model has
    (``tokenizer.json`` at least)."""
    import inspect

    from transformers import PythonBackend

    config = json.loads(files["tokenizer_config.json"]) if "tokenizer_config.json" in files else {}
    cls = _tokenizer_class(config)
    with tempfile.TemporaryDirectory(prefix="thaw-tokenizer-") as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        # As vLLM's tokenizer registry loads it for a generating model.
        tok = cls.from_pretrained(tmp, local_files_only=True, truncation_side="left")
    # vLLM's resolve_chat_template_kwargs: the named parameters of apply_chat_template,
    # this tokenizer's and the base class's.
    params = set()
    for fn in (tok.apply_chat_template, PythonBackend.apply_chat_template):
        params |= {p.name for p in inspect.signature(fn).parameters.values()
                   if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)}
    model = ModelTokenizer(tok, frozenset(params), SegmentCounter.for_tokenizer(tok.backend_tokenizer,
                                                                              _samples(tok)))
    try:
        model.bound = _bound(model)
    except Exception as exc:  # a bound that cannot be measured: count every prompt
        log.warning("prompt_bound_failed", error=repr(exc))
    return model


def _bound(model: ModelTokenizer) -> token_bound.PromptBound | None:
    """The model's prompt bound: its tokenizer's expansion (None: not bounded), what its
    post-processor adds, and its chat template's overhead measured by rendering probes."""
    backend = model.tokenizer.backend_tokenizer

    def state(part: Any) -> Any:
        return None if part is None else json.loads(part.__getstate__())

    factor = token_bound.expansion(state(backend.normalizer), state(backend.pre_tokenizer),
                                   type(backend.model).__name__)
    if factor is None:
        log.info("prompt_bound_off", reason="tokenizer")
        return None
    added = {flag: len(backend.encode("", add_special_tokens=flag)) for flag in (False, True)}
    overhead = None
    try:
        template = model.tokenizer.get_chat_template(None, tools=None)
    except ValueError:
        template = None  # no template: the engine refuses chats, counted to say so
    if template is not None:
        overhead = token_bound.measure(lambda body: model.render_chat(body)[0], ascii_template=template.isascii())
        if overhead is None:
            log.info("prompt_bound_off", reason="template")
    return token_bound.PromptBound(factor, added, overhead)


def _samples(tok: Any) -> list[str]:
    """Texts to check segment counting on: a conversation rendered by the model's own
    chat template (when it has one), and plain text around its special tokens."""
    texts = ["Hello there, how are you today?  Fine.\n\n  Thanks!", "x" * 200 + " y\n" * 50]
    specials = [t.content for t in tok.backend_tokenizer.get_added_tokens_decoder().values() if t.special]
    texts += [f"{a} text {s} more\n{b}" for s in specials for a, b in (("", ""), ("  ", "\n"))]
    try:
        texts.append(tok.apply_chat_template(
            [{"role": "system", "content": "You are terse. " * 8},
             {"role": "user", "content": "What is 2 + 2?\n\nSay it twice."},
             {"role": "assistant", "content": " Four. Four.  "},
             {"role": "user", "content": "Thanks " * 20}],
            tokenize=False, add_generation_prompt=True))
    except Exception:  # no template, or one that wants other roles: plain texts only
        pass
    return texts


class TokenCounter:
    """Per-model tokenizers, loaded once from the store; None when the model has none.

    Models whose tokenizer files are the same bytes (fine-tunes of one base, the same
    weights under many names) share one tokenizer: with thousands of models, one per
    model would hold gigabytes (a Llama 3 tokenizer is tens of MB in memory) and build
    each again (hundreds of milliseconds of CPU)."""

    def __init__(self, fetch: FileFetcher) -> None:
        self._fetch = fetch
        self._cache: dict[str, ModelTokenizer | None] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._by_digest: dict[str, ModelTokenizer] = {}

    async def get(self, uri: str) -> ModelTokenizer | None:
        if uri in self._cache:
            return self._cache[uri]
        lock = self._locks.setdefault(uri, asyncio.Lock())
        async with lock:
            if uri not in self._cache:
                self._cache[uri] = await asyncio.to_thread(self._load, uri)
        return self._cache[uri]

    async def prefetch(self, uris: Iterable[str]) -> None:
        """Load these models' tokenizers ahead of their first request, one at a time in a
        thread, so that request pays neither the store's round trips nor transformers'
        import (about 2 s here). A model whose tokenizer is not in the store yet (a model
        pushed later) is left for its first request to try again."""
        for uri in dict.fromkeys(uris):
            lock = self._locks.setdefault(uri, asyncio.Lock())
            async with lock:
                if uri in self._cache:
                    continue
                tok = await asyncio.to_thread(self._load, uri)
                if tok is not None:
                    self._cache[uri] = tok

    def _load(self, uri: str) -> ModelTokenizer | None:
        try:
            files = {name: data for name in TOKENIZER_FILES if (data := self._fetch(uri, name)) is not None}
            if "tokenizer.json" not in files:
                log.warning("tokenizer_missing", uri=uri)
                return None
            digest = hashlib.sha256()
            for name in sorted(files):
                digest.update(f"{name}\0{len(files[name])}\0".encode())
                digest.update(files[name])
            key = digest.hexdigest()
            tok = self._by_digest.get(key)
            if tok is None:
                tok = self._by_digest.setdefault(key, build_tokenizer(files))
            return tok
        except Exception as exc:  # a bad tokenizer must not take the API down
            log.warning("tokenizer_unusable", uri=uri, error=str(exc))
            return None


def s3_fetcher(client: Any) -> FileFetcher:
    """A FileFetcher over a boto3 S3 client. A file the model's manifest does not list is
    absent without a request: S3 answers a GET of a missing key with 403, not 404, to a
    role that may not list the bucket (an activator's), and a model has few of the
    optional files. A model without a manifest is read file by file."""
    import botocore.exceptions

    from thaw.objstore import MANIFEST_NAME, read_json_object
    from thaw.s3uri import join_key, parse_s3_uri

    def fetch(uri: str, name: str) -> bytes | None:
        # Read each time (a few KiB; a tokenizer is loaded once per model): a model pushed
        # again may list other files.
        manifest = read_json_object(client, uri, MANIFEST_NAME)
        if manifest is not None and name not in {f["path"] for f in manifest.get("files", [])}:
            return None
        bucket, prefix = parse_s3_uri(uri)
        try:
            return client.get_object(Bucket=bucket, Key=join_key(prefix, name))["Body"].read()  # type: ignore[no-any-return]
        except botocore.exceptions.ClientError as exc:
            if is_missing_key(exc):
                return None
            raise

    return fetch
