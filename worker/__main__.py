"""``python -m worker``: run one worker agent (see ``worker.agent``)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import structlog
import uvicorn

from thaw.log import get_logger, setup_logging
from worker.api import create_app
from worker.settings import AgentSettings


def parse_args(argv: Sequence[str] | None = None) -> AgentSettings:
    p = argparse.ArgumentParser(prog="python -m worker", description="Thaw worker agent")
    p.add_argument("--port", type=int, required=True, help="control API port")
    p.add_argument("--worker-id", required=True)
    p.add_argument("--shape", required=True, help="instance shape name (from the config)")
    p.add_argument("--host", default="127.0.0.1", help="control API address (default: %(default)s)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--data-dir", type=Path, default=None,
                   help="engine caches (default: .thaw/workers/WORKER_ID)")
    a = p.parse_args(argv)
    data_dir = (a.data_dir or Path(".thaw") / "workers" / a.worker_id).resolve()
    return AgentSettings(worker_id=a.worker_id, shape=a.shape, port=a.port, host=a.host,
                         log_level=a.log_level, data_dir=data_dir)


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    setup_logging("worker", settings.log_level)
    structlog.contextvars.bind_contextvars(worker_id=settings.worker_id)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    get_logger().info("agent_starting", port=settings.port, shape=settings.shape,
                      data_dir=str(settings.data_dir))
    # uvicorn turns SIGTERM/SIGINT into a graceful shutdown; the app's lifespan then
    # stops the engine host and its process group before the process exits. Afterwards
    # uvicorn re-raises the signal under the handlers it found: these make that a
    # no-op, so a completed shutdown exits 0 instead of dying by the signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server = uvicorn.Server(uvicorn.Config(
        create_app(settings), host=settings.host, port=settings.port, log_config=None,
        access_log=settings.log_level == "debug", lifespan="on", timeout_graceful_shutdown=5,
    ))
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
