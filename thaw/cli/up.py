"""`thaw up`: the embedded platform on one machine, all on loopback.

Starts the object store (when embedded), publishes the demo model when the store
lacks it, then runs the pool manager (which launches the standby workers) and the
activator in this process, and stops all of it on Ctrl-C/SIGTERM. Workers die with
this process even if it is killed (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

from thaw.config import ThawConfig, hash_api_key
from thaw.log import get_logger

log = get_logger()

DEMO_API_KEY = "thaw-demo-key"


def ensure_demo_models(cfg: ThawConfig) -> list[str]:
    """Build and push the demo model to every ``demo_if_missing`` URI without a manifest."""
    from thaw.demo_model import build_demo_model
    from thaw.objstore import resolve_endpoint
    from weight_streaming.push import push_model, read_manifest

    client = resolve_endpoint(cfg).client()
    pushed = []
    for model in cfg.models:
        if not model.demo_if_missing or read_manifest(client, model.uri) is not None:
            continue
        with tempfile.TemporaryDirectory(prefix="thaw-demo-") as tmp:
            build_demo_model(Path(tmp) / "demo")
            push_model(client, Path(tmp) / "demo", model.uri)
        log.info("demo_model_pushed", model=model.name, uri=model.uri)
        pushed.append(model.uri)
    return pushed


def endpoint_file(cfg: ThawConfig) -> Path:
    return cfg.data_dir / "endpoint.json"


def _demo_key(cfg: ThawConfig) -> str | None:
    # Only the documented demo key can be shown: other keys exist here only as hashes.
    h = hash_api_key(DEMO_API_KEY)
    return DEMO_API_KEY if any(h in t.api_key_hashes for t in cfg.tenants) else None


class _Server:
    """A uvicorn server that leaves signal handling to `thaw up`."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        import uvicorn

        config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False,
                                timeout_graceful_shutdown=10, lifespan="on")
        self.server = uvicorn.Server(config)
        self.server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]

    async def serve(self) -> None:
        await self.server.serve()

    def stop(self) -> None:
        self.server.should_exit = True

    @property
    def started(self) -> bool:
        return self.server.started


async def serve(cfg: ThawConfig, port: int | None, stop: asyncio.Event) -> int:
    from activator.app import create_app
    from thaw.embedded_store import free_port
    from thaw.objstore import resolve_endpoint
    from warm_pool.api import create_pool_app
    from warm_pool.manager import PoolManager
    from warm_pool.providers import LocalProvider

    store_ep = resolve_endpoint(cfg)
    provider = LocalProvider(cfg.data_dir, log_level=cfg.log_level)
    manager = PoolManager(cfg, provider, store_ep)
    pool_port = free_port()
    pool_url = f"http://127.0.0.1:{pool_port}"
    act_port = port or cfg.server.port
    pool = _Server(create_pool_app(manager), "127.0.0.1", pool_port)
    from activator.tokens import s3_fetcher

    app = create_app(cfg, pool_url, activator_id="embedded", store_fetcher=s3_fetcher(store_ep.client()))
    activator = _Server(app, cfg.server.host, act_port)

    tasks = [asyncio.create_task(pool.serve(), name="pool"), asyncio.create_task(activator.serve(), name="activator")]
    while not (pool.started and activator.started):
        if any(t.done() for t in tasks):
            break
        await asyncio.sleep(0.05)
    if pool.started and activator.started:
        base_url = f"http://{cfg.server.host}:{act_port}/v1"
        info = {"base_url": base_url, "model": cfg.models[0].resolved_served_name if cfg.models else None,
                "models": [m.resolved_served_name for m in cfg.models], "api_key": _demo_key(cfg),
                "control_url": pool_url, "pid": os.getpid()}
        path = endpoint_file(cfg)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(info, indent=2))
        print(f"thaw up: serving on {base_url}", flush=True)
        for m in cfg.models:
            print(f"  model {m.resolved_served_name!r} ({m.uri}), scales to zero after "
                  f"{m.autoscaling.idle_grace_s:g} s idle", flush=True)
        if info["api_key"]:
            print(f"  demo API key: {info['api_key']}", flush=True)
        print(f"  endpoint info: {path}; worker logs: {cfg.data_dir / 'logs'}; Ctrl-C stops", flush=True)
        done_any = asyncio.create_task(asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED))
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait([done_any, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
    rc = 0 if stop.is_set() else 1
    print("thaw up: stopping", flush=True)
    activator.stop()
    pool.stop()  # its lifespan stops the manager, which terminates the workers
    await asyncio.gather(*tasks, return_exceptions=True)
    endpoint_file(cfg).unlink(missing_ok=True)
    return rc


def run_up(cfg: ThawConfig, port: int | None = None) -> int:
    from thaw.embedded_store import EmbeddedStore
    from thaw.objstore import embedded_store_root

    store = None
    if cfg.object_store.kind == "embedded":
        store = EmbeddedStore(embedded_store_root(cfg), s3_port=cfg.object_store.embedded.s3_port,
                              bucket=cfg.object_store.bucket, region=cfg.object_store.region)
        already = store.running_pid() is not None
        print("thaw up: starting the object store", flush=True)
        store.start(timeout_s=cfg.object_store.embedded.startup_timeout_s)
        if already:
            store = None  # started by `thaw store up`: leave it running
    try:
        pushed = ensure_demo_models(cfg)
        for uri in pushed:
            print(f"thaw up: built and pushed the demo model to {uri}", flush=True)

        async def main() -> int:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            return await serve(cfg, port, stop)

        return asyncio.run(main())
    finally:
        if store is not None:
            print("thaw up: stopping the object store", flush=True)
            store.stop()
