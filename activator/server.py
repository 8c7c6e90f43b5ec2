"""`thaw activator`: the OpenAI API as one service, reaching the controller with the
cluster token."""

from __future__ import annotations

import re
import socket

from fastapi import FastAPI

from activator.app import create_app
from thaw.auth import cluster_token
from thaw.config import NAME_PATTERN, ThawConfig
from thaw.log import get_logger

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


def create_activator_app(cfg: ThawConfig, controller_url: str, activator_id: str) -> FastAPI:
    from activator.shipping import CLIENT_CONFIG
    from activator.tokens import s3_fetcher
    from thaw.objstore import StoreConfigError, resolve_endpoint

    fetcher = usage_client = None
    try:
        endpoint = resolve_endpoint(cfg)
        fetcher = s3_fetcher(endpoint.client())
        usage_client = endpoint.client(**CLIENT_CONFIG)
    except StoreConfigError as exc:
        # Prompt lengths are then estimated, not checked against the context; usage is
        # neither shipped nor read from the store (/v1/usage: this activator's ledger).
        log.warning("store_unavailable", error=str(exc))
    return create_app(cfg, controller_url, activator_id=activator_id, store_fetcher=fetcher,
                      token=cluster_token(cfg), usage_client=usage_client)
