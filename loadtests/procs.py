"""Processes a benchmark starts: pinned to cores, waited for, stopped with their group.

Every process started here leads its own process group (so its children go with it)
and dies with the benchmark even if the benchmark is killed before it can stop it
(``PR_SET_PDEATHSIG``; vllm-router renames itself, so no pkill by name finds it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from thaw.process import die_with_parent


def tail(path: Path, chars: int = 1500) -> str:
    """The end of a log file, for an error message (the work dir may be gone later)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return f"(no log at {path})"


def pinned(cmd: list[str], cores: set[int] | None) -> list[str]:
    """``cmd`` under ``taskset`` on ``cores`` (as it is with no cores or no taskset)."""
    if cores is None or shutil.which("taskset") is None:
        return cmd
    return ["taskset", "-c", ",".join(map(str, sorted(cores))), *cmd]


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``cmd`` in a process group of its own, output to ``log``, tied to this process."""
    parent = os.getpid()
    with open(log, "wb") as logf:
        return subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=lambda: die_with_parent(signal.SIGTERM, expected_parent=parent),
        )


def kill_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the process group ``proc`` leads, SIGKILL whatever is left after ``grace_s``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


@contextmanager
def serving(cmd: list[str], log: Path, ready_url: str, timeout_s: float = 30.0,
            stop_grace_s: float = 10.0) -> Iterator[subprocess.Popen[bytes]]:
    """A server process, yielded once ``ready_url`` answers below 500; stopped on the way out."""
    proc = start(cmd, log)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{' '.join(cmd)} exited ({proc.returncode}): {tail(log)}")
            try:
                if httpx.get(ready_url, timeout=1.0).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{' '.join(cmd)} not ready after {timeout_s:.0f} s: {tail(log)}")
            time.sleep(0.2)
        yield proc
    finally:
        kill_group(proc, stop_grace_s)
