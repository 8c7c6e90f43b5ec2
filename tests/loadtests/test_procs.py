"""`loadtests/procs.py::tree_cpu_s` (the benchmarks' CPU per process tree) counts descendants."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil

from loadtests.procs import tree_cpu_s
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
