"""The share of a trace's requests the activator would count exactly, through the real bound."""

from __future__ import annotations

import json
from pathlib import Path

from loadtests import prompt_count_share as share


def test_read_sizes_of_both_formats(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,20\n1,5000,7\n")
    (tmp_path / "b.jsonl").write_text('{"timestamp": 0, "input_length": 30, "output_length": 4, "hash_ids": []}\n')
    assert list(share.read_sizes(tmp_path / "a.csv")) == [(100, 20), (5000, 7)]
    assert list(share.read_sizes(tmp_path / "b.jsonl")) == [(30, 4)]


def test_small_prompts_are_bounded_and_those_over_the_context_counted(tmp_path: Path) -> None:
    bound = share.demo_bound()
    # 100 + 20 tokens at 4 bytes a token: ~400 bytes, well inside 4096. 5000 tokens: over it.
    row = share.shares([(100, 20), (5000, 7)], bound, 4096, 4.0)
    assert row["requests"] == 2 and row["exact_share"] == 0.5 and row["over_context_share"] == 0.5
    # 1,000 tokens fit 4096, but not their 4,000 bytes with the template's overhead: counted, not over.
    loose = share.shares([(1000, 100)], bound, 4096, 4.0)
    assert loose["over_context_share"] == 0.0 and loose["exact_share"] == 1.0
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"input_length": 10, "output_length": 5}\n')
    out = tmp_path / "r.json"
    assert share.main(["--trace", str(trace), "--context", "2048", "--bytes-per-token", "4", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["traces"]["t.jsonl"][0]["exact_share"] == 0.0
