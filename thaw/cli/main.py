"""`thaw`: the command line. Each command is a thin shell over a library call.

Exit codes: 0 success, 1 the operation failed, 2 bad usage or invalid input
(config, model directory), 3 the store is not reachable.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from thaw.cli.common import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_STORE,
    CliError,
    _call,
    _config_path,
    _controller,
    _get,
    _load,
)
from thaw.config import (
    DEFAULT_CONFIG_PATH,
    ConfigError,
    Model,
    ThawConfig,
    hash_api_key,
    load_config,
)
from thaw.controllers import parse_urls
from thaw.log import setup_logging


def _version() -> str:
    try:
        return version("thaw-serve")
    except PackageNotFoundError:
        return "0+unknown"


# -- commands -------------------------------------------------------------------------


def _assumed_sizes(values: list[str], cfg: ThawConfig) -> dict[str | None, int]:
    """``--assume-size SIZE`` (every model) or ``NAME=SIZE``, as byte counts by model (None: all)."""
    from thaw.units import parse_size_bytes

    out: dict[str | None, int] = {}
    for v in values:
        name, _, size = v.rpartition("=")
        if name and cfg.model(name) is None:
            raise CliError(f"--assume-size {v}: no model {name!r} in the config", EXIT_INVALID)
        try:
            out[cfg.model(name).name if name else None] = parse_size_bytes(size)  # type: ignore[union-attr]
        except ValueError as exc:
            raise CliError(f"--assume-size {v}: {exc}", EXIT_INVALID) from None
    return out


def _model_sizes(cfg: ThawConfig, assumed: dict[str | None, int]) -> tuple[dict[str, object], list[str]]:
    """Each model's size: assumed, else from the store's manifest. Returns the sizes
    and notes on the models that could not be sized."""
    from thaw.fit import ModelSize

    sizes: dict[str, object] = {}
    notes: list[str] = []
    client = None
    need_store = [m for m in cfg.models if m.name not in assumed and None not in assumed]
    if need_store:
        from thaw.objstore import StoreConfigError, resolve_endpoint

        try:
            client = resolve_endpoint(cfg).client(connect_timeout=2, read_timeout=5,
                                                  retries={"max_attempts": 1, "mode": "standard"})
        except StoreConfigError as exc:
            notes.append(f"the store is not reachable ({exc})")
    for m in cfg.models:
        if m.base is not None:
            continue  # an adapter runs in its base's engine: the base's fit is the check
        size = assumed.get(m.name, assumed.get(None))
        hf_config = _read_hf_config(client, m.uri) if client is not None else None
        if size is not None:
            sizes[m.name] = ModelSize(size, "--assume-size", hf_config)
            continue
        if client is None:
            continue
        try:
            from weight_streaming.push import read_manifest

            manifest = read_manifest(client, m.uri)
        except Exception as exc:  # unreachable, refused: a note, not a verdict
            notes.append(f"{m.name}: cannot read its manifest at {m.uri} ({type(exc).__name__})")
            client = None
            continue
        if manifest is None:
            notes.append(f"{m.name}: no model at {m.uri} yet (push it, or give --assume-size)")
            continue
        sizes[m.name] = ModelSize(manifest.total_bytes, "manifest", hf_config)
    return sizes, notes


def _read_hf_config(client: object, uri: str) -> dict[str, object] | None:
    from activator.tokens import s3_fetcher

    try:
        raw = s3_fetcher(client)(uri, "config.json")
        return json.loads(raw) if raw else None
    except Exception:
        return None


def cmd_config_check(args: argparse.Namespace) -> int:
    from thaw.fit import ModelSize, fit_problem

    try:
        cfg = load_config(args.file)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_INVALID
    sizes, notes = _model_sizes(cfg, _assumed_sizes(args.assume_size or [], cfg))
    problems = []
    for i, m in enumerate(cfg.models):
        size = sizes.get(m.name)
        if isinstance(size, ModelSize):
            problem = fit_problem(i, m, cfg, size)
            if problem:
                problems.append(problem)
    if problems:
        print(f"{args.file}: invalid config\n" + "\n".join(f"  - {p}" for p in problems), file=sys.stderr)
        return EXIT_INVALID
    unsized = [m.name for m in cfg.models if m.name not in sizes and m.base is None]
    if unsized:
        print(f"note: not checked whether these models fit their shapes: {', '.join(unsized)}: "
              f"{'; '.join(notes) or 'no size known'} (give --assume-size SIZE or NAME=SIZE)", file=sys.stderr)
    print(
        f"{args.file}: ok — {len(cfg.models)} model(s), {len(cfg.shapes)} shape(s), "
        f"{len(cfg.pools)} pool(s), {len(cfg.tenants)} tenant(s); store: {cfg.object_store.kind} "
        f"({cfg.object_store.resolved_endpoint_url or 'AWS'}, bucket {cfg.object_store.bucket})"
    )
    return 0


def cmd_config_hash_key(args: argparse.Namespace) -> int:
    print(hash_api_key(args.key))
    return 0


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
    cfg = _load(args)
    stopped = _embedded(cfg).stop()
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


def cmd_status(args: argparse.Namespace) -> int:
    from thaw.cli.status import render_status
    from thaw.cli.up import endpoint_file

    cfg = _load(args)
    path = endpoint_file(cfg)
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        raise CliError(f"Thaw is not running here (no {path}); start it with `thaw up`", EXIT_STORE) from None
    state = _get(cfg, info["control_url"], "/v1/state")
    if args.json:
        print(json.dumps({"endpoint": info, **state}, indent=2))
    else:
        print(render_status(info, state))
    return 0


def _emit(args: argparse.Namespace, body: dict, render: Callable[[dict], str]) -> int:  # type: ignore[type-arg]
    """A controller's answer as JSON (--json) or as text for a person."""
    print(json.dumps(body, indent=2) if args.json else render(body))
    return 0


