"""`thaw tenants ...`: tenants and their API keys at the controller (every activator
follows within a second): create, remove, list, limits, allowed models; add or revoke
a key."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from thaw.cli.common import CliError, _call, _controller, _get, _load
from thaw.exits import EXIT_INVALID

COMMANDS = {
    "create": "Create a tenant (then give it a key with `thaw tenants add`).",
    "rm": "Remove a tenant: its keys stop working at once (refused while it owns models).",
    "ls": "List tenants, their allowed models and limits, and their keys (prefixes and hashes only).",
    "add": "Create an API key for a tenant; prints it once.",
    "revoke": "Revoke a key (the key, its sha256, or its listed prefix).",
}
SETTINGS = {
    "limits": "Set a tenant's rate limits (0 lifts one).",
    "models": "Set the models a tenant may use (names, or '*' for every model).",
}


def _models(value: str) -> list[str]:
    return [m.strip() for m in value.split(",") if m.strip()]


def _limit_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rpm", type=int, default=None, help="requests per minute")
    p.add_argument("--tpm", type=int, default=None, help="tokens per minute")
    p.add_argument("--concurrency", type=int, default=None, help="requests in flight at once")


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--controller", metavar="URL", default=None)
    if name in ("create", "rm", "add", "limits", "models"):
        p.add_argument("tenant", metavar="TENANT")
    if name == "create":
        p.add_argument("--models", type=_models, default=["*"], metavar="M[,M...]",
                       help="the models it may use (default: '*', every model)")
        _limit_arguments(p)
    if name == "limits":
        _limit_arguments(p)
    if name == "models":
        p.add_argument("models", type=_models, metavar="M[,M...]", help="model names, or '*'")
    if name == "add":
        p.add_argument("--label", default=None, help="a note kept with the key (who it is for)")
    if name == "revoke":
        p.add_argument("key", metavar="KEY")


def _limits(args: argparse.Namespace) -> dict[str, int]:
    return {k: v for k, v in (("requests_per_minute", args.rpm), ("tokens_per_minute", args.tpm),
                              ("max_concurrent_requests", args.concurrency)) if v is not None}


def _show_limits(limits: dict[str, Any]) -> str:
    shown = [f"{short} {limits[k]}" for k, short in (("requests_per_minute", "rpm"), ("tokens_per_minute", "tpm"),
                                                     ("max_concurrent_requests", "concurrency")) if limits.get(k)]
    return ", ".join(shown) or "none"


def run(args: argparse.Namespace) -> int:
    cfg = _load(args)
    url = _controller(args, cfg)
    command = args.tenants_command
    if command == "create":
        limits = {k: v for k, v in _limits(args).items() if v}
        rec = _call(cfg, "POST", url, "/v1/admin/tenants",
                    body={"name": args.tenant, "allowed_models": args.models, "limits": limits})
        print(f"created tenant {rec['name']} (models {','.join(rec['allowed_models'])}; limits "
              f"{_show_limits(rec['limits'])}); give it a key with `thaw tenants add {rec['name']}`")
    elif command == "rm":
        _call(cfg, "DELETE", url, f"/v1/admin/tenants/{args.tenant}")
        print(f"removed tenant {args.tenant}: its keys stop working on every activator within a second")
    elif command == "limits":
        limits = _limits(args)
        if not limits:
            raise CliError("give --rpm, --tpm or --concurrency (0 lifts a limit)", EXIT_INVALID)
        rec = _call(cfg, "PATCH", url, f"/v1/admin/tenants/{args.tenant}", body={"limits": limits})
        print(f"tenant {rec['name']}: limits {_show_limits(rec['limits'])}")
    elif command == "models":
        rec = _call(cfg, "PATCH", url, f"/v1/admin/tenants/{args.tenant}", body={"allowed_models": args.models})
        print(f"tenant {rec['name']}: models {','.join(rec['allowed_models'])}")
    elif command == "add":
        reply = _call(cfg, "POST", url, "/v1/keys", body={"tenant": args.tenant, "label": args.label})
        print(reply["key"])
        print(f"key for tenant {args.tenant!r} (shown once; stored only as a hash; in force on every activator "
              "within a second)", file=sys.stderr)
    elif command == "revoke":
        reply = _call(cfg, "POST", url, "/v1/keys/revoke", body={"key": args.key})
        print(f"revoked {reply['revoked']} key(s); in force on every activator within a second")
    elif command == "ls":
        tenants = [t for t in _get(cfg, url, "/v1/admin/tenants")["tenants"] if t["removed_at"] is None]
        keys = _get(cfg, url, "/v1/keys")["keys"]
        revoked = {r["hash"] for r in keys if r["revoked_at"]}
        print(f"{'TENANT':16} {'MODELS':24} {'LIMITS':28} {'KEY':14} {'SOURCE':8} STATUS")
        for t in tenants:
            models = ",".join(t["allowed_models"])[:24]
            shown_limits = _show_limits(t["limits"])[:28]
            shown = 0
            for h in t["config_key_hashes"]:
                hx = h.removeprefix("sha256:")
                print(f"{t['name']:16} {models:24} {shown_limits:28} {hx[:12] + '…':14} {'config':8} "
                      f"{'revoked' if hx in revoked else 'active'}")
                shown += 1
            for r in keys:
                if r["tenant"] == t["name"] and r["label"] != "config":
                    when = datetime.fromtimestamp(r["created_at"], UTC).strftime("%Y-%m-%d %H:%M")
                    print(f"{t['name']:16} {models:24} {shown_limits:28} {r['prefix'] + '…':14} {'added':8} "
                          f"{'revoked' if r['revoked_at'] else 'active'} (added {when}"
                          f"{', ' + r['label'] if r['label'] else ''})")
                    shown += 1
            if not shown:
                print(f"{t['name']:16} {models:24} {shown_limits:28} {'-':14} {'-':8} no key (`thaw tenants add`)")
    return 0


def add_parsers(sub: argparse._SubParsersAction, add: Any) -> None:  # type: ignore[type-arg]
    ten = sub.add_parser("tenants", help="Tenants and their API keys, at the controller (every activator "
                                          "follows within a second).")
    t_sub = ten.add_subparsers(dest="tenants_command", metavar="SUBCOMMAND", required=True)
    for name, help_ in COMMANDS.items():
        add_arguments(name, add(t_sub, name, help_, run))
    for name, help_ in SETTINGS.items():
        group = t_sub.add_parser(name, help=help_)
        g_sub = group.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND", required=True)
        p = add(g_sub, "set", help_, run)
        p.set_defaults(tenants_command=name)
        add_arguments(name, p)
