"""docs/reference/cli.md is generated from the `thaw` parser and kept in step with it;
every public command says what it needs running; the old names stay out of sight."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from thaw.cli import reference
from thaw.cli.aliases import deprecation_line
from thaw.cli.common import CONTROLLER_HELP, NEEDS, NEEDS_CONTROLLER
from thaw.cli.main import build_parser, main


def test_the_reference_is_up_to_date() -> None:
    page = reference.REFERENCE
    assert page.exists() and page.read_text() == reference.render(), (
        f"{page.relative_to(reference.ROOT)} is out of date: run `{reference.COMMAND}`")


def test_check_exits_1_when_the_page_differs(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(reference, "render", lambda: "something else\n")
    assert reference.main(["--check"]) == 1
    assert reference.COMMAND in capsys.readouterr().err


def leaves() -> list[tuple[reference.Command, str | None]]:
    """Every public command that runs something, with what it needs: its own ``needs``
    or, for a subcommand of a command (`thaw simulate gen`), its parent's."""
    out = []
    inherited: dict[str, str | None] = {}
    for c in reference.commands(build_parser()):
        parent = c.path.rpartition(" ")[0]
        needs = c.parser.get_default("needs") or inherited.get(parent)
        inherited[c.path] = needs
        if not c.is_group:
            out.append((c, needs))
    return out


def controller_option(parser: argparse.ArgumentParser) -> argparse.Action | None:
    return next((a for a in parser._actions if "--controller" in a.option_strings), None)


def test_every_command_says_what_it_needs() -> None:
    undeclared = [c.path for c, needs in leaves() if needs not in NEEDS]
    assert undeclared == [], "give these commands needs= (thaw.cli.common.NEEDS) where they are added"
    unsaid = [c.path for c, needs in leaves() if needs
              and not all(sentence in (c.parser.description or "") for sentence in NEEDS[needs])]
    assert unsaid == []


# Commands (as `thaw` is followed) without --json, and why: the services run until stopped and log; the tools
# write their reports as files (JSON among them) or one value.
NO_JSON = {
    **dict.fromkeys(["up", "controller", "activator", "worker"], "a service"),
    **dict.fromkeys(["bench", "load", "simulate", "pool recommend", "demo-model"], "a tool writing files"),
    "config hash-key": "prints one hash",
}


def test_every_command_that_lists_or_changes_something_takes_json() -> None:
    missing = [c.path for c, _ in leaves()
               if not any(c.path == k or c.path.startswith(k + " ") for k in NO_JSON)
               and not any("--json" in a.option_strings for a in c.parser._actions)]
    assert missing == [], "give these commands --json (thaw.cli.common.add_json_argument)"


def test_a_command_that_calls_the_controller_says_so_and_takes_controller() -> None:
    for c, needs in leaves():
        option = controller_option(c.parser)
        if option is not None and option.help == CONTROLLER_HELP:
            assert NEEDS_CONTROLLER in (c.parser.description or ""), c.path
            assert option.metavar == "URL[,URL]", c.path
        if needs and "controller" in needs and c.path != "activator":
            # The activator's --controller is the one it follows, with a default of its own.
            assert option is not None and option.help == CONTROLLER_HELP, c.path


def test_every_option_of_a_controller_command_has_help() -> None:
    bare = [f"{c.path} {'/'.join(a.option_strings) or a.dest}" for c, needs in leaves() if needs != "local"
            for a in c.parser._actions
            if not a.help and a.option_strings and a.dest != "help"]
    assert bare == []


@pytest.mark.parametrize("old", ["thaw tenants add", "thaw tenants revoke", "thaw models describe"])
def test_old_names_are_not_in_help_nor_in_the_reference(old: str, capsys: pytest.CaptureFixture[str]) -> None:
    *group, name = old.split()[1:]
    with pytest.raises(SystemExit):
        main([*group, "--help"])
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[3:] if line.startswith("    ")]
    assert name not in listed
    assert f"`{old}`" not in reference.render() and f"`{old} " not in reference.render()
    # Not offered as a choice either.
    with pytest.raises(SystemExit):
        main([*group, "bogus"])
    assert f"'{name}'" not in capsys.readouterr().err


# (--out and --models stay, where they name a file or a count.)
@pytest.mark.parametrize("old", ["--rpm", "--tpm", "--price-prompt", "--idle-grace", "--usd-per-hour",
                                 "--total-usd-per-hour", "--controller-url", "--output"])
def test_old_flags_are_not_in_the_reference(old: str) -> None:
    assert f"`{old} " not in reference.render() and f"`{old}`" not in reference.render()


@pytest.mark.parametrize(("argv", "old", "new", "dest", "value"), [
    (["tenants", "create", "t", "--tpm", "5"], "--tpm", "--tokens-per-minute", "tokens_per_minute", 5),
    (["tenants", "create", "t", "--concurrency", "2"], "--concurrency", "--max-concurrent-requests",
     "max_concurrent_requests", 2),
    (["tenants", "create", "t", "--models", "a,b"], "--models", "--allowed-models", "allowed_models", ["a", "b"]),
    (["models", "update", "m", "--price-completion", "4"], "--price-completion", "--completion-usd-per-mtok",
     "completion_usd_per_mtok", 4.0),
    (["pool", "budget", "set", "s", "--usd-per-hour", "3"], "--usd-per-hour", "--budget-usd-per-hour",
     "usd_per_hour", 3.0),
    (["pool", "recommend", "--ttft-p99-s", "1", "--idle-grace", "30,60"], "--idle-grace", "--idle-grace-s",
     "idle_grace", (30.0, 60.0)),
    (["simulate", "--out", "d"], "--out", "--out-dir", "out", Path("d")),
    (["monitoring", "write", "--out", "d"], "--out", "--out-dir", "out", "d"),
    (["load", "run", "--trace", "t", "--base-url", "u", "--api-key", "k", "--out", "d"], "--out", "--out-dir",
     "out", "d"),
    (["load", "run", "--trace", "t", "--base-url", "u", "--api-key", "k", "--out-dir", "d", "--controller-url",
      "http://c"], "--controller-url", "--controller", "controller_url", "http://c"),
    (["aws", "config", "--stack", "s", "--output", "f.yaml"], "--output", "--out", "out", "f.yaml"),
])
def test_old_flags_still_parse_and_say_the_new_name(argv: list[str], old: str, new: str, dest: str, value: object,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    assert capsys.readouterr().err.splitlines() == [deprecation_line(old, new)]
