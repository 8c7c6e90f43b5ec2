"""The agent's settings, resolved once from the command line."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

# See AgentSettings.engine_assets_dir.
ENGINE_ASSETS_DIR = Path("/tmp/thaw-vllm-assets")


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
    # Engine snapshots (compile caches in the store, see snapshotter): restored before a
    # compiled-mode launch, captured after one that found none.
    snapshots: bool = True
    # A restore still running after this is abandoned; the engine then compiles as usual.
    snapshot_restore_timeout_s: float = 300.0
    # Where vLLM mirrors a model's config and tokenizer files from the store. Shared by
    # every worker on the machine, on purpose: vLLM's compile-cache key includes the
    # model's local path, so a path under the worker's own data dir would make every
    # snapshot useless to any other worker (and to `thaw snapshot build`).
    engine_assets_dir: Path = ENGINE_ASSETS_DIR

    def engine_cache_root(self, model: str) -> Path:
        """The engine's VLLM_CACHE_ROOT for ``model``: one per model, so a snapshot holds
        that model's compile caches only."""
        return self.data_dir / "vllm-cache" / "models" / model

    @property
    def snapshot_work_dir(self) -> Path:
        """Downloads, staging and archives of snapshots (next to the caches: same file system)."""
        return self.data_dir / "snapshot-work"
