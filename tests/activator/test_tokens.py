"""The activator's tokenizer: loaded from the store's files, never importing torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from activator.tokens import TOKENIZER_FILES, TokenCounter
from tests.activator.support import fetcher


def test_counting_a_chat_never_imports_torch(demo_model_dir: Path) -> None:
    # A fresh interpreter: this one may have torch from other tests.
    code = textwrap.dedent(f"""
        import asyncio, sys
        from pathlib import Path
        from activator.app import create_app
        from activator.tokens import TokenCounter
        from tests.activator.support import fetcher
        tok = asyncio.run(TokenCounter(fetcher(Path({str(demo_model_dir)!r}))).get("s3://b/demo"))
        n = tok.count("chat", {{"messages": [{{"role": "user", "content": "hi"}}], "tools": []}})
        assert n and n > 5, n
        assert "torch" not in sys.modules, "torch was imported"
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


async def test_a_model_without_a_tokenizer_is_estimated(tmp_path: Path, demo_model_dir: Path) -> None:
    assert await TokenCounter(fetcher(tmp_path)).get("s3://b/none") is None
    # A model without a chat template: chats are left to the engine, prompts still counted.
    (tmp_path / "tokenizer.json").write_bytes((demo_model_dir / "tokenizer.json").read_bytes())
    tok = await TokenCounter(fetcher(tmp_path)).get("s3://b/bare")
    assert tok is not None
    assert tok.count("chat", {"messages": [{"role": "user", "content": "hi"}]}) is None
    assert tok.count("completions", {"prompt": [1, 2, 3]}) == 3


