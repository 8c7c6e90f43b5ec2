"""The agent's settings, resolved once from the command line."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class AgentSettings:
    worker_id: str
    shape: str
    port: int
    data_dir: Path
    host: str = "127.0.0.1"
    log_level: str = "info"
    # Interpreter for the engine host (the agent's own by default).
    python: str = sys.executable
    # How often the engine's /health is polled while loading.
    ready_poll_s: float = 0.2
    # An engine not answering /health this long after the launch has failed.
    load_timeout_s: float = 600.0
    # How often the engine's /metrics is read while ready (for in_flight).
    in_flight_poll_s: float = 1.0
    # How often /metrics is read while draining; two zero readings in a row end the drain.
    drain_poll_s: float = 0.3
    # SIGTERM to the engine host's group, then SIGKILL after this.
    host_stop_grace_s: float = 10.0
    # Longest wait before restarting an engine host that keeps dying before "imported".
    host_restart_backoff_max_s: float = 30.0
