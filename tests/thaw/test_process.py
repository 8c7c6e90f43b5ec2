"""Process groups (thaw/process.py), with real processes: a stopped group takes its
grandchildren with it, a leader that ignores SIGTERM is killed after the grace, a tied
child dies with its parent, and the async forms do the same."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.waiting import wait_until
from thaw.process import (
    group_alive,
    leader_gone,
    spawn_group,
    spawn_group_async,
    stop_group,
    stop_group_async,
)

# A leader that starts a grandchild in its own group, says so, then waits; with IGNORE
# set it ignores SIGTERM.
LEADER = """
import os, signal, subprocess, sys, time
if os.environ.get("IGNORE"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("child", child.pid, flush=True)
time.sleep(600)
"""


def grandchild(log: Path) -> int:
    # Unbuffered (PYTHONUNBUFFERED), print writes "child", the pid and the newline
    # separately: wait for the whole line.
    line = re.compile(r"^child (\d+)$", re.M)
    wait_until("the leader's line naming its child", lambda: line.search(log.read_text()) is not None, 30,
               detail=log.read_text)
    match = line.search(log.read_text())
    assert match is not None
    return int(match.group(1))


# Exited (or a zombie awaiting its reaper): thaw.process's own test of a leader.
gone = leader_gone


def test_a_stopped_group_takes_its_grandchildren(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    proc = spawn_group([sys.executable, "-c", LEADER], log)
    kid = grandchild(log)
    assert os.getpgid(kid) == proc.pid and group_alive(proc.pid)
    stop_group(proc, 5)
    assert proc.returncode is not None
    wait_until("the grandchild and the group gone", lambda: gone(kid) and not group_alive(proc.pid), 30)


def test_a_leader_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    proc = spawn_group([sys.executable, "-c", LEADER], log, env={**os.environ, "IGNORE": "1"})
    kid = grandchild(log)
    stop_group(proc, 0.5, term_leader_only=True)
    assert proc.returncode == -signal.SIGKILL
    wait_until("the grandchild gone", lambda: gone(kid), 30)


def test_a_tied_child_dies_with_its_parent(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    # A parent that starts a tied child, prints its pid, and exits at once.
    parent = (f"import sys; from pathlib import Path; from thaw.process import spawn_group; "
              f"p = spawn_group([sys.executable, '-c', 'import time; time.sleep(600)'], Path({str(log)!r})); "
              f"print(p.pid, flush=True)")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=60, check=True)
    pid = int(out.stdout.split()[0])
    wait_until("the tied child gone", lambda: gone(pid), 30)


async def test_the_async_forms_stop_a_group_and_say_whether_they_killed(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    proc = await spawn_group_async([sys.executable, "-c", LEADER], log)
    kid = grandchild(log)
    assert not await stop_group_async(proc, 10)
    wait_until("the grandchild gone", lambda: gone(kid), 30)
    stubborn_log = tmp_path / "stubborn.log"
    stubborn = await spawn_group_async([sys.executable, "-c", LEADER], stubborn_log,
                                       env={**os.environ, "IGNORE": "1"})
    kid = grandchild(stubborn_log)
    assert await stop_group_async(stubborn, 0.5, term_leader_only=True)
    wait_until("the grandchild gone", lambda: gone(kid), 30)
    piped = await spawn_group_async([sys.executable, "-c", "print(input().upper())"], None)
    out, _ = await piped.communicate(b"hello\n")
    assert out == b"HELLO\n"


# A leader that exits on SIGTERM, leaving a grandchild that ignores it.
DESERTER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('armed', flush=True); time.sleep(600)"],
    stdout=sys.stdout)
print("child", child.pid, flush=True)
time.sleep(600)
"""


async def test_until_empty_waits_for_the_whole_group_and_kills_what_stays(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    proc = await spawn_group_async([sys.executable, "-c", DESERTER], log)
    kid = grandchild(log)
    wait_until("the grandchild ignoring SIGTERM", lambda: "armed" in log.read_text(), 30)
    # The leader goes at once; the grace is spent on the grandchild, then it is killed.
    assert await stop_group_async(proc, 0.5, until_empty=True)
    assert proc.returncode == -signal.SIGTERM
    wait_until("the grandchild and the group gone", lambda: gone(kid) and not group_alive(proc.pid), 30)
    # A leader that already exited with nothing left of its group: nothing to do.
    assert not await stop_group_async(proc, 0.5, until_empty=True)


def test_a_leader_known_only_by_its_pid_is_stopped_through_proc(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    proc = spawn_group([sys.executable, "-c", LEADER], log, env={**os.environ, "IGNORE": "1"})
    kid = grandchild(log)
    assert not leader_gone(proc.pid)
    # As an adopted worker or a store found by its pid file: not waited on as a child.
    assert stop_group(proc.pid, 0.3, term_leader_only=True)
    wait_until("the leader and its grandchild gone", lambda: leader_gone(proc.pid) and gone(kid), 30)
    proc.wait(5)
    assert proc.returncode == -signal.SIGKILL


async def test_an_adopted_leader_is_stopped_on_the_event_loop(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    proc = spawn_group([sys.executable, "-c", LEADER], log)
    kid = grandchild(log)
    assert not await stop_group_async(proc.pid, 10)
    wait_until("the grandchild gone", lambda: gone(kid), 30)
    proc.wait(5)
    assert proc.returncode == -signal.SIGTERM
