"""`thaw bench conversations`: the report's arithmetic (the run itself needs real engines:
its figures are in docs/BENCHMARKS.md)."""

from __future__ import annotations

import random
from typing import Any

from loadtests import bench_conversations as bench


def turn(n: int, replica: str, prompt: int, cached: int, ttft: float, sent: int = 100) -> dict[str, Any]:
    return {"turn": n, "ttft_s": ttft, "prompt_tokens": prompt, "cached_tokens": cached, "replica": replica,
            "sent_bytes": sent}


def test_only_continued_turns_count_and_ratios_are_against_round_robin() -> None:
    rr = [turn(0, "a", 300, 0, 9.0), turn(1, "b", 340, 0, 0.4, 2000), turn(2, "a", 380, 320, 0.2, 2200)]
    thaw = [turn(0, "a", 300, 0, 9.0), turn(1, "a", 340, 300, 0.2, 50), turn(2, "a", 380, 336, 0.2, 50)]
    runs = [{"mode": "round_robin", "conversations": [rr]}, {"mode": "thaw_chat", "conversations": [rr]},
            {"mode": "thaw_responses", "conversations": [thaw]}]
    report = bench.summarize(runs)
    base, mine = report["modes"]["round_robin"], report["modes"]["thaw_responses"]
    # The first turn (nothing to continue) is left out: its 9 s TTFT is in no percentile.
    assert base["continued_turns"] == 2 and base["ttft_p90_s"] == 0.4
    assert base["cached_share"] == round(320 / 720, 4) and base["same_replica_share"] == 0.0
    assert mine["cached_share"] == round(636 / 720, 4) and mine["same_replica_share"] == 1.0
    assert report["ratios"]["thaw_responses_sent_bytes_mean_vs_round_robin"] == round(50 / 2100, 3)
    assert report["ratios"]["thaw_chat_ttft_p50_s_vs_round_robin"] == 1.0


def test_each_conversation_opens_with_a_document_of_its_own() -> None:
    a, b = (bench.opening(random.Random(f"7-0-thaw_chat-{i}")) for i in (0, 1))
    assert a != b and len(a.split()) == bench.OPENING_WORDS + 3
