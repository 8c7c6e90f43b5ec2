"""`thaw snapshot build|ls|rm`: engine snapshots in the store.

``build`` starts the model once the way a worker does — an in-process worker agent
(``worker.agent.Agent``) with a temporary data dir: same engine host, same vLLM
flags and environment, same fingerprint, same capture — so the snapshot it uploads
is the one workers look up. Exit codes as for every `thaw` command: 0 success, 1 the
operation failed, 2 bad input (unknown model, eager mode, unknown fingerprint),
3 the store is not reachable.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import botocore.exceptions

from snapshotter.fingerprint import fingerprint_inputs, fingerprint_of, probe_runtime
from snapshotter.ops import CaptureStatus
from snapshotter.store import (
    SnapshotLocation,
    SnapshotStoreError,
    StoredSnapshot,
    delete_snapshot,
    list_snapshots,
    read_snapshot_manifest,
)
from thaw.config import ConfigError, Model, ThawConfig, load_config
from thaw.exits import EXIT_FAILED, EXIT_INVALID, EXIT_STORE
from thaw.log import get_logger, setup_logging
from thaw.objstore import S3Endpoint, StoreConfigError, resolve_endpoint
from thaw.s3errors import error_code
from thaw.s3uri import parse_s3_uri

COMMANDS: dict[str, str] = {
    "build": "Start a configured model once (compiled mode) and upload its compile caches as its snapshot.",
    "ls": "List snapshots in the store: model, fingerprint, size, created, key inputs.",
    "rm": "Remove a model's snapshot: one fingerprint, or --all.",
}

log = get_logger()


class SnapshotCliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Add the arguments of subcommand ``name`` (``--config``/``--log-level`` are there already)."""
    if name == "build":
        parser.add_argument("model", help="model name (or served name) from the config")
        parser.add_argument("--force", action="store_true",
                            help="replace the snapshot for this fingerprint if there is one")
        parser.add_argument("--timeout-s", type=float, default=900.0,
                            help="give up when the engine is not ready by then (default: %(default)s)")
        parser.add_argument("--json", action="store_true", help="print the result as JSON")
    elif name == "ls":
        parser.add_argument("model", nargs="?", default=None, help="only this model's snapshots")
        parser.add_argument("--json", action="store_true", help="JSON instead of a table")
    elif name == "rm":
        parser.add_argument("model", help="model name from the config")
        parser.add_argument("fingerprint", nargs="?", default=None, help="the snapshot to remove")
        parser.add_argument("--all", action="store_true", help="remove every snapshot of the model")
        parser.add_argument("--json", action="store_true",
                            help='print what was removed as one JSON document: {"removed": [{"uri", "objects"}]}')
    else:
        raise ValueError(f"unknown snapshot command {name!r}; known: {sorted(COMMANDS)}")


def _command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Errors become one line on stderr and the exit code, in one place."""

    @functools.wraps(fn)
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except SnapshotCliError as exc:
            print(f"thaw: error: {exc}", file=sys.stderr)
            return exc.code
        except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError) as exc:
            print(f"thaw: error: cannot reach the store: {exc} (is it up? `thaw store up`)", file=sys.stderr)
            return EXIT_STORE

    return run


def _config(args: argparse.Namespace) -> ThawConfig:
    from thaw.cli.common import CliError, _config_source

    try:
        path, base_dir = _config_source(args, running_stack=True)
    except CliError as exc:
        raise SnapshotCliError(str(exc), exc.code) from None
    try:
        cfg = load_config(path, base_dir)
    except ConfigError as exc:
        raise SnapshotCliError(str(exc), EXIT_INVALID) from None
    setup_logging("cli", args.log_level or cfg.log_level)
    return cfg


def _model(cfg: ThawConfig, name: str) -> Model:
    model = cfg.model(name)
    if model is None:
        known = ", ".join(m.name for m in cfg.models) or "none"
        raise SnapshotCliError(f"unknown model {name!r}; the config declares: {known}", EXIT_INVALID)
    return model


def _store(cfg: ThawConfig, buckets: set[str]) -> tuple[S3Endpoint, Any]:
    """The store's endpoint and a client, after checking that ``buckets`` answer."""
    try:
        endpoint = resolve_endpoint(cfg)
    except StoreConfigError as exc:
        raise SnapshotCliError(str(exc), EXIT_STORE) from None
    client = endpoint.client(connect_timeout=5, retries={"max_attempts": 2, "mode": "standard"})
    for bucket in sorted(buckets):
        try:
            client.head_bucket(Bucket=bucket)
        except botocore.exceptions.ClientError as exc:
            raise SnapshotCliError(f"bucket {bucket!r} does not answer ({error_code(exc)}): does it exist, and are the "
                                   "store credentials right?", EXIT_STORE) from None
    return endpoint, client


