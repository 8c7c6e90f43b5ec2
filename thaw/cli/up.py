"""`thaw up`: the embedded platform on one machine.

Today it starts the embedded store and publishes the demo model when the store
lacks it, then holds until Ctrl-C/SIGTERM and stops what it started. The serving
path (control plane, activator, standby worker) plugs in here.
"""

from __future__ import annotations

import signal
import tempfile
import threading
from pathlib import Path

from thaw.config import ThawConfig
from thaw.log import get_logger

log = get_logger()


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


def run_up(cfg: ThawConfig, port: int | None = None) -> int:
    from thaw.embedded_store import EmbeddedStore
    from thaw.objstore import embedded_store_root

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    store = None
    if cfg.object_store.kind == "embedded":
        store = EmbeddedStore(embedded_store_root(cfg), s3_port=cfg.object_store.embedded.s3_port,
                              bucket=cfg.object_store.bucket, region=cfg.object_store.region)
        already = store.running_pid() is not None
        store.start(timeout_s=cfg.object_store.embedded.startup_timeout_s)
        if already:
            store = None  # someone else's (`thaw store up`): leave it running
    try:
        ensure_demo_models(cfg)
        for m in cfg.models:
            print(f"model {m.resolved_served_name}: {m.uri}", flush=True)
        print("thaw up: store ready; press Ctrl-C to stop", flush=True)
        stop.wait()
    finally:
        if store is not None:
            store.stop()
    return 0