def cmd_pool_status(args: argparse.Namespace) -> int:
    from thaw.cli.status import render_pool

    cfg = _load(args)
    return _emit(args, _get(cfg, _controller(args, cfg), "/v1/state"), render_pool)


def cmd_pool_events(args: argparse.Namespace) -> int:
    import time

    from activator.errors import ApiError
    from activator.ledger import parse_time
    from thaw.cli.status import render_events

    cfg = _load(args)
    try:
        since = parse_time(args.since, "since") or 0.0
    except ApiError as exc:
        raise CliError(exc.message, EXIT_INVALID) from None
    params: dict[str, float | str] = {"since": since}
    if args.history:
        params["history"] = "true"
    body = _get(cfg, _controller(args, cfg), "/v1/events", **params)
    return _emit(args, body, lambda b: render_events(b["events"], now=time.time()))


def _render_budget(view: dict) -> str:  # type: ignore[type-arg]
    total = view["total_usd_per_hour"]
    out = [f"all pools: {'no budget' if total is None else f'${total:g}/h'} ({view['total_source']})",
           f"{'SHAPE':16} {'STANDBY':9} {'MAX':>4} {'BUDGET':>10}  SOURCE"]
    for p in view["pools"]:
        budget = "-" if p["usd_per_hour"] is None else f"${p['usd_per_hour']:g}/h"
        out.append(f"{p['shape']:16} {p['standby_min']}..{p['standby_max']:<6} {p['max_instances']:>4} "
                   f"{budget:>10}  {p['source']}")
    return "\n".join(out)


def cmd_pool_budget_show(args: argparse.Namespace) -> int:
    cfg = _load(args)
    return _emit(args, _get(cfg, _controller(args, cfg), "/v1/pool/budget"), _render_budget)


def cmd_pool_budget_set(args: argparse.Namespace) -> int:
    cfg = _load(args)
    change = {"shape": args.shape, "standby_min": args.standby_min, "standby_max": args.standby_max,
              "usd_per_hour": args.usd_per_hour, "total_usd_per_hour": args.total_usd_per_hour}
    change = {k: v for k, v in change.items() if v is not None}
    if set(change) <= {"shape"}:
        raise CliError("nothing to set: give --standby-min, --standby-max, --usd-per-hour (with a SHAPE) or "
                       "--total-usd-per-hour", EXIT_INVALID)
    if args.shape is None and set(change) - {"total_usd_per_hour"}:
        raise CliError("--standby-min, --standby-max and --usd-per-hour need a SHAPE", EXIT_INVALID)
    view = _call(cfg, "PUT", _controller(args, cfg), "/v1/pool/budget", body=change)
    print(_render_budget(view))
    return 0


