"""The docs hold together: guides stay short, the README lists every guide and
reference page, and every relative link (and #anchor) in README.md and docs/ leads
somewhere that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MAX_GUIDE_LINES = 400

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`+[^`\n]*`+")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.I)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced blocks and inline code, where a link is only an example."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped (letters,
    digits, spaces, '-' and '_' stay), spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).lower()
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a page has: one per heading (repeats get -1, -2, ...) and <a id>s."""
    text = FENCE.sub("", page.read_text())
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text()))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]  # http:, https:, mailto:


def test_slugs_follow_github() -> None:
    # Examples as GitHub renders them (docs/BENCHMARKS.md's headings).
    assert slug("CPU: what the activator adds, vllm-router as a peer (`thaw bench activator`)") == \
        "cpu-what-the-activator-adds-vllm-router-as-a-peer-thaw-bench-activator"
    assert slug("The smoothing's width: n^-0.35, not Silverman's n^-0.2 (2026-12-05, later)") == \
        "the-smoothings-width-n-035-not-silvermans-n-02-2026-12-05-later"
    assert slug("Where the streamer's time goes on a GPU (`loadtests/gpu/stream_breakdown.py`)") == \
        "where-the-streamers-time-goes-on-a-gpu-loadtestsgpustream_breakdownpy"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert broken == [], f"{page.relative_to(ROOT)} has broken links"


def test_guides_stay_short() -> None:
    long = {str(p.relative_to(ROOT)): n for p in sorted((DOCS / "guide").glob("*.md"))
            if (n := len(p.read_text().splitlines())) > MAX_GUIDE_LINES}
    assert long == {}, f"a guide is a task on one page: split these (at most {MAX_GUIDE_LINES} lines)"


def test_readme_lists_every_guide_and_reference() -> None:
    listed = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")}
    wanted = sorted([*(DOCS / "guide").glob("*.md"), *(DOCS / "reference").glob("*.md")])
    assert len(wanted) >= 9  # eight guides, the config reference at least
    missing = [str(p.relative_to(ROOT)) for p in wanted if p.resolve() not in listed]
    assert missing == [], "add these to the README's Docs list"
