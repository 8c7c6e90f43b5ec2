"""The running `thaw up` stacks (thaw.cli.stack), and the config a command takes from
one when run outside the checkout (thaw.cli.common._load)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from thaw.cli import stack, up
from thaw.cli.common import CliError, _load
from thaw.config import DEFAULT_CONFIG_PATH, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "thaw.yaml"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A directory laid out as the checkout: examples/thaw.yaml, its data_dir relative (.thaw)."""
    root = tmp_path / "checkout"
    (root / DEFAULT_CONFIG_PATH).parent.mkdir(parents=True)
    (root / DEFAULT_CONFIG_PATH).write_text(EXAMPLE.read_text())
    assert yaml.safe_load(EXAMPLE.read_text())["data_dir"] == ".thaw"
    return root


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current directory: one without the default config."""
    path = tmp_path / "elsewhere"
    path.mkdir()
    monkeypatch.chdir(path)
    monkeypatch.delenv("THAW_CONFIG", raising=False)
    return path


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """Another live process, started after this one."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"config": None, "log_level": None, **kw})


def test_a_record_is_a_small_file_under_xdg_state_home(state_home: Path, checkout: Path) -> None:
    recorded = stack.record(checkout / DEFAULT_CONFIG_PATH, checkout, checkout / ".thaw")
    path = state_home / "thaw" / "up" / f"{os.getpid()}.json"
    assert json.loads(path.read_text()) == {
        "config": str(checkout / DEFAULT_CONFIG_PATH), "base_dir": str(checkout), "data_dir": str(checkout / ".thaw"),
        "pid": os.getpid(), "started_at": recorded.started_at}
    assert stack.latest() == recorded and stack.using(checkout / ".thaw") == recorded
    assert stack.using(checkout / "other") is None
    stack.forget()
    assert not path.exists() and stack.latest() is None


def test_without_xdg_state_home_records_go_under_the_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_STATE_HOME")
    assert stack.state_dir() == tmp_path / ".local" / "state" / "thaw"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")  # not absolute: ignored, as XDG says
    assert stack.state_dir() == tmp_path / ".local" / "state" / "thaw"


def test_the_stack_started_last_wins_and_a_gone_one_is_forgotten(
        state_home: Path, checkout: Path, child: subprocess.Popen[bytes]) -> None:
    mine = stack.record(checkout / DEFAULT_CONFIG_PATH, checkout, checkout / ".thaw")
    theirs = stack.record(checkout / DEFAULT_CONFIG_PATH, checkout, checkout / ".other", pid=child.pid)
    assert theirs.started_at >= mine.started_at
    assert stack.running() == [theirs, mine] and stack.latest() == theirs
    child.kill()
    child.wait()
    assert stack.running() == [mine]
    assert not (state_home / "thaw" / "up" / f"{child.pid}.json").exists()
    # A pid another process took since: not that stack.
    reused = stack.records_dir() / "1.json"
    reused.write_text(stack.Stack(config=mine.config, base_dir=checkout, data_dir=checkout / ".x", pid=1,
                                  started_at=1.0).to_json())
    assert stack.running() == [mine] and not reused.exists()


def test_a_command_run_elsewhere_takes_the_running_stacks_config(
        state_home: Path, checkout: Path, elsewhere: Path) -> None:
    with pytest.raises(CliError) as err:
        _load(args())
    assert err.value.code == 2
    assert "no `thaw up` of yours is running" in str(err.value)
    assert "--config FILE or THAW_CONFIG=FILE" in str(err.value)
    stack.record(checkout / DEFAULT_CONFIG_PATH, checkout, checkout / ".thaw")
    try:
        # Its relative data_dir as `thaw up` resolved it: from the checkout, not from here.
        assert _load(args()).data_dir == checkout / ".thaw"
        # Said otherwise: that config, from here.
        assert _load(args(config=str(checkout / DEFAULT_CONFIG_PATH))).data_dir == elsewhere / ".thaw"
        # The services (`thaw up`, `thaw controller`, ...) never take another's config.
        with pytest.raises(CliError) as err:
            _load(args(), running_stack=False)
        assert "--config FILE or THAW_CONFIG=FILE" in str(err.value) and "no `thaw up`" not in str(err.value)
    finally:
        stack.forget()


def test_the_default_config_here_comes_before_the_running_stack(
        state_home: Path, checkout: Path, elsewhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack.record(checkout / DEFAULT_CONFIG_PATH, checkout, checkout / ".thaw")
    try:
        (elsewhere / DEFAULT_CONFIG_PATH).parent.mkdir(parents=True)
        (elsewhere / DEFAULT_CONFIG_PATH).write_text(EXAMPLE.read_text())
        assert _load(args()).data_dir == elsewhere / ".thaw"
        monkeypatch.setenv("THAW_CONFIG", str(checkout / DEFAULT_CONFIG_PATH))
        assert _load(args()).data_dir == elsewhere / ".thaw"  # THAW_CONFIG, read from here
    finally:
        stack.forget()


def test_thaw_up_records_its_stack_while_it_runs(
        state_home: Path, checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(checkout)
    cfg = load_config(DEFAULT_CONFIG_PATH)
    seen: list[stack.Stack | None] = []

    def running(cfg_: object, config_file: Path, port: int | None) -> int:
        seen.append(stack.latest())
        raise RuntimeError("the services failed")

    monkeypatch.setattr(up, "_run_stack", running)
    with pytest.raises(RuntimeError):
        up.run_up(cfg, DEFAULT_CONFIG_PATH)
    assert seen[0] is not None and seen[0].pid == os.getpid()
    assert (seen[0].config, seen[0].base_dir, seen[0].data_dir) == (
        checkout / DEFAULT_CONFIG_PATH, checkout, checkout / ".thaw")
    assert stack.latest() is None and list(stack.records_dir().iterdir()) == []
