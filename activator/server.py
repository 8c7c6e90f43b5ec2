"""`thaw activator`: the OpenAI API as one service, reaching the controller with the
cluster token."""

from __future__ import annotations

from fastapi import FastAPI

from activator.app import create_app
from thaw.auth import cluster_token
from thaw.config import ThawConfig
from thaw.log import get_logger

log = get_logger()


def create_activator_app(cfg: ThawConfig, controller_url: str, activator_id: str | None) -> FastAPI:
    from activator.tokens import s3_fetcher
    from thaw.objstore import StoreConfigError, resolve_endpoint

    fetcher = None
    try:
        fetcher = s3_fetcher(resolve_endpoint(cfg).client())
    except StoreConfigError as exc:
        # Prompt lengths are then estimated, not checked against the context.
        log.warning("tokenizers_unavailable", error=str(exc))
    return create_app(cfg, controller_url, activator_id=activator_id, store_fetcher=fetcher,
                      token=cluster_token(cfg))