def _bucket(model: Model) -> str:
    return parse_s3_uri(model.uri)[0]


# -- build -------------------------------------------------------------------------------


@_command
def cmd_build(args: argparse.Namespace) -> int:
    """Build and upload the snapshot of one configured model (see the module docstring)."""
    from weight_streaming.push import read_manifest
    from worker.settings import AgentSettings

    cfg = _config(args)
    model = _model(cfg, args.model)
    if model.engine.enforce_eager:
        raise SnapshotCliError(
            f"model {model.name!r} runs in eager mode (engine.enforce_eager: true): vLLM compiles nothing, so "
            "there is nothing to snapshot; set enforce_eager: false to serve it compiled", EXIT_INVALID)
    endpoint, client = _store(cfg, {_bucket(model)})
    manifest = read_manifest(client, model.uri)
    if manifest is None:
        raise SnapshotCliError(f"no model at {model.uri} (no thaw-manifest.json): push it first (`thaw push`)")
    config_sha = next((f.sha256 for f in manifest.files if f.path == "config.json"), None)
    if config_sha is None:
        raise SnapshotCliError(f"the manifest at {model.uri} lists no config.json")

    # The fingerprint a worker on this machine computes (same settings defaults).
    defaults = AgentSettings(worker_id="thaw-snapshot-build", shape=model.shape, port=0, data_dir=Path("."),
                             store=endpoint)
    fp = fingerprint_of(fingerprint_inputs(
        runtime=probe_runtime(defaults.python), model_uri=model.uri, model_config_sha256=config_sha,
        engine=model.engine, max_model_len=model.max_context_tokens,
        engine_assets_dir=str(defaults.engine_assets_dir),
    ))
    loc = SnapshotLocation.for_model(model.uri, model.name, fp.id)
    try:
        existing = read_snapshot_manifest(client, loc)
    except SnapshotStoreError:
        existing = None  # unreadable: replaced below
    # One with other inputs under this id would be skipped by every worker: rebuild it.
    usable = existing is not None and existing.fingerprint == fp.id and existing.inputs == fp.inputs
    if existing is not None and usable and not args.force:
        _print_build(args, {"model": model.name, "fingerprint": fp.id, "uri": loc.uri, "result": "exists",
                            "bytes": existing.archive.size})
        return 0
    delete_snapshot(client, loc)

    data_dir = Path(tempfile.mkdtemp(prefix="thaw-snapshot-build-"))
    try:
        result = asyncio.run(_build(model, endpoint, data_dir, args.timeout_s, args.log_level or cfg.log_level))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    result.update(model=model.name, uri=loc.uri)
    if result.get("fingerprint") != fp.id:
        raise SnapshotCliError(f"the engine's fingerprint {result.get('fingerprint')} is not the expected "
                               f"{fp.id}: {result}")
    _print_build(args, result)
    return 0 if result["result"] in (CaptureStatus.UPLOADED, CaptureStatus.EXISTS) else EXIT_FAILED


async def _build(model: Model, endpoint: S3Endpoint, data_dir: Path, timeout_s: float,
                 log_level: str) -> dict[str, Any]:
    """Run a worker agent in this process: standby, assign, ready, capture, stop."""
    from thaw.wire import AssignRequest, WorkerState
    from worker.agent import Agent
    from worker.settings import AgentSettings

    settings = AgentSettings(worker_id="thaw-snapshot-build", shape=model.shape, port=0, data_dir=data_dir,
                             store=endpoint, log_level=log_level, load_timeout_s=timeout_s)
    agent = Agent(settings)
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    await agent.start()
    try:
        await _until(agent, lambda: agent.state is WorkerState.STANDBY, deadline, "the engine host to stand by")
        await agent.assign(AssignRequest(
            assignment_id="snapshot-build", model=model.name, uri=model.uri,
            served_model_name=model.resolved_served_name, max_model_len=model.max_context_tokens,
            engine=model.engine,
        ))
        t_assign = time.monotonic()
        await _until(agent, lambda: agent.state in (WorkerState.READY, WorkerState.FAILED), deadline,
                     "the engine to start")
        if agent.state is WorkerState.FAILED:
            raise SnapshotCliError(f"the engine did not start: {agent.facts.failure}")
        ready_s = time.monotonic() - t_assign
        log.info("snapshot_build_engine_ready", model=model.name, seconds=round(ready_s, 1))

        def captured() -> bool:
            snap = agent.facts.snapshot
            return snap is not None and snap.capture not in (None, CaptureStatus.RUNNING)

        await _until(agent, captured, deadline, "the snapshot upload")
        snap = agent.facts.snapshot
        assert snap is not None
        return {"fingerprint": snap.fingerprint, "result": snap.capture, "restore_status": snap.status,
                "compiled_kernels": snap.compiled_kernels, "engine_ready_s": round(ready_s, 1),
                "total_s": round(time.monotonic() - t0, 1)}
    finally:
        await agent.stop()


