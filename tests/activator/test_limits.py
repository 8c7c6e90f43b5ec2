"""Token buckets stepped by hand (time passed in), and the prompt counter."""

from __future__ import annotations

from pathlib import Path

import pytest

from activator.errors import TooManyRequests
from activator.limits import LocalLimiter, RateLimiter
from activator.tokens import TOKENIZER_FILES, build_tokenizer
from thaw.config import RateLimits


def test_requests_per_minute_refill() -> None:
    rl = RateLimiter()
    lim = RateLimits(requests_per_minute=2)
    a1 = rl.admit("t", "m", lim, 0, now=0.0)
    assert a1.headers["x-ratelimit-remaining-requests"] == "1"
    rl.admit("t", "m", lim, 0, now=0.0)
    with pytest.raises(TooManyRequests) as info:
        rl.admit("t", "m", lim, 0, now=0.0)
    # 2 per minute refills 1 every 30 s.
    assert info.value.retry_after_s == pytest.approx(30.0)
    assert info.value.headers["x-ratelimit-limit-requests"] == "2"
    assert info.value.headers["x-ratelimit-remaining-requests"] == "0"
    assert info.value.headers["x-ratelimit-reset-requests"] == "1m0s"
    rl.admit("t", "m", lim, 0, now=30.0)
    # Another tenant, or another model, has its own buckets.
    rl.admit("u", "m", lim, 0, now=30.0)
    rl.admit("t", "other", lim, 0, now=30.0)


def test_tokens_reserved_then_reconciled() -> None:
    rl = RateLimiter()
    lim = RateLimits(tokens_per_minute=100)
    a = rl.admit("t", "m", lim, 60, now=0.0)
    with pytest.raises(TooManyRequests) as info:
        rl.admit("t", "m", lim, 60, now=0.0)
    assert info.value.code == "rate_limit_tokens"
    # 40 left, 60 needed: 20 tokens at 100/min = 12 s.
    assert info.value.retry_after_s == pytest.approx(12.0)
    rl.settle(a, used_tokens=20, now=0.0)  # used 20 of the 60 reserved: 40 come back
    rl.admit("t", "m", lim, 60, now=0.0)
    with pytest.raises(TooManyRequests, match="more than the tenant's limit of 100 tokens per minute"):
        rl.admit("t", "m", lim, 500, now=100.0)


def test_concurrency_slots_are_freed_on_settle() -> None:
    rl = RateLimiter()
    lim = RateLimits(max_concurrent_requests=1)
    a = rl.admit("t", "m", lim, 0, now=0.0)
    with pytest.raises(TooManyRequests) as info:
        rl.admit("t", "m", lim, 0, now=0.0)
    assert info.value.code == "concurrency_limit_exceeded"
    rl.settle(a, None, now=1.0)
    rl.admit("t", "m", lim, 0, now=1.0)


async def test_each_worker_process_takes_its_share_of_a_local_limit() -> None:
    # `thaw activator --workers 2`: two processes, one port; together no more than the limit.
    workers = [LocalLimiter(processes=2), LocalLimiter(processes=2)]
    limits = RateLimits(requests_per_minute=5, max_concurrent_requests=3)
    granted = []
    for w in workers:
        for _ in range(4):
            try:
                granted.append(await w.admit("t", "m", limits, 1, now=0.0))
            except TooManyRequests as exc:
                assert exc.code in ("rate_limit_requests", "concurrency_limit_exceeded")
    assert len(granted) == 4  # ceil(5 / 2) = 3 requests, but ceil(3 / 2) = 2 at once, each
    assert granted[0].headers["x-ratelimit-limit-requests"] == "3"
    assert (await LocalLimiter().admit("t", "m", limits, 1, now=0.0)).headers["x-ratelimit-limit-requests"] == "5"


def test_prompt_counted_with_the_chat_template(demo_model_dir: Path) -> None:
    tok = build_tokenizer({name: (demo_model_dir / name).read_bytes() for name in TOKENIZER_FILES
                           if (demo_model_dir / name).exists()})
    short = tok.count("chat", {"messages": [{"role": "user", "content": "hi"}]})
    longer = tok.count("chat", {"messages": [{"role": "user", "content": "hi " * 100}]})
    assert short is not None and longer is not None and 5 < short < longer
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(demo_model_dir / "tokenizer.json"))
    assert tok.count("completions", {"prompt": "hello world"}) == len(raw.encode("hello world").ids)
    assert tok.count("completions", {"prompt": [1, 2, 3]}) == 3