def cmd_controller(args: argparse.Namespace) -> int:
    from thaw.serve import run_server
    from warm_pool.server import create_controller_app

    cfg = _load(args)
    setup_logging("controller", args.log_level or cfg.log_level)
    host = args.host or cfg.controller.host
    port = args.port or cfg.controller.port
    url = (args.url or (cfg.controller.url if not cfg.controller.urls else None)
           or f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}").rstrip("/")
    urls = cfg.controller.resolved_urls if cfg.controller.urls else [url]
    if url not in urls:
        raise CliError(f"this controller's URL {url} is not among controller.urls {urls} (give --url)", EXIT_INVALID)
    app = create_controller_app(cfg, _config_path(args), url, stop_local_workers=args.stop_local_workers,
                                controller_urls=urls)
    return run_server(app, host, port, graceful_s=10, on_exit=app.state.manager.stop_deciding)


def cmd_activator(args: argparse.Namespace) -> int:
    from activator.server import (
        check_activator_id,
        connection_limits,
        create_activator_app,
        default_activator_id,
        supervise,
    )
    from thaw.serve import run_server

    cfg = _load(args)
    setup_logging("activator", args.log_level or cfg.log_level)
    port, host = args.port or cfg.server.port, args.host or cfg.server.host
    try:
        controller = ",".join(parse_urls(args.controller or cfg.controller.resolved_urls))
    except ValueError as exc:
        raise CliError(f"--controller: {exc}", EXIT_INVALID) from None
    try:
        activator_id = check_activator_id(args.id) if args.id else default_activator_id(port)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    if args.workers < 1:
        raise CliError("--workers must be at least 1", EXIT_INVALID)
    if args.workers > 1:
        # N processes on one port, each its own activator (<id>.w<k>: its ledger, keys,
        # reports); local limits are split between them (Redis limits are shared anyway).
        base = [sys.executable, "-m", "thaw.cli.main", "activator", "--config", str(_config_path(args)),
                "--controller", controller, "--host", host, "--port", str(port), "--worker-of", str(args.workers)]
        if args.log_level:
            base += ["--log-level", args.log_level]
        return supervise([[*base, "--id", f"{activator_id}.w{k}"] for k in range(args.workers)])
    processes = args.worker_of or 1
    app = create_activator_app(cfg, controller, activator_id, processes=processes)
    return run_server(app, host, port, graceful_s=30, reuse_port=processes > 1,
                      limits=connection_limits(cfg.server))


def cmd_worker(args: argparse.Namespace) -> int:
    from worker.__main__ import run

    return run(args, _load(args))


