"""The activator's tokenizer: loaded from the store's files, never importing torch."""

from __future__ import annotations

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
