"""`thaw worker` (also ``python -m worker``): the agent on one instance (see ``worker.agent``).

It serves the control API, heartbeats to the controller, and takes the object store's
credentials from its own environment (never from the controller).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from thaw.auth import TokenError, cluster_token
from thaw.config import DEFAULT_CONFIG_PATH, ConfigError, ThawConfig, load_config
from thaw.fit import engine_capacity
from thaw.log import get_logger, setup_logging
from thaw.objstore import worker_endpoint
from worker.allocator import INSTALL_HINT, find_tcmalloc
from worker.settings import AgentSettings

DEFAULT_PORT = 8200
# Memory-backed on Linux: the host cache tier's files are host memory.
HOST_CACHE_ROOT = Path("/dev/shm/thaw")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--controller", metavar="URL[,URL]", default=None,
                   help="the controllers' URLs: heartbeats go to the leader among them "
                        "(default: controller.urls or controller.url in the config)")
    p.add_argument("--shape", required=True, help="this instance's shape (a name from the config)")
    p.add_argument("--instance-id", default=None,
                   help="the provider's id of this machine (EC2: from instance metadata); "
                        "default: HOSTNAME-PORT")
    p.add_argument("--worker-id", default=None, help="default: the instance id")
    p.add_argument("--host", default="127.0.0.1", help="control API address (default: %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="control API port (default: %(default)s)")
    p.add_argument("--advertise-host", default=None, metavar="ADDR",
                   help="the address the controller and activators reach this worker at (default: --host)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="engine caches (default: DATA_DIR/workers/WORKER_ID)")
    p.add_argument("--host-cache-dir", type=Path, default=None,
                   help="the host-memory weight cache, with the shape's host_cache_gib (default: "
                        f"{HOST_CACHE_ROOT}/WORKER_ID, a tmpfs)")
    p.add_argument("--exit-when-orphaned-s", type=float, default=None,
                   help="exit when the controller has accepted no heartbeat for this long (default: never)")


def settings_from(args: argparse.Namespace, cfg: ThawConfig) -> AgentSettings:
    if args.host in ("0.0.0.0", "::") and not args.advertise_host:
        raise ValueError(f"--host {args.host} listens everywhere: give --advertise-host, the address "
                         "the controller and activators reach this worker at")
    shape = cfg.shape(args.shape)
    if shape is None:
        raise ValueError(f"--shape {args.shape!r} is not in the config; declared: "
                         f"{sorted(s.name for s in cfg.shapes)}")
    pool = cfg.pool(args.shape)
    instance_id = args.instance_id or f"{socket.gethostname()}-{args.port}"
    worker_id = args.worker_id or instance_id
    data_dir = (args.data_dir or cfg.data_dir / "workers" / worker_id).resolve()
    gib = 1 << 30
    disk = shape.cache
    host_dir = None
    if shape.host_cache_gib > 0:
        host_dir = (args.host_cache_dir or HOST_CACHE_ROOT / worker_id).resolve()
    return AgentSettings(
        worker_id=worker_id, instance_id=instance_id, shape=args.shape, port=args.port, host=args.host,
        advertise_host=args.advertise_host, log_level=args.log_level or cfg.log_level, data_dir=data_dir,
        store=worker_endpoint(cfg), controller_url=(args.controller or ",".join(cfg.controller.resolved_urls)),
        token=cluster_token(cfg), heartbeat_interval_s=cfg.cluster.heartbeat_interval_s,
        exit_when_orphaned_s=args.exit_when_orphaned_s,
        disk_cache_dir=(cfg.data_dir / disk.dir).resolve() if disk else None,
        disk_cache_max_bytes=int(disk.max_gib * gib) if disk else 0,
        host_cache_dir=host_dir, host_cache_max_bytes=int(shape.host_cache_gib * gib),
        cache_verify_sha256=disk.verify_sha256 if disk else True,
        cache_verify_tensors=disk.verify_tensors if disk else True,
        allowed_uri_prefixes=tuple(cfg.object_store.allowed_prefixes),
        capacity_bytes=engine_capacity(shape) if pool is not None and pool.pack else 0,
        engine_preload=engine_preload(shape.gpu_type, shape.engine_tcmalloc, find_tcmalloc),
        telemetry=cfg.telemetry,
    )


def engine_preload(gpu_type: str, tcmalloc: bool, find: Callable[[], str | None]) -> tuple[str, ...]:
    """What a CPU engine is started with preloaded (worker.allocator): tcmalloc when the
    shape wants it and ``find`` finds it; nothing on a GPU shape."""
    if gpu_type != "cpu" or not tcmalloc:
        return ()
    path = find()
    if path is None:
        get_logger().warning("tcmalloc_missing", hint=INSTALL_HINT,
                             effect="the engine runs on glibc's malloc: a swap's layers over 32 MiB fault "
                                    "fresh pages")
        return ()
    return (path,)


def run(args: argparse.Namespace, cfg: ThawConfig) -> int:
    from thaw.serve import run_server
    from worker.api import create_app

    try:
        settings = settings_from(args, cfg)
    except (ValueError, TokenError) as exc:
        print(f"thaw worker: {exc}", file=sys.stderr)
        return 2
    setup_logging("worker", settings.log_level)
    structlog.contextvars.bind_contextvars(worker_id=settings.worker_id)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    get_logger().info("agent_starting", port=settings.port, shape=settings.shape, instance_id=settings.instance_id,
                      controller=settings.controller_url, control_url=settings.control_url,
                      data_dir=str(settings.data_dir))
    app = create_app(settings, on_orphaned=lambda: os.kill(os.getpid(), signal.SIGTERM))
    return run_server(app, settings.host, settings.port, graceful_s=5,
                      access_log=settings.log_level == "debug")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m worker", description="Thaw worker agent (as `thaw worker`)")
    p.add_argument("--config", metavar="FILE", default=None)
    p.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config or os.environ.get("THAW_CONFIG") or DEFAULT_CONFIG_PATH)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return run(args, cfg)


if __name__ == "__main__":
    sys.exit(main())