def cmd_usage(args: argparse.Namespace) -> int:
    import csv
    import time

    from activator.errors import ApiError
    from activator.ledger import attribute_gpu_seconds, parse_time, usage_totals
    from activator.shipping import CLIENT_CONFIG
    from activator.usage_store import UsageReader, describe_lag, local_ledgers, read_usage
    from thaw.objstore import StoreConfigError, resolve_endpoint

    cfg = _load(args)
    try:
        since, until = parse_time(args.since, "since"), parse_time(args.until, "until")
    except ApiError as exc:
        raise CliError(exc.message, EXIT_INVALID) from None
    # Every activator's shipped segments, plus the ledgers of the activators on this
    # machine (the originals, with what is not shipped yet); each record counted once.
    local = local_ledgers(cfg)
    reader, no_store = None, "ledger.ship is false"
    if cfg.ledger.ship:
        try:
            client = resolve_endpoint(cfg).client(**CLIENT_CONFIG)
            reader = UsageReader(client, cfg.object_store.bucket, cfg.ledger.ship_prefix)
        except StoreConfigError as exc:
            no_store = f"the object store is not available ({exc})"
    now = time.time()
    # All tenants' records in the window: GPU-seconds are split by every tenant's tokens.
    fleet = read_usage(reader, local, since=since, until=until, now=now, no_store=no_store)
    if not fleet.complete and not local:
        raise CliError(f"no usage to read: {fleet.reason}, and no activator ledger under "
                       f"{cfg.data_dir / 'activators'}", EXIT_STORE if cfg.ledger.ship else EXIT_FAILED)
    records = [r for r in fleet.records if args.tenant is None or r["tenant"] == args.tenant]
    # Prices: each record's at the model revision that answered it, from the controller.
    price_of, no_prices = None, None
    try:
        from activator.billing import prices_from_registry

        price_of = prices_from_registry(_get(cfg, _controller(args, cfg), "/v1/admin/models")["models"])
    except CliError as exc:
        no_prices = f"no costs: {exc}"
    if args.format == "csv":
        from activator.billing import token_cost

        # Records shipped by older activators lack the newer columns (left empty).
        columns = list(dict.fromkeys(k for r in records for k in r)) + ["tokens_usd"]
        writer = csv.DictWriter(sys.stdout, fieldnames=columns, restval="")
        if records:
            writer.writeheader()
        for r in records:
            price = price_of(r["model"], r.get("revision")) if price_of else None
            writer.writerow({**r, "tokens_usd": round(token_cost(r, price, cfg.batch.price_factor), 9)
                             if price else ""})
        print(describe_lag(fleet), file=sys.stderr)
        if no_prices:
            print(no_prices, file=sys.stderr)
        return 0
    from activator.billing import costs, is_batch

    gpu = attribute_gpu_seconds(fleet.records, fleet.intervals, now=now, by=lambda r: (r["tenant"], r["model"]))
    cost = costs(fleet.records, fleet.intervals, price_of, now=now,
                 batch_factor=cfg.batch.price_factor) if price_of else {}
    pairs = sorted({(r["tenant"], r["model"] or "-") for r in records})
    rows = {}
    for t, model in pairs:
        mine = [r for r in records if r["tenant"] == t and (r["model"] or "-") == model]
        c = cost.get((t, None if model == "-" else model), {})
        rows[(t, model)] = {**usage_totals(mine), "gpu_seconds": round(gpu.get((t, None if model == "-" else model),
                                                                                0.0), 3),
                            "cost_usd": round(c["cost_usd"], 6) if c else None,
                            "unpriced_requests": int(c.get("unpriced", 0)) if c else None}
        batch = [r for r in mine if is_batch(r)]
        if batch:
            # A batch's lines apart (in the totals above too), at batch.price_factor.
            rows[(t, model)]["batch"] = {**usage_totals(batch),
                                         "cost_usd": round(c["batch_usd"], 6) if c else None}
    if args.format == "json":
        # Per tenant its totals across models (as before models were priced), and per model.
        tenants: dict[str, dict[str, Any]] = {}
        for t in sorted({t for t, _ in rows}):
            by_model = {model: v for (tt, model), v in rows.items() if tt == t}
            costs_known = [v["cost_usd"] for v in by_model.values() if v["cost_usd"] is not None]
            tenants[t] = {**usage_totals(r for r in records if r["tenant"] == t),
                          "gpu_seconds": round(sum(v["gpu_seconds"] for v in by_model.values()), 3),
                          "cost_usd": round(sum(costs_known), 6) if costs_known else None,
                          "unpriced_requests": sum(v["unpriced_requests"] or 0 for v in by_model.values())
                          if costs_known else None,
                          "models": by_model}
        print(json.dumps({"tenants": tenants, "records": records, "shipping": fleet.shipping(),
                          "complete": fleet.complete, "incomplete_reason": fleet.reason, "prices_note": no_prices},
                         indent=2))
        return 0
    print(f"{'TENANT':16} {'MODEL':20} {'REQUESTS':>8} {'PROMPT':>9} {'COMPLETION':>10} {'CACHED':>8} {'ERRORS':>6} "
          f"{'COLD':>5} {'GPU-S':>9} {'COST-USD':>10}")
    for (t, model), v in rows.items():
        shown = "-" if v["cost_usd"] is None else f"{v['cost_usd']:.4f}" + ("*" if v["unpriced_requests"] else "")
        print(f"{t:16} {model[:20]:20} {v['requests']:>8} {v['prompt_tokens']:>9} {v['completion_tokens']:>10} "
              f"{v['cached_tokens']:>8} {v['errors']:>6} {v['cold_starts']:>5} {v['gpu_seconds']:>9.1f} {shown:>10}")
        if "batch" in v:
            b = v["batch"]
            cost_b = "-" if b["cost_usd"] is None else f"{b['cost_usd']:.4f}"
            print(f"{'':16} {'  of which batch':20} {b['requests']:>8} {b['prompt_tokens']:>9} "
                  f"{b['completion_tokens']:>10} {b['cached_tokens']:>8} {b['errors']:>6} {'':>5} {'':>9} {cost_b:>10}")
    if not rows:
        print("no usage in that window")
    if any(v["unpriced_requests"] for v in rows.values()):
        print("* some requests have no price (a model without pricing, or a record without a revision)")
    if no_prices:
        print(no_prices)
    print(describe_lag(fleet))
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from thaw.cli.up import run_up

    cfg = _load(args)
    try:
        return run_up(cfg, _config_path(args), port=args.port)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None


