"""Child processes that lead their own process group: started, signalled and stopped
with their group, and (``tied``) dying with this process (Linux ``PR_SET_PDEATHSIG``).

Every service, worker, engine host, store and benchmark peer Thaw starts goes through
here, so one rule holds everywhere: a child's own children go with it, and nothing
outlives the process that started it by accident.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1
# What a stopped group is given after SIGKILL to be reaped.
_REAP_S = 10.0


def die_with_parent(sig: int = signal.SIGTERM, expected_parent: int | None = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits.

    ``expected_parent`` closes the race where the parent died before this call: if
    the parent is already someone else, the signal is sent to ourselves now.
    Returns False where prctl is unavailable (not Linux).
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)
    return True


def _tie() -> Callable[[], object]:
    parent = os.getpid()
    return lambda: die_with_parent(signal.SIGTERM, expected_parent=parent)


def spawn_group(cmd: Sequence[str], log: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None,
                tied: bool = True) -> subprocess.Popen[bytes]:
    """``cmd`` leading a process group of its own, stdout and stderr appended to ``log``,
    stdin from /dev/null; with ``tied``, SIGTERMed if this process dies first."""
    with open(log, "ab") as logf:
        return subprocess.Popen(list(cmd), stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True, preexec_fn=_tie() if tied else None)


async def spawn_group_async(cmd: Sequence[str], log: Path | None, *, env: dict[str, str] | None = None,
                            cwd: Path | None = None, tied: bool = True,
                            limit: int = 2**16) -> asyncio.subprocess.Process:
    """:func:`spawn_group` on the event loop. ``log`` None: stdin, stdout and stderr are
    pipes (lines up to ``limit`` bytes) for the caller to talk over."""
    tie = _tie() if tied else None
    if log is None:
        pipe = asyncio.subprocess.PIPE
        return await asyncio.create_subprocess_exec(*cmd, stdin=pipe, stdout=pipe, stderr=pipe, env=env, cwd=cwd,
                                                    start_new_session=True, preexec_fn=tie, limit=limit)
    # A local file open is fast; the child inherits the descriptor.
    logf = open(log, "ab")  # noqa: SIM115, ASYNC230
    try:
        return await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=logf, stderr=logf, env=env, cwd=cwd,
            start_new_session=True, preexec_fn=tie)
    finally:
        logf.close()


def signal_group(pgid: int, sig: int) -> None:
    """``sig`` to every process of group ``pgid``; nothing if it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in group ``pgid``.

    Orphaned members are reparented to init, which may be slow to reap them (or not
    reap them at all in a container): zombies do not count.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def leader_gone(pid: int) -> bool:
    """Whether process ``pid`` has exited: no such process, or a zombie (an adopted
    leader is someone else's child, which this process cannot reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


# What a group is stopped through: a child (subprocess or asyncio), or the pid of a
# leader this process did not start (a worker adopted after a restart, a store found by
# its pid file), watched through /proc.
Leader = subprocess.Popen[bytes] | asyncio.subprocess.Process | int


def _pid(proc: Leader) -> int:
    return proc if isinstance(proc, int) else proc.pid


def _exited(proc: Leader) -> bool:
    if isinstance(proc, int):
        return leader_gone(proc)
    if isinstance(proc, subprocess.Popen):
        return proc.poll() is not None
    return proc.returncode is not None


def _term(proc: Leader, leader_only: bool) -> None:
    if leader_only:
        with contextlib.suppress(ProcessLookupError):
            os.kill(_pid(proc), signal.SIGTERM)
    else:
        signal_group(_pid(proc), signal.SIGTERM)


def _wait_exit(proc: subprocess.Popen[bytes] | int, timeout_s: float) -> bool:
    if isinstance(proc, subprocess.Popen):
        try:
            proc.wait(timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout_s
    while not _exited(proc):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


async def _wait_exit_async(proc: Leader, timeout_s: float) -> bool:
    if isinstance(proc, asyncio.subprocess.Process):
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
    deadline = time.monotonic() + timeout_s
    while not _exited(proc):  # nothing signals another's exit: poll it
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def stop_group(proc: subprocess.Popen[bytes] | int, grace_s: float, *, term_leader_only: bool = False) -> bool:
    """SIGTERM the group ``proc`` leads (``term_leader_only``: the leader alone, which
    stops its own children in order), wait up to ``grace_s`` for the leader to exit,
    then SIGKILL whatever is left of the group; whether the leader needed SIGKILL.
    ``grace_s`` 0 kills at once."""
    killed = False
    if not _exited(proc):
        if grace_s > 0:
            _term(proc, term_leader_only)
        killed = not (grace_s > 0 and _wait_exit(proc, grace_s))
    signal_group(_pid(proc), signal.SIGKILL)
    _wait_exit(proc, _REAP_S)
    return killed


async def stop_group_async(proc: Leader, grace_s: float, *, term_leader_only: bool = False,
                           until_empty: bool = False) -> bool:
    """:func:`stop_group` on the event loop. ``until_empty``: the grace also waits for
    the rest of the group (an engine's own children) to leave, not the leader alone."""
    pid = _pid(proc)
    if _exited(proc) and not await asyncio.to_thread(group_alive, pid):
        return False  # nothing left: the pid (and group id) may be another's by now
    killed = False
    if not _exited(proc):
        deadline = time.monotonic() + grace_s
        if grace_s > 0:
            _term(proc, term_leader_only)
        killed = not (grace_s > 0 and await _wait_exit_async(proc, grace_s))
        while until_empty and not killed and await asyncio.to_thread(group_alive, pid):  # noqa: ASYNC110
            if time.monotonic() >= deadline:
                killed = True
                break
            await asyncio.sleep(0.05)
    signal_group(pid, signal.SIGKILL)
    await _wait_exit_async(proc, _REAP_S)
    return killed
