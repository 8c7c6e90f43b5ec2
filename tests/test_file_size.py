"""A product file stays small enough to read, or says why it is one piece: over 600
lines, its module docstring has a paragraph starting ``One piece:``."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("thaw", "activator", "warm_pool", "worker", "weight_streaming", "snapshotter", "simulator", "loadtests")
MAX_LINES = 600


def test_long_files_say_why_they_are_one_piece() -> None:
    unexplained = {}
    for package in PACKAGES:
        for p in (ROOT / package).rglob("*.py"):
            text = p.read_text()
            n = text.count("\n")
            if n > MAX_LINES and "One piece:" not in "\n".join(text.splitlines()[:80]):
                unexplained[str(p.relative_to(ROOT))] = n
    assert unexplained == {}, "split these, or say why each is one piece (a 'One piece:' paragraph at its top)"
