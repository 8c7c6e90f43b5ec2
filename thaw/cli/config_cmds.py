"""`thaw config check` and `thaw config hash-key`: a config validated as the services
would load it, with each model's fit on its shape (sizes from the store, or assumed)."""

from __future__ import annotations

import argparse
import json
import sys

from thaw.cli.common import (
    EXIT_INVALID,
    CliError,
)
from thaw.config import (
    ConfigError,
    ThawConfig,
    hash_api_key,
    load_config,
)


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

    as_json = getattr(args, "json", False)
    try:
        cfg = load_config(args.file)
    except ConfigError as exc:
        if as_json:
            print(json.dumps({"file": str(args.file), "ok": False, "problems": [str(exc)], "notes": []}, indent=2))
        else:
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
    unsized = [m.name for m in cfg.models if m.name not in sizes and m.base is None]
    if as_json:
        print(json.dumps({"file": str(args.file), "ok": not problems, "problems": problems, "notes": notes,
                          "unsized_models": unsized, "models": len(cfg.models), "shapes": len(cfg.shapes),
                          "pools": len(cfg.pools), "tenants": len(cfg.tenants),
                          "store": {"kind": cfg.object_store.kind, "endpoint_url":
                                    cfg.object_store.resolved_endpoint_url, "bucket": cfg.object_store.bucket}},
                         indent=2))
        return EXIT_INVALID if problems else 0
    if problems:
        print(f"{args.file}: invalid config\n" + "\n".join(f"  - {p}" for p in problems), file=sys.stderr)
        return EXIT_INVALID
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
