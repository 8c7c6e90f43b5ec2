"""What the `thaw` commands share: their errors and exit codes, loading the config, and
calling the controller (with the cluster token, naming who asks)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from thaw.config import DEFAULT_CONFIG_PATH, ConfigError, ThawConfig, load_config
from thaw.exits import EXIT_FAILED, EXIT_INVALID, EXIT_STORE  # noqa: F401 - the commands' codes
from thaw.log import setup_logging


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


# What a command needs running and where it finds its token: one sentence each, ending
# every such command's description (`thaw <command> --help`, docs/reference/cli.md).
NEEDS_CONTROLLER = ("Needs a running controller (`thaw up` or `thaw controller`); authenticates with the "
                    "cluster token from the config's data directory, or an admin key in THAW_ADMIN_KEY.")
NEEDS_STORE = "Needs the object store (the embedded one runs under `thaw up` or `thaw store up`)."
# By what a command needs (the `needs` of `add` in thaw.cli.main): its sentences.
NEEDS: dict[str, tuple[str, ...]] = {
    "controller": (NEEDS_CONTROLLER,),
    "store": (NEEDS_STORE,),
    "store+controller": (NEEDS_STORE, NEEDS_CONTROLLER),
    "local": (),
}
CONTROLLER_HELP = ("the controllers, comma-separated (calls go to the leader); default: the running "
                   "`thaw up`'s, else controller.urls in the config")


def add_controller_argument(p: argparse.ArgumentParser) -> None:
    """``--controller URL[,URL]``, the same on every command that calls a controller."""
    p.add_argument("--controller", metavar="URL[,URL]", default=None, help=CONTROLLER_HELP)


def add_json_argument(p: argparse.ArgumentParser, help_: str = "print the result as one JSON document") -> None:
    """``--json``: the command's result on stdout as one JSON document."""
    p.add_argument("--json", action="store_true", help=help_)


def print_json(body: object) -> None:
    print(json.dumps(body, indent=2))


def _config_path(args: argparse.Namespace) -> Path:
    return Path(args.config or os.environ.get("THAW_CONFIG") or DEFAULT_CONFIG_PATH)


def _config_source(args: argparse.Namespace, running_stack: bool) -> tuple[Path, Path | None]:
    """The config file a command reads, and the directory its relative paths resolve
    from (None: the current one): --config, else THAW_CONFIG, else the default here,
    else (``running_stack``) the running `thaw up`'s that this user started last."""
    if args.config or os.environ.get("THAW_CONFIG") or DEFAULT_CONFIG_PATH.exists():
        return _config_path(args), None
    from thaw.cli.stack import latest

    stack = latest() if running_stack else None
    if stack is None:
        raise CliError(f"{DEFAULT_CONFIG_PATH}: no such file in {Path.cwd()}"
                       + (", and no `thaw up` of yours is running to take its config from" if running_stack else "")
                       + ": give the config with --config FILE or THAW_CONFIG=FILE, or run from the directory "
                       "that holds it (the checkout)", EXIT_INVALID)
    return stack.config, stack.base_dir


def _load(args: argparse.Namespace, *, running_stack: bool = True) -> ThawConfig:
    """The config (``_config_source``). ``running_stack``: without --config, THAW_CONFIG
    and the default config here, take the running `thaw up`'s (False: the services, which
    run with a config of their own)."""
    path, base_dir = _config_source(args, running_stack)
    try:
        cfg = load_config(path, base_dir)
    except ConfigError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    setup_logging("cli", args.log_level or cfg.log_level)
    return cfg


def _controller(args: argparse.Namespace, cfg: ThawConfig) -> str:
    """The controllers' URLs (``URL[,URL]``; calls go to the leader among them):
    --controller, else the running `thaw up`'s, else the config's."""
    from thaw.cli.up import endpoint_file

    if getattr(args, "controller", None):
        return str(args.controller).rstrip("/")
    with_up = endpoint_file(cfg)
    try:
        return str(json.loads(with_up.read_text())["control_url"]).rstrip("/")
    except (OSError, ValueError, KeyError):
        return ",".join(cfg.controller.resolved_urls)


def _get(cfg: ThawConfig, url: str, path: str, **params: float | str) -> dict:  # type: ignore[type-arg]
    return _call(cfg, "GET", url, path, params=params)


def _call(cfg: ThawConfig, method: str, url: str, path: str, *, params: dict | None = None,  # type: ignore[type-arg]
          body: dict | None = None) -> dict:  # type: ignore[type-arg]
    import getpass
    import socket

    import httpx

    from thaw.auth import TokenError, bearer, cluster_token
    from thaw.controllers import Controllers

    admin_key = os.environ.get("THAW_ADMIN_KEY")
    try:
        # An admin key (`thaw admin-keys add`) opens the model and tenant API only.
        headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else bearer(cluster_token(cfg))
    except TokenError as exc:
        raise CliError(str(exc), EXIT_FAILED) from None
    # Who is asking, for the controller's audit events.
    headers["X-Thaw-Actor"] = f"{getpass.getuser()}@{socket.gethostname()}"
    try:
        controllers = Controllers(url)
    except ValueError as exc:
        raise CliError(f"--controller: {exc}", EXIT_INVALID) from None
    try:
        r = controllers.request_sync(method, path, headers=headers, params=params, json=body, timeout=10)
        url = controllers.url
    except httpx.HTTPError as exc:
        raise CliError(f"the controller at {url} does not answer ({exc or type(exc).__name__}); is it running "
                       "(`thaw up` or `thaw controller`)?", EXIT_STORE) from None
    if r.status_code == 401:
        what = ("the admin key in THAW_ADMIN_KEY (revoked? it opens /v1/admin/ only)" if admin_key
                else "the cluster token (is this its config?)")
        raise CliError(f"the controller at {url} refused {what}", EXIT_FAILED)
    if r.status_code >= 400:
        try:
            message = r.json()["error"]
        except (ValueError, KeyError, TypeError):
            message = f"the controller at {url} answered {r.status_code}: {r.text[:300]}"
        # What the caller asked for is wrong (unknown, conflicting, invalid) or it failed.
        raise CliError(message, EXIT_INVALID if r.status_code in (404, 409, 422) else EXIT_FAILED)
    return r.json()  # type: ignore[no-any-return]