async def test_a_template_that_raises_is_the_clients_error(tmp_path: Path, demo_model_dir: Path) -> None:
    import json

    from activator.tokens import PromptRejected

    for name in TOKENIZER_FILES:
        if (demo_model_dir / name).exists():
            (tmp_path / name).write_bytes((demo_model_dir / name).read_bytes())
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('the first turn must be "
                            "the user') }}{% endif %}{{ messages[0]['content'] }}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = await TokenCounter(fetcher(tmp_path)).get("s3://b/strict")
    assert tok is not None
    # The template renders the bare content; chats are encoded without special tokens.
    assert tok.count("chat", {"messages": [{"role": "user", "content": "hi"}]}) == len(
        tok.tokenizer("hi", add_special_tokens=False)["input_ids"])
    try:
        tok.count("chat", {"messages": [{"role": "assistant", "content": "hi"}]})
    except PromptRejected as exc:
        assert str(exc) == "the first turn must be the user"
    else:
        raise AssertionError("the template's refusal was not raised")


async def test_prefetch_loads_tokenizers_before_the_first_request_and_retries_missing_ones(
    tmp_path: Path, demo_model_dir: Path,
) -> None:
    fetched: list[str] = []
    serve = fetcher(demo_model_dir)

    def fetch(uri: str, name: str) -> bytes | None:
        fetched.append(uri)
        return serve(uri, name) if uri == "s3://b/demo" else None

    counter = TokenCounter(fetch)
    await counter.prefetch(["s3://b/demo", "s3://b/later", "s3://b/demo"])
    assert set(fetched) == {"s3://b/demo", "s3://b/later"}
    fetched.clear()
    assert await counter.get("s3://b/demo") is not None
    assert fetched == []  # loaded already
    # Not in the store at start-up (pushed later, say): the first request tries again.
    assert await counter.get("s3://b/later") is None
    assert fetched and set(fetched) == {"s3://b/later"}


async def test_counting_by_segments_is_the_whole_count_and_encodes_only_the_new_tail(demo_model_dir: Path) -> None:
    import random

    from activator.tokens import MIN_CACHED_SEGMENT_CHARS

    tok = await TokenCounter(fetcher(demo_model_dir)).get("s3://b/demo")
    assert tok is not None and tok.segments is not None
    backend = tok.tokenizer.backend_tokenizer
    rng = random.Random(5)
    words = ["the", " river", "  stone\n", "\n\n", "Ünïcode", "😀", "<|eot_id|>", "<|begin_of_text|>", "x" * 90,
             " ", "\t", "<|start_header_id|>user<|end_header_id|>", "<|eot", "_id|>", "12.5%"]
    for _ in range(300):
        text = "".join(rng.choice(words) for _ in range(rng.randint(0, 40)))
        for special in (False, True):
            assert tok.segments.count(text, special) == len(backend.encode(text, add_special_tokens=special)), text
    # A conversation's next turn: the earlier messages come from the cache.
    history = [{"role": "system", "content": "You are a careful assistant. " * 10}]
    seg = tok.segments
    for turn in range(4):
        history.append({"role": "user", "content": f"Question {turn}: " + "tell me more about rivers. " * 5})
        misses = seg.misses
        n = tok.count("chat", {"messages": history})
        text = tok.tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
        assert n == len(backend.encode(text, add_special_tokens=False))
        if turn:
            assert seg.misses - misses == 2  # only the new messages: the last answer, the new question
        history.append({"role": "assistant", "content": f"Rivers run ({turn}). " * 8})
    assert all(len(k) >= MIN_CACHED_SEGMENT_CHARS for k in seg.cache)


def test_a_tokenizer_whose_segments_do_not_add_up_is_counted_whole(demo_model_dir: Path) -> None:
    from tokenizers import AddedToken, Tokenizer

    from activator.tokens import CHECK_EVERY, ModelTokenizer, SegmentCounter

    backend = Tokenizer.from_str((demo_model_dir / "tokenizer.json").read_text())
    # A special token that eats the spaces around it: splitting there would count them.
    backend.add_special_tokens([AddedToken("<|sep|>", lstrip=True, rstrip=True, special=True)])
    only_stripping = Tokenizer.from_str(backend.to_str())
    assert SegmentCounter.for_tokenizer(only_stripping, ["a  <|sep|>  b"]) is not None  # it does not split there
    # A counter that goes wrong is caught by the periodic whole count and retired.
    seg = SegmentCounter(backend, ["<|eot_id|>"])
    seg.added = {False: 5, True: 5}  # wrong on purpose

    class Fake:
        backend_tokenizer = backend

    tok = ModelTokenizer(Fake(), frozenset(), seg)
    counts = [tok._length("hello there", False) for _ in range(CHECK_EVERY)]
    whole = len(backend.encode("hello there", add_special_tokens=False))
    assert counts[-1] == whole and seg.broken and tok._length("hello there", False) == whole


def test_prompt_chars_is_a_cheap_size_of_the_prompt() -> None:
    from activator.tokens import prompt_chars

    chat = {"messages": [{"role": "user", "content": "abc"},
                         {"role": "user", "content": [{"type": "text", "text": "de"}, {"type": "image_url"}]},
                         "not a message"]}
    assert prompt_chars("chat", chat) == 5
    assert prompt_chars("completions", {"prompt": "abcd"}) == 4
    assert prompt_chars("completions", {"prompt": ["ab", "c", [1, 2]]}) == 3
    assert prompt_chars("completions", {"prompt": [1, 2, 3]}) == 0 and prompt_chars("chat", {}) == 0


async def test_models_with_the_same_tokenizer_files_share_one_tokenizer(tmp_path: Path, demo_model_dir: Path) -> None:
    serve = fetcher(demo_model_dir)
    other = tmp_path / "other"
    shutil.copytree(demo_model_dir, other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}))
    serve_other = fetcher(other)

    def fetch(uri: str, name: str) -> bytes | None:
        return serve_other(uri, name) if uri.endswith("/other") else serve(uri, name)

    counter = TokenCounter(fetch)
    a, b, c = [await counter.get(u) for u in ("s3://b/ft-1", "s3://b/ft-2", "s3://b/other")]
    assert a is not None and a is b  # the same files: one tokenizer
    assert c is not None and c is not a  # one file differs: its own
