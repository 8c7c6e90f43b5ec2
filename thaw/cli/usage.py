"""`thaw usage`: a tenant's (or every tenant's) requests, tokens, GPU-seconds and cost,
from every activator's shipped ledger."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from thaw.cli.common import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_STORE,
    CliError,
    _controller,
    _get,
    _load,
)

if TYPE_CHECKING:
    from activator.billing import PriceOf
    from activator.usage_store import FleetUsage
    from thaw.config import ThawConfig


def cmd_usage(args: argparse.Namespace) -> int:
    import time

    from activator.errors import ApiError
    from activator.ledger import parse_time

    cfg = _load(args)
    try:
        since, until = parse_time(args.since, "since"), parse_time(args.until, "until")
    except ApiError as exc:
        raise CliError(exc.message, EXIT_INVALID) from None
    now = time.time()
    fleet = _read_fleet(cfg, since, until, now)
    records = [r for r in fleet.records if args.tenant is None or r["tenant"] == args.tenant]
    price_of, no_prices = _prices(args, cfg)
    if args.format == "csv":
        _write_csv(cfg, fleet, records, price_of, no_prices)
        return 0
    rows = _rows(cfg, fleet, records, price_of, now)
    if args.format == "json":
        _print_json(fleet, records, rows, no_prices)
    else:
        _print_table(fleet, rows, no_prices)
    return 0


def _read_fleet(cfg: ThawConfig, since: float | None, until: float | None, now: float) -> FleetUsage:
    """All tenants' records in the window (GPU-seconds are split by every tenant's
    tokens): every activator's shipped segments, plus the ledgers of the activators on
    this machine (the originals, with what is not shipped yet); each record counted once."""
    from activator.shipping import CLIENT_CONFIG
    from activator.usage_store import UsageReader, local_ledgers, read_usage
    from thaw.objstore import StoreConfigError, resolve_endpoint

    local = local_ledgers(cfg)
    reader, no_store = None, "ledger.ship is false"
    if cfg.ledger.ship:
        try:
            client = resolve_endpoint(cfg).client(**CLIENT_CONFIG)
            reader = UsageReader(client, cfg.object_store.bucket, cfg.ledger.ship_prefix)
        except StoreConfigError as exc:
            no_store = f"the object store is not available ({exc})"
    fleet = read_usage(reader, local, since=since, until=until, now=now, no_store=no_store)
    if not fleet.complete and not local:
        raise CliError(f"no usage to read: {fleet.reason}, and no activator ledger under "
                       f"{cfg.data_dir / 'activators'}", EXIT_STORE if cfg.ledger.ship else EXIT_FAILED)
    return fleet


def _prices(args: argparse.Namespace, cfg: ThawConfig) -> tuple[PriceOf | None, str | None]:
    """Each record's price at the model revision that answered it, from the controller;
    else None and why there are no costs."""
    try:
        from activator.billing import prices_from_registry

        return prices_from_registry(_get(cfg, _controller(args, cfg), "/v1/admin/models")["models"]), None
    except CliError as exc:
        return None, f"no costs: {exc}"


def _write_csv(cfg: ThawConfig, fleet: FleetUsage, records: list[dict[str, Any]], price_of: PriceOf | None,
               no_prices: str | None) -> None:
    import csv

    from activator.billing import token_cost
    from activator.usage_store import describe_lag

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


def _rows(cfg: ThawConfig, fleet: FleetUsage, records: list[dict[str, Any]], price_of: PriceOf | None,
          now: float) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (tenant, model or "-"): the totals of ``records``, GPU-seconds and cost (of
    the whole fleet's records), and a batch's lines apart."""
    from activator.billing import costs, is_batch
    from activator.ledger import attribute_gpu_seconds, usage_totals

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
    return rows


def _print_json(fleet: FleetUsage, records: list[dict[str, Any]], rows: dict[tuple[str, str], dict[str, Any]],
                no_prices: str | None) -> None:
    from activator.ledger import usage_totals

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


def _print_table(fleet: FleetUsage, rows: dict[tuple[str, str], dict[str, Any]], no_prices: str | None) -> None:
    from activator.usage_store import describe_lag

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
