"""A page of docs/ made from the code (`python -m MODULE --write`), and its check that it
is up to date (``--check``, which the tests run): one main for every such page."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def write_or_check(argv: list[str] | None, *, prog: str, description: str, page: Path, root: Path,
                   render: Callable[[], str], command: str) -> int:
    """``--write``: ``page`` from ``render()``; ``--check``: exit 1 (naming ``command``)
    when it differs."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", action="store_true", help=f"write {page.relative_to(root)}")
    what.add_argument("--check", action="store_true", help="exit 1 when the page is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(text)
        print(f"wrote {page.relative_to(root)}")
        return 0
    if not page.exists() or page.read_text() != text:
        print(f"{page.relative_to(root)} is out of date: run `{command}`", file=sys.stderr)
        return 1
    return 0
