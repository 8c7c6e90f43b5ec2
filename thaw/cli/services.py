"""`thaw up`, `thaw controller`, `thaw activator`, `thaw worker`: the services, each
run in this process."""

from __future__ import annotations

import argparse
import sys

from thaw.cli.common import (
    EXIT_INVALID,
    CliError,
    _config_path,
    _load,
)
from thaw.controllers import parse_urls
from thaw.log import setup_logging


def cmd_controller(args: argparse.Namespace) -> int:
    from thaw.serve import run_server
    from warm_pool.server import create_controller_app

    cfg = _load(args, running_stack=False)
    setup_logging("controller", args.log_level or cfg.log_level)
    host = args.host or cfg.controller.host
    port = args.port or cfg.controller.port
    url = (args.url or (cfg.controller.url if not cfg.controller.urls else None)
           or f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}").rstrip("/")
    urls = cfg.controller.resolved_urls if cfg.controller.urls else [url]
    if url not in urls:
        raise CliError(f"this controller's URL {url} is not among controller.urls {urls} (give --url)", EXIT_INVALID)
    app = create_controller_app(cfg, _config_path(args), url, stop_local_workers=args.stop_local_workers,
                                controller_urls=urls)
    return run_server(app, host, port, graceful_s=10, on_exit=app.state.manager.stop_deciding)


def cmd_activator(args: argparse.Namespace) -> int:
    from activator.server import (
        check_activator_id,
        connection_limits,
        create_activator_app,
        default_activator_id,
        supervise,
    )
    from thaw.serve import run_server

    cfg = _load(args, running_stack=False)
    setup_logging("activator", args.log_level or cfg.log_level)
    port, host = args.port or cfg.server.port, args.host or cfg.server.host
    try:
        controller = ",".join(parse_urls(args.controller or cfg.controller.resolved_urls))
    except ValueError as exc:
        raise CliError(f"--controller: {exc}", EXIT_INVALID) from None
    try:
        activator_id = check_activator_id(args.id) if args.id else default_activator_id(port)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    if args.workers < 1:
        raise CliError("--workers must be at least 1", EXIT_INVALID)
    if args.workers > 1:
        # N processes on one port, each its own activator (<id>.w<k>: its ledger, keys,
        # reports); local limits are split between them (Redis limits are shared anyway).
        base = [sys.executable, "-m", "thaw.cli.main", "activator", "--config", str(_config_path(args)),
                "--controller", controller, "--host", host, "--port", str(port), "--worker-of", str(args.workers)]
        if args.log_level:
            base += ["--log-level", args.log_level]
        return supervise([[*base, "--id", f"{activator_id}.w{k}"] for k in range(args.workers)])
    processes = args.worker_of or 1
    app = create_activator_app(cfg, controller, activator_id, processes=processes)
    return run_server(app, host, port, graceful_s=30, reuse_port=processes > 1,
                      limits=connection_limits(cfg.server))


def cmd_worker(args: argparse.Namespace) -> int:
    from worker.__main__ import run

    return run(args, _load(args, running_stack=False))


def cmd_up(args: argparse.Namespace) -> int:
    from thaw.cli.up import run_up

    cfg = _load(args, running_stack=False)
    try:
        return run_up(cfg, _config_path(args), port=args.port)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
