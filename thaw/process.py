"""Tie a process's life to its parent's (Linux ``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


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
