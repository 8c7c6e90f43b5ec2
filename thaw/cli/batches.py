"""`thaw batches ...`: every tenant's batches at the controller, for operators: list
them (by tenant or status), show one, cancel one."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from thaw.cli.common import (
    _call,
    _controller,
    _get,
    _load,
    add_controller_argument,
    add_json_argument,
)

COMMANDS = {
    "ls": "List the newest batches of every tenant (or --tenant's), with their progress.",
    "show": "Show one batch: its status, timestamps, counts, files and errors.",
    "cancel": "Cancel a batch: no more of its lines start; it ends once those running finish.",
}


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    add_controller_argument(p)
    add_json_argument(p, "print the controller's JSON")
    if name == "ls":
        p.add_argument("--tenant", default=None, help="only this tenant's batches")
        p.add_argument("--status", default=None, choices=["validating", "failed", "in_progress", "finalizing",
                                                          "completed", "expired", "cancelling", "cancelled"],
                       help="only batches in this status")
        p.add_argument("--limit", type=int, default=100, metavar="N", help="the newest N (default 100)")
    if name in ("show", "cancel"):
        p.add_argument("batch_id", metavar="BATCH_ID", help="the batch's id (batch_...)")


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _row(b: dict[str, Any]) -> str:
    c = b["request_counts"]
    return (f"{b['id'][:38]:38} {b['tenant'][:14]:14} {b['status']:11} {c['completed']:>6}/{c['total']:<6} "
            f"{c['failed']:>6} {_when(b['created_at'])}")


def run(args: argparse.Namespace) -> int:
    cfg = _load(args)
    url = _controller(args, cfg)
    command = args.batches_command
    if command == "ls":
        params = {k: v for k, v in (("tenant", args.tenant), ("status", args.status), ("limit", args.limit))
                  if v is not None}
        found = _get(cfg, url, "/v1/admin/batches", **params)
        if args.json:
            print(json.dumps(found, indent=2))
            return 0
        print(f"{'BATCH':38} {'TENANT':14} {'STATUS':11} {'DONE/TOTAL':>13} {'FAILED':>6} CREATED (UTC)")
        for b in found["data"]:
            print(_row(b))
        if not found["data"]:
            print("no batches")
    elif command == "show":
        b = _get(cfg, url, f"/v1/admin/batches/{args.batch_id}")
        if args.json:
            print(json.dumps(b, indent=2))
            return 0
        c = b["request_counts"]
        print(f"{b['id']}  tenant {b['tenant']}  {b['endpoint']}  {b['status']}")
        print(f"  lines: {c['total']}, answered {c['completed']}, failed {c['failed']}")
        print(f"  input {b['input_file_id']}  output {b['output_file_id'] or '-'}  errors {b['error_file_id'] or '-'}")
        for name in ("created_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
                     "cancelling_at", "cancelled_at", "expires_at"):
            if b.get(name) is not None:
                print(f"  {name.removesuffix('_at'):12} {_when(b[name])}")
        for e in b["errors"]:
            print(f"  error: {e['code']}: {e['message']}")
    elif command == "cancel":
        b = _call(cfg, "POST", url, f"/v1/admin/batches/{args.batch_id}/cancel")
        print(json.dumps(b, indent=2) if args.json else f"{b['id']}: {b['status']}")
    return 0


def add_parsers(sub: argparse._SubParsersAction, add: Any) -> None:  # type: ignore[type-arg]
    bat = sub.add_parser("batches", help="Every tenant's batches at the controller (operators).")
    b_sub = bat.add_subparsers(dest="batches_command", metavar="SUBCOMMAND", required=True)
    for name, help_ in COMMANDS.items():
        add_arguments(name, add(b_sub, name, help_, run, needs="controller"))
