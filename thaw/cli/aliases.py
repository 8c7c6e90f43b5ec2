"""Old spellings of commands and flags, kept for one release as hidden aliases: they
work as before, are absent from --help and docs/reference/cli.md, and say their new
name in one line on stderr."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

Handler = Callable[[argparse.Namespace], int]


def deprecation_line(old: str, new: str) -> str:
    """``old`` and ``new`` as the user types them: 'thaw tenants add' or --rpm."""
    return f"thaw: {old} is now {new}; the old name goes in the next release"


def warn(old: str, new: str) -> None:
    print(deprecation_line(old, new), file=sys.stderr)


def renamed_command(old: str, new: str, fn: Handler) -> Handler:
    """``fn``, saying first that command ``old`` is now ``new`` (both without `thaw `)."""

    def run(args: argparse.Namespace) -> int:
        warn(f"'thaw {old}'", f"'thaw {new}'")
        return fn(args)

    return run


class _PublicChoices(dict):  # type: ignore[type-arg]
    """A group's subcommands: all of them parse, the hidden ones are not iterated (so
    argparse's "invalid choice" message names only the public ones)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hidden: set[str] = set()

    def __iter__(self):  # type: ignore[no-untyped-def]
        return (k for k in list(super().__iter__()) if k not in self.hidden)


def add_hidden_parser(sub: argparse._SubParsersAction, name: str,  # type: ignore[type-arg]
                      **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand that parses but is not listed: argparse lists only the choices
    added with ``help`` (and every `thaw` group's metavar names no choices); the
    "invalid choice" message leaves it out too."""
    if not isinstance(sub.choices, _PublicChoices):
        sub.choices = sub._name_parser_map = _PublicChoices(sub._name_parser_map)
    p = sub.add_parser(name, **kwargs)
    sub.choices.hidden.add(name)
    return p


def is_hidden(sub: argparse._SubParsersAction, name: str) -> bool:  # type: ignore[type-arg]
    return isinstance(sub.choices, _PublicChoices) and name in sub.choices.hidden


class _RenamedFlag(argparse.Action):
    """Stores like the new flag (``dest`` is the new one's) after saying the new name."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "", store_true: bool = False,
                 **kwargs: Any) -> None:
        self.new = new
        self.store_true = store_true
        super().__init__(option_strings, dest, nargs=0 if store_true else None, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        warn(str(option_string), self.new)
        setattr(namespace, self.dest, True if self.store_true else values)
        # The old spelling given satisfies a required new flag: argparse checks only
        # whether the new flag's own action was seen.
        new = parser._option_string_actions.get(self.new)
        if new is not None:
            new.required = False


def add_renamed_flag(p: argparse.ArgumentParser, old: str, new: str, dest: str | None = None,
                     **kwargs: Any) -> None:
    """``old`` (e.g. --rpm) as a hidden alias of the flag ``new`` (e.g.
    --requests-per-minute): give it the same type and ``dest`` (default: the new
    flag's); a ``store_true`` flag takes ``store_true=True``. The default is the new
    flag's."""
    dest = dest or new.lstrip("-").replace("-", "_")
    p.add_argument(old, dest=dest, action=_RenamedFlag, new=new, help=argparse.SUPPRESS,
                   default=argparse.SUPPRESS, **kwargs)
