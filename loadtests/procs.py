"""Processes a benchmark starts: pinned to cores, waited for, stopped with their group
(``thaw.process``: each leads its own group and dies with the benchmark even if the
benchmark is killed before it can stop it; vllm-router renames itself, so no pkill by
name would find it)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from thaw.process import spawn_group, stop_group


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


@contextmanager
def serving(cmd: list[str], log: Path, ready_url: str, timeout_s: float = 30.0,
            stop_grace_s: float = 10.0) -> Iterator[subprocess.Popen[bytes]]:
    """A server process, yielded once ``ready_url`` answers below 500; stopped on the way out."""
    proc = spawn_group(cmd, log)
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
        stop_group(proc, stop_grace_s)


def cpu_split(pids: list[int], since: dict[str, float] | None = None) -> dict[str, float]:
    """CPU seconds of the processes ``pids`` and their live descendants (minus ``since``,
    an earlier call's answer): ``total_s``, ``user_s`` and ``system_s``, and the time of
    the processes' own main threads (``main_thread_s``: an activator's event loop)
    against all their other threads and descendants (``other_threads_s``). Each is
    counted in clock ticks, the process's and its main thread's read a moment apart: a
    difference of two calls can be a tick off, ``other_threads_s`` of a short span a
    tick below zero."""
    import psutil

    out = {"total_s": 0.0, "user_s": 0.0, "system_s": 0.0, "main_thread_s": 0.0}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            for q in (p, *p.children(recursive=True)):
                t = q.cpu_times()
                out["user_s"] += t.user
                out["system_s"] += t.system
            out["main_thread_s"] += sum(t.user_time + t.system_time for t in p.threads() if t.id == pid)
        except psutil.Error:
            pass
    out["total_s"] = out["user_s"] + out["system_s"]
    out["other_threads_s"] = out["total_s"] - out["main_thread_s"]
    if since is not None:
        out = {k: v - since.get(k, 0.0) for k, v in out.items()}
    return out


def wait_for_files(paths: list[Path], timeout_s: float = 60.0) -> None:
    """Until every one of ``paths`` exists (a process's sign that it is up)."""
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            raise RuntimeError(f"not there after {timeout_s:.0f} s: {[str(p) for p in paths if not p.exists()]}")
        time.sleep(0.1)  # not a poll: a wait for other processes, bounded by the deadline


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants (0 once it is gone)."""
    return cpu_split([pid])["total_s"]
