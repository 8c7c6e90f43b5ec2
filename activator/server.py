"""`thaw activator`: the OpenAI API as one service, reaching the controller with the
cluster token."""

from __future__ import annotations

import re
import signal
import socket

from fastapi import FastAPI

from activator.app import create_app
from thaw.auth import cluster_token
from thaw.config import NAME_PATTERN, Server, ThawConfig
from thaw.log import get_logger
from thaw.serve import ConnectionLimits

log = get_logger()


def default_activator_id(port: int) -> str:
    """The same name on every start of this activator (host and port), so that a restart
    finds its own ledger and keys, and its shipped usage segments continue its own."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname().split(".")[0]) or "host"
    return f"{host[:50]}-{port}"


def check_activator_id(value: str) -> str:
    if not re.match(NAME_PATTERN, value):
        raise ValueError(f"activator id {value!r}: use letters, digits, '.', '_' or '-' (at most 63)")
    return value


def connection_limits(server: Server) -> ConnectionLimits:
    """The activator's connections: its header deadline, and a bound on the wire well
    above the app's own (``activator.bounds``), which answers the moderately large with
    OpenAI's error shape and a request id."""
    return ConnectionLimits(header_timeout_s=server.header_timeout_s, max_header_bytes=4 * server.max_header_bytes)


def create_activator_app(cfg: ThawConfig, controller_url: str, activator_id: str, *, processes: int = 1) -> FastAPI:
    from activator.shipping import CLIENT_CONFIG
    from activator.tokens import s3_fetcher
    from thaw.objstore import StoreConfigError, resolve_endpoint

    fetcher = usage_client = files_client = None
    try:
        endpoint = resolve_endpoint(cfg)
        fetcher = s3_fetcher(endpoint.client())
        usage_client = endpoint.client(**CLIENT_CONFIG)
        files_client = endpoint.client()
    except StoreConfigError as exc:
        # Prompt lengths are then estimated, not checked against the context; usage is
        # neither shipped nor read from the store (/v1/usage: this activator's ledger).
        log.warning("store_unavailable", error=str(exc))
    return create_app(cfg, controller_url, activator_id=activator_id, store_fetcher=fetcher,
                      token=cluster_token(cfg), usage_client=usage_client, files_client=files_client,
                      processes=processes)


def supervise(commands: list[list[str]], *, quick_exit_s: float = 5.0, max_quick_exits: int = 5) -> int:
    """`thaw activator --workers N`: run one process per command (they share the port
    with SO_REUSEPORT) until SIGTERM or SIGINT, which each of them gets. One that exits
    meanwhile is started again; one that keeps failing at start (five times within
    seconds of starting: a port in use, a bad config) stops them all, exit 1."""
    import subprocess
    import time

    procs = [subprocess.Popen(c) for c in commands]
    started = [time.monotonic()] * len(procs)
    quick = [0] * len(procs)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    log.info("activator_workers_started", workers=len(procs), pids=[p.pid for p in procs])
    while not stopping:
        for i, p in enumerate(procs):
            rc = p.poll()
            if rc is None or stopping:
                continue
            quick[i] = quick[i] + 1 if time.monotonic() - started[i] < quick_exit_s else 0
            log.warning("activator_worker_exited", worker=i, returncode=rc, quick_exits=quick[i])
            if quick[i] >= max_quick_exits:
                log.error("activator_worker_keeps_failing", worker=i, returncode=rc)
                stop()
                for q in procs:
                    q.wait()
                return 1
            time.sleep(min(0.5 * quick[i], 5.0))
            procs[i], started[i] = subprocess.Popen(commands[i]), time.monotonic()
        time.sleep(0.2)
    codes = [p.wait() for p in procs]
    return 0 if all(c == 0 for c in codes) else 1
