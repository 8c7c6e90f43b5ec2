"""docs/reference/cli.md, generated from the `thaw` parser (:func:`thaw.cli.main.build_parser`).

Every public command with its description (what it needs running, where it finds its
token) and its arguments; the old names kept as hidden aliases are left out, as they
are from --help. Nothing depends on the terminal's width.

    python -m thaw.cli.reference --write   # regenerate the page
    python -m thaw.cli.reference --check   # exit 1 when the page is out of date
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference" / "cli.md"
COMMAND = "python -m thaw.cli.reference --write"

HEADER = f"""# `thaw` command reference

<!-- Generated from the parser in thaw/cli/ by `{COMMAND}`; do not edit by hand. -->

Every command of `thaw`, as `thaw COMMAND --help` shows it. Exit codes: 0 success, 1 the
operation failed, 2 bad usage or invalid input (config, model directory), 3 the store or
the controller is not reachable. A command that lists or changes something takes `--json`
(one JSON document on stdout); one that calls a controller takes `--controller URL[,URL]`.
"""


@dataclass(frozen=True)
class Command:
    """One parser in the tree: ``path`` as typed ("tenants keys add"), its one-line help."""

    path: str
    parser: argparse.ArgumentParser
    help: str

    @property
    def is_group(self) -> bool:
        return any(isinstance(a, argparse._SubParsersAction) for a in self.parser._actions)


def commands(parser: argparse.ArgumentParser, path: str = "") -> Iterator[Command]:
    """Every public command under ``parser``, depth first in the order --help lists them
    (a hidden alias has no help entry, so it is not listed)."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for choice in action._get_subactions():
            name = str(choice.dest)
            sub = action._name_parser_map[name]
            here = f"{path} {name}".strip()
            yield Command(here, sub, choice.help or "")
            yield from commands(sub, here)


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _spelling(action: argparse.Action) -> str:
    if not action.option_strings:
        return _metavar(action)
    takes = action.nargs != 0
    return ", ".join(f"{o} {_metavar(action)}" if takes else o for o in action.option_strings)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    # argparse's own expansion of %(default)s, %(choices)s and the like.
    text = parser._get_formatter()._expand_help(action)
    return " ".join(text.split()).replace("|", "\\|")


def arguments(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """The command's public arguments as (spelling, help); -h and hidden ones left out."""
    shown = [a for a in parser._actions
             if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction))
             and a.help != argparse.SUPPRESS]
    # Positionals first, as the usage line reads.
    shown.sort(key=lambda a: bool(a.option_strings))
    return [(f"`{_spelling(a)}`", _help(parser, a)) for a in shown]


def _anchor(path: str) -> str:
    return "thaw-" + path.replace(" ", "-")


def render() -> str:
    """The whole page."""
    from thaw.cli.main import build_parser

    found = list(commands(build_parser()))
    out = [HEADER, "## Commands\n"]
    for c in found:
        depth = c.path.count(" ")
        out.append(f"{'  ' * depth}- [`thaw {c.path}`](#{_anchor(c.path)}): {c.help}")
    out.append("")
    for c in found:
        out.append(f'<a id="{_anchor(c.path)}"></a>\n\n### `thaw {c.path}`\n')
        description = " ".join((c.parser.description or c.help).split())
        out.append(description + "\n")
        if c.is_group:
            subs = [s for s in found if s.path.startswith(c.path + " ") and s.path.count(" ") == c.path.count(" ") + 1]
            out.append("Subcommands: " + ", ".join(f"[`{s.path.split()[-1]}`](#{_anchor(s.path)})" for s in subs)
                       + "\n")
        rows = arguments(c.parser)
        if rows:
            out.append("| Argument | Meaning |\n|---|---|")
            out += [f"| {spelling} | {text} |" for spelling, text in rows]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    from thaw.generated_page import write_or_check

    return write_or_check(argv, prog="python -m thaw.cli.reference", description=(__doc__ or "").split("\n\n")[0], page=REFERENCE,
                          root=ROOT, render=render, command=COMMAND)


if __name__ == "__main__":
    sys.exit(main())
