"""`thaw up`: the embedded platform on one machine, all on loopback.

The same services as a fleet, composed: it starts the object store (when embedded),
publishes the demo model when the store lacks it, then runs `thaw controller` (which
launches the local standby workers) and one `thaw activator` as child processes, and
stops all of it on Ctrl-C/SIGTERM. The services die with this process even if it is
killed (PR_SET_PDEATHSIG); the controller then stops the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from thaw.aio import wait_event
from thaw.config import ThawConfig, hash_api_key
from thaw.log import get_logger
from thaw.private_files import write_private
from thaw.process import spawn_group_async, stop_group_async

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


def write_endpoint_file(cfg: ThawConfig, info: Mapping[str, object]) -> Path:
    """Where `thaw up` serves, for the tools on this machine (``loadtests.probe``).

    It may hold the demo key, the one key this file ever holds: a documented constant,
    printed for the user anyway, whose hash the local config lists. Still 0600, like
    every file with a key in it (thaw.private_files)."""
    path = endpoint_file(cfg)
    write_private(path, json.dumps(info, indent=2).encode())
    return path


def _demo_key(cfg: ThawConfig) -> str | None:
    # Only the documented demo key can be shown: other keys exist here only as hashes.
    h = hash_api_key(DEMO_API_KEY)
    return DEMO_API_KEY if any(h in t.api_key_hashes for t in cfg.tenants) else None


@dataclass
class _Service:
    """One service `thaw up` runs as a child process, restarted if it dies."""

    name: str
    argv: list[str]
    health_url: str
    log_path: Path
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Its own session (Ctrl-C reaches `thaw up` only, which stops the services in
        # order); it dies with `thaw up` even if that is SIGKILLed.
        self.proc = await spawn_group_async(self.argv, self.log_path)

    async def healthy(self, timeout_s: float) -> bool:
        import httpx

        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=1.0) as http:
            while time.monotonic() < deadline:
                if self.proc is None or self.proc.returncode is not None:
                    return False
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(self.health_url)).status_code == 200:
                        return True
                await asyncio.sleep(0.1)
        return False

    async def stop(self, timeout_s: float) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        # SIGTERM to the service alone: it stops what it started, in order.
        if await stop_group_async(proc, timeout_s, term_leader_only=True):
            log.warning("service_kill", service=self.name, after_s=timeout_s)


def _refuse_remote_pools(cfg: ThawConfig) -> None:
    for i, p in enumerate(cfg.pools):
        if p.provider != "local":
            raise ValueError(f"pools[{i}].provider: {p.provider!r}: `thaw up` runs only local pools (run "
                             "`thaw controller` for a fleet, see docs/DEPLOY.md)")


def standing_by(state: dict[str, object]) -> bool:
    """A worker is ready to take a model at once (a standby) or serves one already."""
    workers = state.get("workers")
    return isinstance(workers, list) and any(
        isinstance(w, dict) and w.get("state") in ("standby", "ready") for w in workers)


async def _say_serving_when_ready(cfg: ThawConfig, controller_url: str, base_url: str, stop: asyncio.Event) -> None:
    import httpx

    from thaw.auth import bearer, local_token

    started = time.monotonic()
    async with httpx.AsyncClient(timeout=5.0) as http:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError, ValueError, OSError):
                r = await http.get(f"{controller_url}/v1/state", headers=bearer(local_token(cfg.data_dir)))
                if r.status_code == 200 and standing_by(r.json()):
                    print(f"thaw up: serving on {base_url} (a worker stands by: a cold start takes seconds; "
                          f"ready {time.monotonic() - started:.0f} s after the API)", flush=True)
                    return
            await wait_event(stop, 0.5)


async def serve(cfg: ThawConfig, config_path: Path, port: int | None, stop: asyncio.Event) -> int:
    """Run `thaw controller` and one `thaw activator` as child processes (the controller
    launches the local workers) until ``stop``; a service that dies is restarted."""
    act_port = port or cfg.server.port
    controller_url = f"http://127.0.0.1:{cfg.controller.port}"
    logs = cfg.data_dir / "logs"
    base = [sys.executable, "-m", "thaw.cli.main"]
    common = ["--config", str(config_path)]
    controller = _Service("controller", [*base, "controller", *common, "--host", "127.0.0.1",
                                         "--port", str(cfg.controller.port), "--stop-local-workers"],
                          f"{controller_url}/healthz", logs / "controller.log")
    activator = _Service("activator", [*base, "activator", *common, "--controller", controller_url,
                                       "--host", cfg.server.host, "--port", str(act_port), "--id", "embedded"],
                         f"http://{cfg.server.host}:{act_port}/healthz", logs / "activator.log")
    services = [controller, activator]
    rc = 1
    try:
        for svc in services:
            await svc.start()
            if not await svc.healthy(120.0):
                print(f"thaw up: the {svc.name} did not start; see {svc.log_path}", flush=True)
                return 1
        base_url = f"http://{cfg.server.host}:{act_port}/v1"
        info = {"base_url": base_url, "model": cfg.models[0].resolved_served_name if cfg.models else None,
                "models": [m.resolved_served_name for m in cfg.models], "api_key": _demo_key(cfg),
                "control_url": controller_url, "pid": os.getpid()}
        write_endpoint_file(cfg, info)
        kept = any(p.standby_min > 0 for p in cfg.pools) or any(m.autoscaling.min_replicas > 0 for m in cfg.models)
        if kept:
            # The API answers now, but a worker is still importing vLLM: a request sent
            # now waits for that too. Say so, and say "serving" once one stands by.
            print(f"thaw up: the API is up on {base_url}; a standby worker is starting (importing vLLM takes "
                  "10-20 s): a request sent before it is ready waits for it", flush=True)
            waiter: asyncio.Task[None] | None = asyncio.create_task(
                _say_serving_when_ready(cfg, controller_url, base_url, stop))
        else:
            print(f"thaw up: serving on {base_url} (no standby is kept, standby_min 0: each cold start "
                  "launches a worker first)", flush=True)
            waiter = None
        for m in cfg.models:
            print(f"  model {m.resolved_served_name!r} ({m.uri}), scales to zero after "
                  f"{m.autoscaling.idle_grace_s:g} s idle", flush=True)
        if info["api_key"]:
            print(f"  demo API key: {info['api_key']}", flush=True)
        print(f"  controller: {controller_url} (`thaw pool status`); logs: {logs}; Ctrl-C stops", flush=True)
        while not stop.is_set():
            await wait_event(stop, 0.5)
            for svc in services:
                if not stop.is_set() and svc.proc is not None and svc.proc.returncode is not None:
                    # A service that died is started again: the controller adopts the
                    # workers it left, the activator resumes from the controller's routes.
                    svc.restarts += 1
                    print(f"thaw up: the {svc.name} exited ({svc.proc.returncode}); restarting it", flush=True)
                    await asyncio.sleep(min(2.0 ** (svc.restarts - 1), 30.0))
                    await svc.start()
        rc = 0
        if waiter is not None:
            waiter.cancel()
    finally:
        print("thaw up: stopping", flush=True)
        await activator.stop(20.0)
        await controller.stop(60.0)  # --stop-local-workers: it terminates the workers
        endpoint_file(cfg).unlink(missing_ok=True)
    return rc


def run_up(cfg: ThawConfig, config_path: Path, port: int | None = None) -> int:
    from thaw.cli import stack

    _refuse_remote_pools(cfg)
    config_file = config_path.resolve()
    # Recorded while it runs (thaw.cli.stack): `thaw` run in another directory reads this
    # config, its relative paths resolved from here; `thaw store down` sees the store in use.
    try:
        stack.record(config_file, Path.cwd(), cfg.data_dir)
    except OSError as exc:  # a home it cannot write to: it runs all the same
        print(f"thaw up: cannot record this stack under {stack.records_dir()} ({exc}): `thaw` run in another "
              "directory needs --config", flush=True)
    try:
        return _run_stack(cfg, config_file, port)
    finally:
        stack.forget()


def _run_stack(cfg: ThawConfig, config_file: Path, port: int | None) -> int:
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
            return await serve(cfg, config_file, port, stop)

        return asyncio.run(main())
    finally:
        if store is not None:
            print("thaw up: stopping the object store", flush=True)
            store.stop()