async def _until(agent: Any, done: Callable[[], bool], deadline: float, what: str) -> None:
    while not done():
        if time.monotonic() > deadline:
            raise SnapshotCliError(f"timed out waiting for {what} (state {agent.state.value}); "
                                   "raise --timeout-s or look at the log (--log-level debug)")
        await asyncio.sleep(0.2)


def _print_build(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(result, default=str))
    elif result["result"] == "exists" and "engine_ready_s" not in result:
        print(f"{result['model']}: snapshot {result['fingerprint']} already at {result['uri']} "
              "(--force rebuilds it)")
    else:
        print(f"{result['model']}: snapshot {result['fingerprint']} {result['result']} at {result['uri']} "
              f"(engine ready in {result.get('engine_ready_s')} s, {result.get('compiled_kernels')} kernels "
              "compiled)")


# -- ls ------------------------------------------------------------------------------------


def _row(s: StoredSnapshot) -> dict[str, Any]:
    m = s.manifest
    inputs = m.inputs if m else {}
    return {
        "model": s.model, "fingerprint": s.fingerprint, "uri": s.uri,
        "status": "complete" if m else f"unusable: {s.problem}",
        "bytes": m.archive.size if m else s.stored_bytes,
        "stored_bytes": s.stored_bytes,
        "created_at": m.created_at.isoformat() if m else None,
        "created_by": m.created_by if m else None,
        "files": m.file_count if m else None,
        "cache_dirs": m.cache_dirs if m else [],
        "vllm": inputs.get("vllm"), "torch": inputs.get("torch"),
        "device": inputs.get("device_name") or inputs.get("device"),
        "dtype": inputs.get("dtype"), "tensor_parallel_size": inputs.get("tensor_parallel_size"),
        "max_model_len": inputs.get("max_model_len"),
        "inputs": inputs,
    }


@_command
def cmd_ls(args: argparse.Namespace) -> int:
    """List snapshots (of every configured model's bucket, or of one model)."""
    cfg = _config(args)
    if args.model:
        model = _model(cfg, args.model)
        buckets, only = {_bucket(model)}, model.name
    else:
        buckets, only = {_bucket(m) for m in cfg.models} | {cfg.object_store.bucket}, None
    _, client = _store(cfg, buckets)
    rows = [_row(s) for b in sorted(buckets) for s in list_snapshots(client, b, only)]
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    if not rows:
        print("no snapshots" + (f" of {only}" if only else "") + " (workers capture one after a compiled start; "
              "`thaw snapshot build MODEL` makes one now)")
        return 0
    print(f"{'MODEL':16} {'FINGERPRINT':17} {'SIZE':>9} {'CREATED':20} {'VLLM':18} {'TORCH':14} "
          f"{'DEVICE':10} {'DTYPE':8} {'TP':>3} {'MAXLEN':>7}  STATUS")
    for r in rows:
        print(f"{r['model']:16} {r['fingerprint']:17} {r['bytes'] / 2**20:>7.1f}Mi "
              f"{(r['created_at'] or '-')[:19]:20} {r['vllm'] or '-':18} {r['torch'] or '-':14} "
              f"{r['device'] or '-':10} {r['dtype'] or '-':8} {r['tensor_parallel_size'] or '-':>3} "
              f"{r['max_model_len'] or '-':>7}  {r['status']}")
    return 0


# -- rm ------------------------------------------------------------------------------------


@_command
def cmd_rm(args: argparse.Namespace) -> int:
    """Remove one snapshot of a model, or all of them."""
    cfg = _config(args)
    model = _model(cfg, args.model)
    if bool(args.fingerprint) == bool(args.all):
        raise SnapshotCliError("name one FINGERPRINT or pass --all (not both)", EXIT_INVALID)
    bucket = _bucket(model)
    _, client = _store(cfg, {bucket})
    stored = {s.fingerprint for s in list_snapshots(client, bucket, model.name)}
    if args.fingerprint and args.fingerprint not in stored:
        have = ", ".join(sorted(stored)) or "none"
        raise SnapshotCliError(f"model {model.name!r} has no snapshot {args.fingerprint!r}; it has: {have}",
                               EXIT_INVALID)
    targets = sorted(stored) if args.all else [args.fingerprint]
    removed = []
    for fp in targets:
        loc = SnapshotLocation(bucket, model.name, fp)
        removed.append({"uri": loc.uri, "objects": delete_snapshot(client, loc)})
        if not args.json:
            print(f"removed {loc.uri} ({removed[-1]['objects']} objects)")
    if args.json:
        print(json.dumps({"model": model.name, "removed": removed}, indent=2))
    elif not targets:
        print(f"model {model.name!r} has no snapshots")
    return 0