# -- parser -----------------------------------------------------------------------------

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="thaw",
        description="Thaw: scale-to-zero serving for open-weight LLMs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"thaw {_version()}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE",
                        help=f"config file (default: $THAW_CONFIG or {DEFAULT_CONFIG_PATH})")
    common.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(parent: argparse._SubParsersAction, name: str, help_: str, fn: Handler,  # type: ignore[type-arg]
            with_common: bool = True) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help_, description=help_, parents=[common] if with_common else [])
        p.set_defaults(fn=fn)
        return p

    p = add(sub, "up", "Run the embedded platform: store, control plane, activator, standby workers.", cmd_up)
    p.add_argument("--port", type=int, default=None, help="activator port (default: server.port)")
    p = add(sub, "status", "Show models (replicas, queue, last cold start) and workers of a running `thaw up`.",
            cmd_status)
    p.add_argument("--json", action="store_true")

    p = add(sub, "controller", "Run the controller: the pool manager, its API and the providers.", cmd_controller)
    p.add_argument("--host", default=None, help="listen address (default: controller.host)")
    p.add_argument("--port", type=int, default=None, help="listen port (default: controller.port, 8100)")
    p.add_argument("--stop-local-workers", action="store_true",
                   help="terminate the local pool's workers on exit (`thaw up`); by default they keep "
                        "serving for the next controller to adopt")
    p.add_argument("--url", default=None,
                   help="where the others reach this controller, one of controller.urls when several share "
                        "one PostgreSQL (default: controller.url, else http://HOST:PORT)")
    p = add(sub, "activator", "Run an activator: the OpenAI-compatible API.", cmd_activator)
    p.add_argument("--controller", metavar="URL[,URL]", default=None,
                   help="the controllers (it follows the leader); default: controller.urls or controller.url")
    p.add_argument("--host", default=None, help="listen address (default: server.host)")
    p.add_argument("--port", type=int, default=None, help="listen port (default: server.port)")
    p.add_argument("--id", default=None,
                   help="this activator's name: its reports, its local ledger and keys under "
                        "<data_dir>/activators/ID, its usage segments (default: HOST-PORT, the same on "
                        "every start)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="processes sharing the port (SO_REUSEPORT), one per core; each is activator "
                        "ID.wK and takes 1/N of a local limit (default 1)")
    p.add_argument("--worker-of", type=int, default=None, help=argparse.SUPPRESS)
    from worker.__main__ import add_arguments as worker_arguments

    p = add(sub, "worker", "Run the worker agent of one instance (started by a provider).", cmd_worker)
    worker_arguments(p)

    pool = sub.add_parser("pool", help="The warm pool: workers, shapes, models, and the controller's decisions.")
    pl_sub = pool.add_subparsers(dest="pool_command", metavar="SUBCOMMAND", required=True)
    p = add(pl_sub, "status", "Per shape, model and worker: states, targets, budget and spend.", cmd_pool_status)
    p.add_argument("--controller", metavar="URL", default=None)
    p.add_argument("--json", action="store_true")
    p = add(pl_sub, "events", "Every decision the controller carried out, with its reason and inputs.",
            cmd_pool_events)
    p.add_argument("--controller", metavar="URL", default=None)
    p.add_argument("--since", default="1h", help="epoch seconds, ISO time, or a duration back (default 1h)")
    p.add_argument("--history", action="store_true",
                   help="the decision log in the state database: every leader's events, each with its "
                        "controller and term (default: this controller's recent events)")
    p.add_argument("--json", action="store_true")
    from thaw.cli import simulate as simulate_cli

    p = add(pl_sub, "recommend", "Sweep warm-pool settings on a request trace and print the cheapest config "
            "that meets a TTFT p99 target.", simulate_cli.cmd_recommend, with_common=False)
    simulate_cli.add_recommend_arguments(p)
    budget = pl_sub.add_parser("budget", help="Show or change standby bands and budgets at run time.")
    b_sub = budget.add_subparsers(dest="budget_command", metavar="SUBCOMMAND", required=True)
    p = add(b_sub, "show", "Each pool's standby band and budget, and the budget across all pools.",
            cmd_pool_budget_show)
    p.add_argument("--controller", metavar="URL", default=None)
    p.add_argument("--json", action="store_true")
    p = add(b_sub, "set", "Change a pool's standby band or budget, or the total budget; kept across restarts.",
            cmd_pool_budget_set)
    p.add_argument("shape", metavar="SHAPE", nargs="?", default=None)
    p.add_argument("--standby-min", type=int, default=None)
    p.add_argument("--standby-max", type=int, default=None)
    p.add_argument("--usd-per-hour", type=float, default=None, help="the pool's budget for standby + asleep")
    p.add_argument("--total-usd-per-hour", type=float, default=None, help="the budget across all pools")
    p.add_argument("--controller", metavar="URL", default=None)

    cfg = sub.add_parser("config", help="Check a config file or hash an API key.")
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    p = add(cfg_sub, "check", "Validate a config file and print its problems, one per line.",
            cmd_config_check, with_common=False)
    p.add_argument("file", metavar="FILE")
    p.add_argument("--assume-size", action="append", metavar="[NAME=]SIZE", default=None,
                   help="weights size when the store cannot say (e.g. 140GiB, or llama-70b=140GiB); repeatable")
    p = add(cfg_sub, "hash-key", "Print the hash of an API key, as stored in tenants[].api_key_hashes.",
            cmd_config_hash_key, with_common=False)
    p.add_argument("key", metavar="KEY")

    store = sub.add_parser("store", help="Start, stop or inspect the embedded S3 store (SeaweedFS).")
    st_sub = store.add_subparsers(dest="store_command", metavar="SUBCOMMAND", required=True)
    add(st_sub, "up", "Start the embedded store on loopback and create the bucket.", cmd_store_up)
    add(st_sub, "down", "Stop the embedded store (waits for a clean shutdown).", cmd_store_down)
    add(st_sub, "status", "Say whether the embedded store is running.", cmd_store_status)
    p = add(st_sub, "ls", "List model prefixes in the store, with their manifests.", cmd_store_ls)
    p.add_argument("--json", action="store_true")

    p = add(sub, "demo-model", "Build the tiny demo Llama (deterministic by seed) as safetensors.",
            cmd_demo_model)
    p.add_argument("out_dir", metavar="OUT_DIR")
    p.add_argument("--size", default="tiny", help="'tiny' (default) or a target size such as 1GiB")
    p.add_argument("--seed", type=int, default=None, help="default 0 (a model), 1 (an adapter)")
    p.add_argument("--adapter-of", metavar="BASE_DIR", default=None,
                   help="build a LoRA adapter (PEFT layout) of the demo model in BASE_DIR instead")
    p.add_argument("--rank", type=int, default=None, help="the adapter's LoRA rank (default 8)")
    p.add_argument("--overwrite", action="store_true", help="replace the files of an earlier build in OUT_DIR")

    from thaw.cli import plan as plan_cli

    p = add(sub, "plan", "Size a deployment: traffic and SLOs in, GPUs, instances, dollars and watts out.",
            plan_cli.run, with_common=False)
    plan_cli.add_arguments(p)

    p = add(sub, "push", "Upload a model directory to the store and write its manifest.", cmd_push)
    p.add_argument("dir", metavar="DIR")
    p.add_argument("uri", metavar="S3_URI", help="s3://bucket/prefix")
    p.add_argument("--concurrency", type=int, default=8, help="parallel parts per file (default 8)")
    p.add_argument("--json", action="store_true", help="JSON lines even on a terminal")

    from thaw.cli import simulate as simulate_cli

    p = add(sub, "simulate", "Replay a request trace against the warm-pool policy: cold starts, TTFT, cost.",
            simulate_cli.run, with_common=False)
    simulate_cli.add_arguments(p)

    # Commands whose arguments live with their code (light imports only at parser time).
    from loadtests import (
        bench_activator,
        bench_batch,
        bench_cold_start,
        bench_conversations,
        bench_simulate,
        bench_stream,
    )
    from thaw.cli import snapshot as snapshot_cli

    bench = sub.add_parser("bench", help="Run a benchmark (baseline and Thaw in one run) and write JSON.")
    b_sub = bench.add_subparsers(dest="bench_command", metavar="SUBCOMMAND", required=True)
    for name, mod, help_ in (
        ("cold-start", bench_cold_start, "Request at zero to first token: plain vLLM from S3 vs Thaw's tiers."),
        ("stream", bench_stream, "Weights from the store: ceiling vs Thaw's streamer vs runai vs boto3+safetensors."),
        ("activator", bench_activator, "What the activator adds in front of a replica, with vllm-router as a peer."),
        ("simulate", bench_simulate, "Simulated requests per second on a long many-model trace, fast vs exact mode."),
        ("batch", bench_batch, "Online TTFT with and without a concurrent batch (on a lent standby, on spare "
                               "slots), and batch throughput."),
        ("conversations", bench_conversations, "Continued conversations: Thaw's Responses API and prefix routing "
                                               "vs a round-robin balancer over the same engines."),
    ):
        p = add(b_sub, name, help_, mod.run)
        mod.add_arguments(p)

    from loadtests import load_calibrate, load_report, load_run

    load = sub.add_parser("load", help="Replay a request trace against a running Thaw and report on it.")
    l_sub = load.add_subparsers(dest="load_command", metavar="SUBCOMMAND", required=True)
    for name, mod, help_ in (
        ("run", load_run, "Replay a trace open loop against an OpenAI endpoint; record every request."),
        ("report", load_report, "TTFT, TPOT, errors and goodput of a `thaw load run` directory, with plots."),
        ("calibrate", load_calibrate, "Measure the cost model on a stack of its own, replay a trace live and "
                                      "simulated, compare them side by side."),
    ):
        p = add(l_sub, name, help_, mod.run, with_common=False)
        mod.add_arguments(p)

    snap = sub.add_parser("snapshot", help="Build, list or remove engine snapshots (compile caches) in the store.")
    s_sub = snap.add_subparsers(dest="snapshot_command", metavar="SUBCOMMAND", required=True)
    for name, help_ in snapshot_cli.COMMANDS.items():
        p = add(s_sub, name, help_, getattr(snapshot_cli, f"cmd_{name}"))
        snapshot_cli.add_arguments(name, p)

    p = add(sub, "usage", "Usage per tenant and model across every activator: tokens, errors, cold starts, "
            "GPU-seconds, cost.", cmd_usage)
    p.add_argument("--tenant", default=None)
    p.add_argument("--controller", metavar="URL", default=None, help="where the prices are (the model registry)")
    p.add_argument("--since", default=None, help="epoch seconds, ISO time, or a duration back (15m, 2h, 7d)")
    p.add_argument("--until", default=None)
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")

    from thaw.cli import tenants as tenants_cli

    tenants_cli.add_parsers(sub, add)

    from thaw.cli import batches as batches_cli

    batches_cli.add_parsers(sub, add)

    from thaw.cli import admin_keys as admin_keys_cli

    admin_keys_cli.add_parsers(sub, add)

    from thaw.cli import aws as aws_cli

    aws_cli.add_parsers(sub, add)

    from thaw.cli import models as models_cli

    p = add(sub, "apply", "Make the models and tenants served match a file (prints the plan first; "
            "all or nothing).", models_cli.run_apply)
    models_cli.add_apply_arguments(p)

    models = sub.add_parser("models", help="Deploy, change, roll back, remove and list the models served "
                                           "(at the controller; every activator follows within a second).")
    m_sub = models.add_subparsers(dest="models_command", metavar="SUBCOMMAND", required=True)
    for name, help_ in models_cli.COMMANDS.items():
        p = add(m_sub, name, help_, models_cli.run)
        models_cli.add_arguments(name, p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except CliError as exc:
        print(f"thaw: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
