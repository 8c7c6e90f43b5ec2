"""`loadtests/procs.py`: the benchmarks' CPU per process tree counts descendants, and its
split tells a process's main thread from its other threads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil

from loadtests.procs import cpu_split, tree_cpu_s
from tests.waiting import wait_until

# A grandchild that burns 0.5 s of CPU, then waits to be killed.
BURN = textwrap.dedent(
    """
    import time
    t = time.process_time()
    while time.process_time() - t < 0.5:
        pass
    time.sleep(60)
    """
)


def test_the_cpu_of_a_tree_counts_what_its_descendants_burnt() -> None:
    launcher = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BURN!r}])"
    parent = subprocess.Popen([sys.executable, "-c", launcher], start_new_session=True)
    try:
        total = wait_until("the grandchild's CPU counted", lambda: (c := tree_cpu_s(parent.pid)) >= 0.45 and c,
                           timeout_s=30)
        own = psutil.Process(parent.pid).cpu_times()
        assert total - (own.user + own.system) >= 0.4, (total, own)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


# A main thread and a second thread that each burn about 0.4 s of CPU in turn.
TWO_THREADS = textwrap.dedent(
    """
    import threading, time
    def burn():
        t = time.thread_time()
        while time.thread_time() - t < 0.4:
            pass
    burn()
    threading.Thread(target=burn).start()
    time.sleep(60)
    """
)


def test_the_split_tells_the_main_thread_from_the_others() -> None:
    proc = subprocess.Popen([sys.executable, "-c", TWO_THREADS], start_new_session=True)
    try:
        start = {"total_s": 0.0}
        split = wait_until("both threads' CPU counted",
                           lambda: (s := cpu_split([proc.pid], since=start))["other_threads_s"] >= 0.35 and s,
                           timeout_s=30)
        assert split["main_thread_s"] >= 0.35, split
        assert abs(split["user_s"] + split["system_s"] - split["total_s"]) < 1e-9, split
        assert abs(split["main_thread_s"] + split["other_threads_s"] - split["total_s"]) < 1e-9, split
        later = cpu_split([proc.pid], since=cpu_split([proc.pid]))
        assert later["total_s"] < 0.1, later  # both threads have stopped burning
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
