"""The agent's settings, resolved once from the command line."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from thaw.config import TelemetryConfig
from thaw.objstore import S3Endpoint

# See AgentSettings.engine_assets_dir.
ENGINE_ASSETS_DIR = Path("/tmp/thaw-vllm-assets")


@dataclass(frozen=True)
class AgentSettings:
    worker_id: str
    shape: str
    port: int
    data_dir: Path
    # How this worker reaches the store (its own credentials: see thaw.objstore.worker_endpoint).
    store: S3Endpoint
    # The provider's id of this machine; heartbeats carry it (the controller matches it).
    instance_id: str = ""
    host: str = "127.0.0.1"
    # The address others reach this worker (and its engine) at; None: ``host``.
    advertise_host: str | None = None
    log_level: str = "info"
    # The controller to heartbeat to (None: no heartbeats, e.g. `thaw snapshot build`).
    controller_url: str | None = None
    # The cluster token: the control API requires it, heartbeats carry it. Never in a repr.
    token: str | None = field(default=None, repr=False)
    heartbeat_interval_s: float = 2.0
    # Exit when the controller has accepted no heartbeat for this long (local workers,
    # so a controller killed for good leaves no process behind); None: never.
    exit_when_orphaned_s: float | None = None
    # Interpreter for the engine host (the agent's own by default).
    python: str = sys.executable
    # Libraries the engine host (and the engine core it forks) start with preloaded:
    # tcmalloc for a CPU engine (worker.allocator).
    engine_preload: tuple[str, ...] = ()
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
    # Local copies of weights (see weight_streaming.cache and the shape's ``cache`` and
    # ``host_cache_gib``): a directory on disk, shared by the workers of one machine,
    # and one of this worker's own in host memory (a tmpfs), emptied when it stops.
    disk_cache_dir: Path | None = None
    disk_cache_max_bytes: int = 0
    host_cache_dir: Path | None = None
    host_cache_max_bytes: int = 0
    # Check every file a load reads against the manifest's sha256 (with a cache).
    cache_verify_sha256: bool = True
    cache_verify_tensors: bool = True
    # How often the caches are looked at for what they hold (heartbeats carry it).
    cache_scan_interval_s: float = 5.0
    # The store prefixes an assignment's model URI must be under (the config's
    # object_store.allowed_prefixes); others are refused with 403. None: any plain
    # s3:// URI (tests; `thaw worker` always sets it).
    allowed_uri_prefixes: tuple[str, ...] | None = None
    # Several engines on this worker (pools[].pack): the memory they may hold together
    # (thaw.fit.engine_capacity); 0: this worker runs one engine.
    capacity_bytes: int = 0
    # A packed engine (worker.engines): the worker whose process it runs in, and where its
    # control API is under that worker's. It has one engine host, for one assignment.
    host_worker_id: str | None = None
    control_path: str = ""
    # Spans of traced loads (thaw.telemetry; no endpoint: none).
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)

    @property
    def control_url(self) -> str:
        return f"http://{self.advertised}:{self.port}{self.control_path}"

    @property
    def packed(self) -> bool:
        return self.host_worker_id is not None

    @property
    def advertised(self) -> str:
        """The host in the URLs this worker hands out (control API, engine)."""
        return self.advertise_host or self.host

    @property
    def local(self) -> str:
        """Where the agent itself reaches its engine: the address it listens on (the
        loopback when that is every address), never through the advertised one, which
        may be a route others take (a load balancer, NAT, a proxy)."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    def engine_cache_root(self, model: str) -> Path:
        """The engine's VLLM_CACHE_ROOT for ``model``: one per model, so a snapshot holds
        that model's compile caches only."""
        return self.data_dir / "vllm-cache" / "models" / model

    @property
    def snapshot_work_dir(self) -> Path:
        """Downloads, staging and archives of snapshots (next to the caches: same file system)."""
        return self.data_dir / "snapshot-work"
