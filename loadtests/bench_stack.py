"""``thaw up`` as a benchmark runs it: one stack of its own on the embedded store, a
config built from a few parameters, and the helpers each benchmark of a running stack
needs (waiting on its state, percentiles).

Module-level imports stay light: the CLI builds its parser from the benchmarks."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loadtests.procs import tail
from thaw.process import spawn_group, stop_group

API_KEY = "thaw-bench-key"
SHAPE = "cpu-bench"


def add_common_arguments(p: argparse.ArgumentParser, *, rounds_of: str) -> None:
    p.add_argument("--out", type=Path, required=True, help="write the JSON report here")
    p.add_argument("--rounds", type=int, default=2, help=f"rounds of the {rounds_of} (default 2)")
    p.add_argument("--size", default="tiny", help="the demo model's size (default tiny)")
    p.add_argument("--work-dir", type=Path, default=None, help="keep the run's files here (default: a temp dir)")


def bench_model(name: str, uri: str, *, min_replicas: int, max_replicas: int,
                max_context_tokens: int = 512) -> dict[str, Any]:
    """A model entry: the demo model, eager, loaded by Thaw's loader, never scaled down
    during a run."""
    return {"name": name, "uri": uri, "served_name": name, "shape": SHAPE, "max_context_tokens": max_context_tokens,
            "engine": {"enforce_eager": True, "cpu_kvcache_gib": 1, "load_format": "thaw"},
            "autoscaling": {"min_replicas": min_replicas, "max_replicas": max_replicas, "idle_grace_s": 3600,
                            "activation_timeout_s": 600, "max_concurrency_per_replica": 32}}


def base_config(store: Any, data_dir: Path, port: int, *, standby: int, max_instances: int,
                models: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A whole ``thaw up`` config: one local CPU pool, the bench tenant (``API_KEY``)."""
    from thaw.config import hash_api_key

    return {
        "data_dir": str(data_dir), "log_level": "info", "server": {"host": "127.0.0.1", "port": port},
        "object_store": {"kind": "s3", "endpoint_url": store.endpoint_url, "bucket": store.bucket,
                         "region": store.region, "credentials": {"source": "file", "file": str(store.credentials_file)}},
        "shapes": [{"name": SHAPE, "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8,
                    "price_per_hour_usd": 0.0}],
        "pools": [{"shape": SHAPE, "provider": "local", "standby_min": standby, "standby_max": standby,
                   "max_instances": max_instances}],
        "models": models,
        "tenants": [{"name": "bench", "api_key_hashes": [hash_api_key(API_KEY)], "allowed_models": ["*"]}],
        **extra,
    }


class Stack:
    """``thaw up`` as a subprocess."""

    def __init__(self, cfg: dict[str, Any], work: Path) -> None:
        import yaml

        from thaw.config import parse_config

        parse_config(cfg)
        self.data_dir = Path(cfg["data_dir"])
        self.config_path = work / "thaw-bench.yaml"
        self.config_path.write_text(yaml.safe_dump(cfg))
        self.log_path = work / "thaw-up.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.base_url = self.control_url = ""

    def start(self) -> None:
        endpoint = self.data_dir / "endpoint.json"
        self.proc = spawn_group([sys.executable, "-m", "thaw.cli.main", "up", "--config", str(self.config_path)],
                                self.log_path)
        self.wait("thaw up to start", lambda: endpoint.exists(), 180)
        info = json.loads(endpoint.read_text())
        self.base_url, self.control_url = info["base_url"], info["control_url"]

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, 60, term_leader_only=True)

    def wait(self, what: str, pred: Any, timeout_s: float = 600) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"thaw up exited ({self.proc.returncode}):\n{tail(self.log_path)}")
            got = pred()
            if got:
                return got
            if time.monotonic() > deadline:
                raise RuntimeError(f"not {what} after {timeout_s:.0f} s; see {self.log_path}")
            time.sleep(0.25)

    def state(self) -> dict[str, Any]:
        import httpx

        from thaw.auth import bearer, local_token

        r = httpx.get(f"{self.control_url}/v1/state", timeout=10, headers=bearer(local_token(self.data_dir)))
        return r.json()  # type: ignore[no-any-return]

    def client(self) -> Any:
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=API_KEY, max_retries=0, timeout=300)


def serving(state: dict[str, Any], model: str) -> bool:
    return any(w["model"] == model and w["state"] == "ready" for w in state["workers"])


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))
    return round(s[k], 4)


@contextmanager
def running(args: argparse.Namespace, name: str, seeds: tuple[int, ...],
            config: Callable[[Any, list[str], Path, int], dict[str, Any]]) -> Iterator[tuple[Stack, dict[str, Any]]]:
    """A started stack for benchmark ``name``: the demo model of ``--size`` pushed once
    per seed in ``seeds`` to the embedded store, ``config(store, uris, data_dir, port)``
    run by ``thaw up``; stopped (and its work dir removed unless ``--work-dir``) on the
    way out. Yields the stack and the run's environment record."""
    from loadtests.bench_cold_start import _ensure_model, _environment, _store
    from thaw.embedded_store import free_port

    own_work = args.work_dir is None
    work = Path(tempfile.mkdtemp(prefix=f"thaw-bench-{name}-")) if own_work else args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    environment = _environment()
    try:
        with _store(argparse.Namespace(s3_endpoint_url=None, s3_credentials_file=None, bucket="thaw"),
                    work) as store:
            uris = []
            for seed in seeds:
                uri, facts = _ensure_model(store, args.size, work, seed=seed)
                uris.append(uri)
                environment.setdefault("model", facts)
            stack = Stack(config(store, uris, work / "stack", free_port()), work)
            stack.start()
            try:
                yield stack, environment
            finally:
                stack.stop()
    finally:
        if own_work:
            shutil.rmtree(work, ignore_errors=True)
        environment["load_avg_1m_at_end"] = __import__("os").getloadavg()[0]
