"""`thaw admin-keys ...`: keys for the controller's model and tenant API (`thaw models`,
`thaw tenants`, `thaw apply`) in place of the cluster token. Only the cluster token
manages them; a command run with `THAW_ADMIN_KEY` set sends that key instead."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from thaw.cli.common import (
    _call,
    _controller,
    _get,
    _load,
    add_controller_argument,
    add_json_argument,
    print_json,
)

COMMANDS = {
    "add": "Create an admin key; prints it once.",
    "ls": "List admin keys (prefixes and labels only).",
    "revoke": "Revoke an admin key (the key, its sha256, or its listed prefix).",
}


def run(args: argparse.Namespace) -> int:
    cfg = _load(args)
    url = _controller(args, cfg)
    if args.admin_keys_command == "add":
        reply = _call(cfg, "POST", url, "/v1/keys/admin", body={"label": args.label})
        if args.json:
            print_json(reply)
        else:
            print(reply["key"])
        print("admin key (shown once; stored only as a hash): give it as THAW_ADMIN_KEY to `thaw models`, "
              "`thaw tenants` and `thaw apply`, or as the bearer token of /v1/admin/", file=sys.stderr)
    elif args.admin_keys_command == "revoke":
        reply = _call(cfg, "POST", url, "/v1/keys/admin/revoke", body={"key": args.key})
        if args.json:
            print_json(reply)
        else:
            print(f"revoked {reply['revoked']} admin key(s)")
    else:
        listed = _get(cfg, url, "/v1/keys/admin")
        if args.json:
            print_json(listed)
            return 0
        print(f"{'KEY':16} {'STATUS':8} {'ADDED':17} LABEL")
        for r in listed["keys"]:
            when = datetime.fromtimestamp(r["created_at"], UTC).strftime("%Y-%m-%d %H:%M")
            print(f"{r['prefix'] + '…':16} {'revoked' if r['revoked_at'] else 'active':8} {when:17} "
                  f"{r['label'] or ''}")
    return 0


def add_parsers(sub: argparse._SubParsersAction, add: Any) -> None:  # type: ignore[type-arg]
    keys = sub.add_parser("admin-keys", help="Keys for the model and tenant API in place of the cluster token.")
    k_sub = keys.add_subparsers(dest="admin_keys_command", metavar="SUBCOMMAND", required=True)
    for name, help_ in COMMANDS.items():
        p = add(k_sub, name, help_, run, needs="controller")
        add_controller_argument(p)
        add_json_argument(p)
        if name == "add":
            p.add_argument("--label", default=None, help="who or what it is for (shown in audit events)")
        if name == "revoke":
            p.add_argument("key", metavar="KEY", help="the key, its sha256, or its listed prefix")
