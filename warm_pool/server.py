"""`thaw controller`: the pool manager, its API and the providers, as one service."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from thaw.auth import cluster_token
from thaw.config import ThawConfig
from thaw.log import get_logger
from thaw.objstore import WeightsCheck
from warm_pool.app import create_pool_app
from warm_pool.assembly import build_pool
from warm_pool.classes import ModelClasses
from warm_pool.clock import SteppedClock
from warm_pool.db import Db
from warm_pool.fleet.control import HttpWorkerControl
from warm_pool.leader import LeaseStore
from warm_pool.providers.provider import Provider

log = get_logger()


def build_providers(cfg: ThawConfig, config_path: Path, controller_url: str) -> dict[str, Provider]:
    """One provider per pool's shape: the local provider is shared by every local pool."""
    out: dict[str, Provider] = {}
    local = None
    ec2_pools = {p.shape: p.ec2 for p in cfg.pools if p.provider == "ec2" and p.ec2 is not None}
    if ec2_pools:
        from warm_pool.providers.ec2 import Ec2Provider

        # One provider for every ec2 pool: one DescribeInstances per region lists them all.
        ec2 = Ec2Provider(cluster=cfg.cluster.name, pools=ec2_pools, controller_url=controller_url,
                          token_ssm_parameter=cfg.cluster.token_ssm_parameter, token_secret=cfg.cluster.token_secret,
                          config_uri=cfg.cluster.worker_config_uri, package=cfg.cluster.worker_package)
        out.update({shape: ec2 for shape in ec2_pools})
    for p in cfg.pools:
        if p.provider == "local":
            if local is None:
                from thaw.objstore import StoreConfigError, resolve_endpoint
                from warm_pool.providers.local import LocalProvider

                # Local workers get the store's keys in their environment, never over the wire.
                try:
                    env = resolve_endpoint(cfg).env()
                except StoreConfigError as exc:
                    log.warning("local_workers_without_store_keys", error=str(exc))
                    env = {}
                local = LocalProvider(config_path, cfg.data_dir, controller_url=controller_url,
                                      worker_env=env, log_level=cfg.log_level)
            out[p.shape] = local
        elif p.provider == "static":
            from warm_pool.providers.static import StaticProvider

            out[p.shape] = StaticProvider()
    return out


def build_model_classes(cfg: ThawConfig, clock: Callable[[], float] = time.time) -> ModelClasses | None:
    """Each model's engine class, read from the store, where some pool pre-builds
    engines, and its weights' size where some pool packs them (the only times placement
    needs them). The controller reads config.json and manifest files only: it needs
    s3:GetObject on the models' prefixes."""
    if not any(p.prebuild or p.pack for p in cfg.pools):
        return None
    from thaw.objstore import (
        StoreConfigError,
        read_model_config,
        read_weights_bytes,
        resolve_endpoint,
    )

    try:
        store = resolve_endpoint(cfg)
    except StoreConfigError as exc:
        log.warning("engine_classes_unavailable", error=str(exc))
        return None
    client = store.client()
    return ModelClasses(lambda uri: read_model_config(client, uri), clock=clock,
                        read_size=(lambda uri: read_weights_bytes(client, uri)) if any(p.pack for p in cfg.pools)
                        else None)


class S3StoreReader:
    """The registry's reads of the store (``warm_pool.registry.models.StoreReader``): a model's
    manifest and the HEAD of each file it lists, and its config.json. Blocking; the
    client is built on first use, in the caller's thread."""

    def __init__(self, cfg: ThawConfig) -> None:
        from thaw.objstore import resolve_endpoint

        self._endpoint = resolve_endpoint(cfg)
        self._client: Any = None
        self._lock = threading.Lock()

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._endpoint.client()
            return self._client

    def check_weights(self, uri: str) -> WeightsCheck:
        from thaw.objstore import check_weights

        return check_weights(self.client(), uri)

    def read_config(self, uri: str) -> dict[str, Any] | None:
        from thaw.objstore import read_model_config

        return read_model_config(self.client(), uri)


def build_store_reader(cfg: ThawConfig) -> S3StoreReader | None:
    from thaw.objstore import StoreConfigError

    try:
        return S3StoreReader(cfg)
    except StoreConfigError as exc:
        log.warning("model_deploys_unavailable", error=str(exc),
                    hint="the registry cannot check weights in the store, so it refuses deploys")
        return None


def create_controller_app(cfg: ThawConfig, config_path: Path, controller_url: str, *,
                          stop_local_workers: bool = False, controller_urls: list[str] | None = None) -> FastAPI:
    """``controller_url``: where this controller is reached; ``controller_urls``: every
    controller's (workers follow the leader among them; None: this one alone)."""
    providers = build_providers(cfg, config_path, ",".join(controller_urls or [controller_url]))
    token = cluster_token(cfg)
    shared = cfg.state.backend == "postgres" and cfg.state.url
    state_db = Db.postgres(cfg.state.url) if shared and cfg.state.url else None
    # Controllers sharing PostgreSQL elect a leader; the lease has its own connection, so
    # a renewal never queues behind the registry's reads.
    lease = LeaseStore(Db.postgres(cfg.state.url)) if shared and cfg.state.url else None
    control = HttpWorkerControl(token)
    reader = build_store_reader(cfg)
    clock = SteppedClock() if cfg.controller.stepped_clock else time.time
    manager = build_pool(cfg, providers, control, state_dir=cfg.data_dir / "controller", clock=clock,
                        model_classes=build_model_classes(cfg, clock), store_reader=reader,
                        store_client=reader.client if reader is not None else None,
                        state_db=state_db, lease=lease, url=controller_url,
                        controller_id=f"{socket.gethostname()}-{os.getpid()}", lease_s=cfg.controller.lease_s)
    app = create_pool_app(manager, token, manage_lifecycle=False)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await manager.start()
        try:
            yield
        finally:
            await manager.close()
            if stop_local_workers:
                from warm_pool.providers.local import LocalProvider

                locals_ = {id(p): p for p in providers.values() if isinstance(p, LocalProvider)}
                await asyncio.gather(*(p.terminate_all() for p in locals_.values()))
            log.info("controller_stopped", epoch=manager.epoch)

    app.router.lifespan_context = lifespan
    return app
