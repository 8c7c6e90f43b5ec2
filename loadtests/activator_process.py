"""The activator process `thaw bench activator` measures, and its config.

    python -m loadtests.activator_process --config FILE --pool-url URL --model-dir DIR \\
        [--worker K --workers N]

The app and server of `thaw activator` (worker K of N on one port, as `--workers N` runs
them), a config with one tenant and one model whose one replica is the benchmark's fast
upstream, and the demo model's tokenizer and chat template read from a local directory
(the store's stand-in), so that every prompt is bounded or counted as in `thaw up`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from thaw.config import hash_api_key

API_KEY = "bench-key"
MODEL = "bench"


def activator_config(work: Path, port: int) -> dict[str, Any]:
    """A config for the activator alone: one tenant with limits far above the load (so
    the buckets run but never refuse), one model whose replica is the upstream."""
    return {
        "data_dir": str(work / "data"),
        "log_level": "warning",
        "server": {"host": "127.0.0.1", "port": port},
        "object_store": {"kind": "s3", "endpoint_url": "http://127.0.0.1:9", "bucket": "unused",
                         "credentials": {"source": "env"}},
        "shapes": [{"name": "cpu", "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 1,
                    "price_per_hour_usd": 0}],
        "pools": [{"shape": "cpu", "provider": "local", "standby_min": 0, "standby_max": 0,
                   "max_instances": 1, "budget_usd_per_hour": 0}],
        "models": [{"name": MODEL, "uri": "s3://unused/bench", "shape": "cpu",
                    "autoscaling": {"min_replicas": 1, "max_replicas": 1,
                                    "max_concurrency_per_replica": 100000, "max_queue_length": 100000}}],
        "tenants": [{"name": "bench", "api_key_hashes": [hash_api_key(API_KEY)],
                     "limits": {"requests_per_minute": 100_000_000, "tokens_per_minute": 1_000_000_000,
                                "max_concurrent_requests": 100000}}],
    }


def dir_fetcher(root: Path) -> Any:
    """A tokenizer-file fetcher over a local model directory (the benchmark's stand-in
    for the store: the same files, read once per model as from S3)."""
    def fetch(uri: str, name: str) -> bytes | None:
        path = root / name
        return path.read_bytes() if path.is_file() else None

    return fetch


def serve_activator(config: Path, pool_url: str, model_dir: Path, worker: int = 0, workers: int = 1) -> None:
    """An activator process of the benchmark: `thaw activator`'s app
    and server (worker ``worker`` of ``workers`` on one port), with ``pool_url`` (the
    upstream's fixed route table) as its pool, and the demo model's tokenizer and chat
    template (``model_dir``), so that every request's prompt is bounded or counted as in
    `thaw up`. Once started it creates ``<config>.ready.<worker>``: with several workers
    on one port, the health URL does not say which one answered."""
    import yaml

    from activator.app import create_app
    from activator.server import connection_limits
    from thaw.config import ThawConfig
    from thaw.log import setup_logging
    from thaw.serve import run_server

    cfg = ThawConfig.model_validate(yaml.safe_load(config.read_text()))
    setup_logging("activator", cfg.log_level)
    app = create_app(cfg, pool_url, activator_id="bench" if workers == 1 else f"bench.w{worker}",
                     store_fetcher=dir_fetcher(model_dir), processes=workers)
    ready = config.with_name(f"{config.name}.ready.{worker}")

    async def marked(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            return await app(scope, receive, send)

        async def send_marking(message: Any) -> None:
            await send(message)
            if message["type"] == "lifespan.startup.complete":
                ready.touch()

        return await app(scope, receive, send_marking)

    run_server(marked, cfg.server.host, cfg.server.port, graceful_s=5, reuse_port=workers > 1,
               limits=connection_limits(cfg.server))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--pool-url", required=True)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--worker", type=int, default=0)
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args(argv)
    serve_activator(args.config, args.pool_url, args.model_dir, args.worker, args.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
