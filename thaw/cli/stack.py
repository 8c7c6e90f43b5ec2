"""The running `thaw up` stacks of this user, so that `thaw` works from any directory.

`thaw up` records itself in ``$XDG_STATE_HOME/thaw/up/<pid>.json`` (XDG's default:
``~/.local/state/thaw/up/``) while it runs: its config file (absolute), the directory
that config's relative paths resolve from (where `thaw up` ran), its data directory,
its pid and its process's start time. A command given no --config nor THAW_CONFIG, run
where the default config is absent, takes the config of the stack started last that
still runs (:func:`latest`); `thaw store down` asks whether a stack uses the store
(:func:`using`). A record whose process is gone (or whose pid another process took
since: the start time differs) is not a stack: it is ignored and removed.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from thaw.private_files import write_private


@dataclass(frozen=True)
class Stack:
    """One `thaw up`, as it recorded itself."""

    config: Path  # its config file, absolute
    base_dir: Path  # where that config's relative paths (data_dir) resolve from
    data_dir: Path  # its data directory, absolute
    pid: int
    started_at: float  # the process's start time (psutil's create_time): a reused pid differs

    def to_json(self) -> str:
        return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> Stack:
        d = json.loads(text)
        return cls(config=Path(d["config"]), base_dir=Path(d["base_dir"]), data_dir=Path(d["data_dir"]),
                   pid=int(d["pid"]), started_at=float(d["started_at"]))


def state_dir() -> Path:
    """``$XDG_STATE_HOME/thaw``, else ``~/.local/state/thaw`` (a relative XDG_STATE_HOME
    is ignored, as the XDG spec says)."""
    xdg = os.environ.get("XDG_STATE_HOME", "")
    root = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return root / "thaw"


def records_dir() -> Path:
    return state_dir() / "up"


def _started_at(pid: int) -> float | None:
    try:
        p = psutil.Process(pid)
        return None if p.status() == psutil.STATUS_ZOMBIE else p.create_time()
    except psutil.Error:
        return None


def alive(stack: Stack) -> bool:
    """Its process still runs (the same process: not another one given its pid since)."""
    started = _started_at(stack.pid)
    return started is not None and abs(started - stack.started_at) < 0.01


def record(config: Path, base_dir: Path, data_dir: Path, pid: int | None = None) -> Stack:
    """Record the stack of process ``pid`` (default: this one) until :func:`forget`."""
    pid = os.getpid() if pid is None else pid
    started = _started_at(pid)
    if started is None:
        raise ProcessLookupError(f"no process {pid}")
    stack = Stack(config=config.resolve(), base_dir=base_dir.resolve(), data_dir=data_dir.resolve(), pid=pid,
                  started_at=started)
    write_private(records_dir() / f"{pid}.json", stack.to_json().encode())
    return stack


def forget(pid: int | None = None) -> None:
    (records_dir() / f"{os.getpid() if pid is None else pid}.json").unlink(missing_ok=True)


def running() -> list[Stack]:
    """The stacks that run now, the one started last first; records of the others are removed."""
    out = []
    for path in sorted(records_dir().glob("*.json")):
        try:
            stack = Stack.from_json(path.read_text())
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written (renamed into place whole), or not ours: left alone
        if alive(stack):
            out.append(stack)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return sorted(out, key=lambda s: s.started_at, reverse=True)


def latest() -> Stack | None:
    """The running stack this user started last, if any."""
    stacks = running()
    return stacks[0] if stacks else None


def using(data_dir: Path) -> Stack | None:
    """A running stack whose data directory is ``data_dir`` (so its store, its state)."""
    target = data_dir.resolve()
    return next((s for s in running() if s.data_dir == target), None)
