"""`thaw store up|down|status|ls`, `thaw push` and `thaw demo-model`: the embedded
store, and models into it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from thaw.cli.common import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_STORE,
    CliError,
    _load,
)
from thaw.config import (
    Model,
    ThawConfig,
)
from thaw.log import setup_logging


def _embedded(cfg: ThawConfig):  # type: ignore[no-untyped-def]
    from thaw.embedded_store import EmbeddedStore
    from thaw.objstore import embedded_store_root

    if cfg.object_store.kind != "embedded":
        raise CliError("object_store.kind is 's3': there is no embedded store to manage", EXIT_INVALID)
    return EmbeddedStore(
        embedded_store_root(cfg), s3_port=cfg.object_store.embedded.s3_port,
        bucket=cfg.object_store.bucket, region=cfg.object_store.region,
    )


def cmd_store_up(args: argparse.Namespace) -> int:
    from thaw.embedded_store import StoreError

    cfg = _load(args)
    store = _embedded(cfg)
    try:
        ep = store.start(timeout_s=cfg.object_store.embedded.startup_timeout_s, detach=True)
    except StoreError as exc:
        raise CliError(str(exc), EXIT_STORE) from None
    print(json.dumps({"endpoint_url": ep.endpoint_url, "bucket": cfg.object_store.bucket,
                      "pid": store.running_pid(), "data": str(store.data_dir)}))
    return 0


def cmd_store_down(args: argparse.Namespace) -> int:
    from thaw.cli.stack import using

    cfg = _load(args)
    store = _embedded(cfg)
    stack = using(cfg.data_dir)
    if stack is not None and not args.force:
        # Stopped under it, the stack's models could not load and its usage not ship.
        raise CliError(f"the store in {store.root} is in use by the running `thaw up` (pid {stack.pid}, "
                       f"config {stack.config}): stop that first (Ctrl-C where it runs stops the store with it), "
                       "or give --force to stop the store under it", EXIT_FAILED)
    stopped = store.stop()
    if args.json:
        print(json.dumps({"stopped": stopped}))
    else:
        print("store stopped" if stopped else "store was not running")
    return 0


def cmd_store_status(args: argparse.Namespace) -> int:
    cfg = _load(args)
    store = _embedded(cfg)
    pid = store.running_pid()
    print(json.dumps({"running": pid is not None, "pid": pid,
                      "endpoint_url": store.endpoint().endpoint_url if pid else None}))
    return 0 if pid else EXIT_STORE


def cmd_demo_model(args: argparse.Namespace) -> int:
    from thaw.demo_model import build_demo_model, describe

    setup_logging("cli", args.log_level or "warning")
    if args.adapter_of is not None:
        from thaw.demo_adapter import DEFAULT_RANK, build_demo_adapter

        try:
            adapter = build_demo_adapter(Path(args.out_dir), Path(args.adapter_of), rank=args.rank or DEFAULT_RANK,
                                         seed=1 if args.seed is None else args.seed, overwrite=args.overwrite)
        except (ValueError, FileExistsError, FileNotFoundError, KeyError) as exc:
            raise CliError(f"cannot build an adapter of {args.adapter_of}: {exc}", EXIT_INVALID) from None
        print(f"LoRA adapter of {adapter.base} (rank {adapter.rank}, seed {adapter.seed}) in {adapter.path}:")
        for f in adapter.files:
            print(f"  {f.name:28} {f.size_bytes:>10} bytes  sha256 {(f.sha256 or '')[:16]}...")
        return 0
    if args.rank is not None:
        raise CliError("--rank is for an adapter (--adapter-of BASE_DIR)", EXIT_INVALID)
    args.seed = 0 if args.seed is None else args.seed
    try:
        info = build_demo_model(Path(args.out_dir), size=args.size, seed=args.seed, overwrite=args.overwrite)
    except (ValueError, FileExistsError) as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    print(describe(info.path))
    return 0


def _client(cfg: ThawConfig):  # type: ignore[no-untyped-def]
    from thaw.objstore import StoreConfigError, resolve_endpoint

    try:
        return resolve_endpoint(cfg).client()
    except StoreConfigError as exc:
        raise CliError(str(exc), EXIT_STORE) from None


def cmd_push(args: argparse.Namespace) -> int:
    import botocore.exceptions

    from thaw.cli.progress import JsonLinesProgress, ProgressBar
    from thaw.s3uri import S3UriError
    from weight_streaming.push import InvalidModelDir, PushError, push_model

    cfg = _load(args)
    try:
        cfg.object_store.check_model_uri(args.uri)
    except S3UriError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    reporter = ProgressBar(sys.stderr) if sys.stderr.isatty() and not args.json else JsonLinesProgress(sys.stdout)
    try:
        manifest = push_model(_client(cfg), Path(args.dir), args.uri,
                              max_concurrency=args.concurrency, progress=reporter)
    except PushError as exc:
        reporter.close()
        raise CliError(str(exc), EXIT_INVALID if isinstance(exc, InvalidModelDir) else EXIT_FAILED) from None
    except botocore.exceptions.EndpointConnectionError as exc:
        reporter.close()
        raise CliError(f"cannot reach the store: {exc} (is it up? `thaw store up`)", EXIT_STORE) from None
    reporter.close()
    summary = {"event": "pushed", "uri": manifest.uri, "files": len(manifest.files),
               "bytes": manifest.total_bytes, "parameters": manifest.parameter_count, "dtypes": manifest.dtypes}
    print(json.dumps(summary) if not sys.stdout.isatty() else
          f"pushed {manifest.uri}: {len(manifest.files)} files, {manifest.total_bytes / 2**20:.1f} MiB, "
          f"{manifest.parameter_count:,} parameters ({', '.join(manifest.dtypes)})")
    return 0


def cmd_store_ls(args: argparse.Namespace) -> int:
    import botocore.exceptions

    from thaw.engine_class import engine_class_of
    from thaw.objstore import read_model_config
    from weight_streaming.push import list_models

    cfg = _load(args)
    client = _client(cfg)
    try:
        models = list_models(client, cfg.object_store.bucket)
    except botocore.exceptions.EndpointConnectionError as exc:
        raise CliError(f"cannot reach the store: {exc} (is it up? `thaw store up`)", EXIT_STORE) from None
    except botocore.exceptions.ClientError as exc:
        raise CliError(f"cannot list bucket {cfg.object_store.bucket!r}: {exc}", EXIT_STORE) from None
    configured: dict[str, list[Model]] = {}
    for cm in cfg.models:
        configured.setdefault(cm.uri.rstrip("/"), []).append(cm)
    rows: list[dict[str, Any]] = []
    for m in models:
        man = m.manifest
        # The engine class of each model configured on these weights (its engine
        # settings are part of it): models of one class can swap into one engine.
        classes: dict[str, str] = {}
        config = read_model_config(client, m.uri) if man and configured.get(m.uri) else None
        for cm in configured.get(m.uri, []) if config else []:
            try:
                classes[cm.name] = engine_class_of(config or {}, cfg.engine_args(cm),
                                                   max_model_len=cm.max_context_tokens).id
            except ValueError as exc:
                classes[cm.name] = f"none ({exc})"
        rows.append({
            "uri": m.uri,
            "status": "complete" if man else "incomplete (no manifest: interrupted push?)",
            "configured_as": [cm.name for cm in configured.get(m.uri, [])],
            "engine_classes": classes,
            "bytes": man.total_bytes if man else m.stored_bytes,
            "parameters": man.parameter_count if man else None,
            "dtypes": man.dtypes if man else [],
            "files": len(man.files) if man else None,
            "pushed_at": man.created_at.isoformat() if man else None,
        })
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no models in s3://{cfg.object_store.bucket} (push one with `thaw push DIR s3://...`)")
        return 0
    print(f"{'URI':40} {'STATUS':10} {'SIZE':>10} {'PARAMS':>12} {'DTYPES':10} {'PUSHED':20} "
          f"CONFIGURED AS (ENGINE CLASS)")
    for r in rows:
        as_ = ", ".join(f"{n} ({r['engine_classes'].get(n, '-')})" for n in r["configured_as"]) or "-"
        print(f"{r['uri']:40} {r['status'].split()[0]:10} {r['bytes'] / 2**20:>8.1f}Mi "
              f"{(format(r['parameters'], ',') if r['parameters'] is not None else '-'):>12} "
              f"{','.join(r['dtypes']) or '-':10} {(r['pushed_at'] or '-')[:19]:20} {as_}")
    return 0
