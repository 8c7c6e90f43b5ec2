"""`thaw tenants ...`: tenants and their API keys at the controller (every activator
follows within a second): create, remove, list and show tenants; set their limits and
allowed models; add, revoke and list their keys (`thaw tenants keys ...`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from thaw.cli.aliases import add_renamed_flag
from thaw.cli.common import (
    CliError,
    _call,
    _controller,
    _get,
    _load,
    add_controller_argument,
    add_json_argument,
    print_json,
)
from thaw.config import ThawConfig
from thaw.exits import EXIT_INVALID

COMMANDS = {
    "create": "Create a tenant (then give it a key with `thaw tenants keys add`).",
    "rm": "Remove a tenant: its keys stop working at once (refused while it owns models).",
    "ls": "List tenants, their allowed models and limits, and their keys (prefixes and hashes only).",
    "show": "Show one tenant: its allowed models, limits and keys (prefixes and hashes only).",
}
KEY_COMMANDS = {
    "add": "Create an API key for a tenant; prints it once.",
    "revoke": "Revoke a key (the key, its sha256, or its listed prefix).",
    "ls": "List API keys (prefixes and hashes only), every tenant's or one's.",
}
SETTINGS = {
    "limits": "Set a tenant's rate limits (0 lifts one).",
    "models": "Set the models a tenant may use (names, or '*' for every model).",
}
# The limits' flags are named like their config fields (tenants[].limits); the old ones.
LIMITS = {"requests_per_minute": "--rpm", "tokens_per_minute": "--tpm", "max_concurrent_requests": "--concurrency"}
LIMIT_HELP = {"requests_per_minute": "requests per minute", "tokens_per_minute": "tokens per minute",
              "max_concurrent_requests": "requests in flight at once"}


def _models(value: str) -> list[str]:
    return [m.strip() for m in value.split(",") if m.strip()]


def _limit_arguments(p: argparse.ArgumentParser) -> None:
    for field, old in LIMITS.items():
        new = "--" + field.replace("_", "-")
        add_renamed_flag(p, old, new, type=int)
        p.add_argument(new, type=int, default=None, metavar="N", help=LIMIT_HELP[field])


def add_arguments(action: str, p: argparse.ArgumentParser) -> None:
    """The arguments of ``action`` ("create", "keys add", "limits set", ...)."""
    add_controller_argument(p)
    add_json_argument(p)
    if action in ("create", "rm", "show", "keys add", "limits set", "models set"):
        p.add_argument("tenant", metavar="TENANT", help="the tenant's name")
    if action == "keys ls":
        p.add_argument("tenant", metavar="TENANT", nargs="?", default=None, help="only this tenant's keys")
    if action == "create":
        add_renamed_flag(p, "--models", "--allowed-models", type=_models)
        p.add_argument("--allowed-models", type=_models, default=["*"], metavar="M[,M...]",
                       help="allowed_models: the models it may use (default: '*', every model)")
        _limit_arguments(p)
    if action == "limits set":
        _limit_arguments(p)
    if action == "models set":
        p.add_argument("models", type=_models, metavar="M[,M...]", help="model names, or '*'")
    if action == "keys add":
        p.add_argument("--label", default=None, help="a note kept with the key (who it is for)")
    if action == "keys revoke":
        p.add_argument("key", metavar="KEY", help="the key, its sha256, or its listed prefix")


def _limits(args: argparse.Namespace) -> dict[str, int]:
    return {k: v for k in LIMITS if (v := getattr(args, k, None)) is not None}


def _show_limits(limits: dict[str, Any]) -> str:
    shown = [f"{field.replace('_', '-')} {limits[field]}" for field in LIMITS if limits.get(field)]
    return ", ".join(shown) or "none"


def _keys_of(tenant: dict[str, Any], keys: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A tenant's keys: those its config gave (hashes) and those added at run time."""
    revoked = {r["hash"] for r in keys if r["revoked_at"]}
    out: list[dict[str, Any]] = []
    for h in tenant["config_key_hashes"]:
        hx = h.removeprefix("sha256:")
        out.append({"key": hx[:12], "hash": hx, "source": "config", "status": "revoked" if hx in revoked else "active",
                    "label": None, "created_at": None})
    for r in keys:
        if r["tenant"] == tenant["name"] and r["label"] != "config":
            out.append({"key": r["prefix"], "hash": r["hash"], "source": "added",
                        "status": "revoked" if r["revoked_at"] else "active", "label": r["label"],
                        "created_at": r["created_at"]})
    return out


def _tenants(cfg: ThawConfig, url: str) -> list[dict[str, Any]]:
    """The tenants not removed, each with its keys."""
    tenants = [t for t in _get(cfg, url, "/v1/admin/tenants")["tenants"] if t["removed_at"] is None]
    keys = _get(cfg, url, "/v1/keys")["keys"]
    return [{**t, "keys": _keys_of(t, keys)} for t in tenants]


def _render_tenants(tenants: list[dict[str, Any]]) -> str:
    lines = [f"{'TENANT':16} {'MODELS':24} {'LIMITS':36} {'KEY':14} {'SOURCE':8} STATUS"]
    for t in tenants:
        head = f"{t['name']:16} {','.join(t['allowed_models'])[:24]:24} {_show_limits(t['limits'])[:36]:36}"
        for k in t["keys"]:
            extra = ""
            if k["source"] == "added":
                when = datetime.fromtimestamp(k["created_at"], UTC).strftime("%Y-%m-%d %H:%M")
                extra = f" (added {when}{', ' + k['label'] if k['label'] else ''})"
            lines.append(f"{head} {k['key'] + '…':14} {k['source']:8} {k['status']}{extra}")
        if not t["keys"]:
            lines.append(f"{head} {'-':14} {'-':8} no key (`thaw tenants keys add {t['name']}`)")
    return "\n".join(lines)


def _one(cfg: ThawConfig, url: str, name: str) -> dict[str, Any]:
    found = [t for t in _tenants(cfg, url) if t["name"] == name]
    if not found:
        raise CliError(f"no tenant {name!r}", EXIT_INVALID)
    return found[0]


# Each action: (args, cfg, url) -> (the JSON document, the text for a person).
Result = tuple[Any, str]


def _create(args: argparse.Namespace, cfg: ThawConfig, url: str) -> Result:
    limits = {k: v for k, v in _limits(args).items() if v}
    rec = _call(cfg, "POST", url, "/v1/admin/tenants",
                body={"name": args.tenant, "allowed_models": args.allowed_models, "limits": limits})
    return rec, (f"created tenant {rec['name']} (models {','.join(rec['allowed_models'])}; limits "
                 f"{_show_limits(rec['limits'])}); give it a key with `thaw tenants keys add {rec['name']}`")


def _rm(args: argparse.Namespace, cfg: ThawConfig, url: str) -> Result:
    rec = _call(cfg, "DELETE", url, f"/v1/admin/tenants/{args.tenant}")
    return rec, f"removed tenant {args.tenant}: its keys stop working on every activator within a second"


def _set_limits(args: argparse.Namespace, cfg: ThawConfig, url: str) -> Result:
    limits = _limits(args)
    if not limits:
        raise CliError("give --requests-per-minute, --tokens-per-minute or --max-concurrent-requests "
                       "(0 lifts a limit)", EXIT_INVALID)
    rec = _call(cfg, "PATCH", url, f"/v1/admin/tenants/{args.tenant}", body={"limits": limits})
    return rec, f"tenant {rec['name']}: limits {_show_limits(rec['limits'])}"


def _set_models(args: argparse.Namespace, cfg: ThawConfig, url: str) -> Result:
    rec = _call(cfg, "PATCH", url, f"/v1/admin/tenants/{args.tenant}", body={"allowed_models": args.models})
    return rec, f"tenant {rec['name']}: models {','.join(rec['allowed_models'])}"


def _ls(args: argparse.Namespace, cfg: ThawConfig, url: str) -> Result:
    tenants = _tenants(cfg, url)
    return {"tenants": tenants}, _render_tenants(tenants)


def _show(args: argparse.Namespace, cfg: ThawConfig, url: str) -> Result:
    tenant = _one(cfg, url, args.tenant)
    return tenant, _render_tenants([tenant])


def _keys_add(args: argparse.Namespace, cfg: ThawConfig, url: str) -> Result:
    reply = _call(cfg, "POST", url, "/v1/keys", body={"tenant": args.tenant, "label": args.label})
    print(f"key for tenant {args.tenant!r} (shown once; stored only as a hash; in force on every activator "
          "within a second)", file=sys.stderr)
    return reply, str(reply["key"])


def _keys_revoke(args: argparse.Namespace, cfg: ThawConfig, url: str) -> Result:
    reply = _call(cfg, "POST", url, "/v1/keys/revoke", body={"key": args.key})
    return reply, f"revoked {reply['revoked']} key(s); in force on every activator within a second"


def _keys_ls(args: argparse.Namespace, cfg: ThawConfig, url: str) -> Result:
    tenants = _tenants(cfg, url) if args.tenant is None else [_one(cfg, url, args.tenant)]
    keys = [{"tenant": t["name"], **k} for t in tenants for k in t["keys"]]
    lines = [f"{'TENANT':16} {'KEY':14} {'SOURCE':8} {'STATUS':8} LABEL"]
    lines += [f"{k['tenant']:16} {k['key'] + '…':14} {k['source']:8} {k['status']:8} {k['label'] or ''}"
              for k in keys]
    return {"keys": keys}, "\n".join(lines)


ACTIONS: dict[str, Callable[[argparse.Namespace, ThawConfig, str], Result]] = {
    "create": _create, "rm": _rm, "ls": _ls, "show": _show, "keys add": _keys_add, "keys revoke": _keys_revoke,
    "keys ls": _keys_ls, "limits set": _set_limits, "models set": _set_models,
}


def run(args: argparse.Namespace) -> int:
    cfg = _load(args)
    body, text = ACTIONS[args.tenants_action](args, cfg, _controller(args, cfg))
    if args.json:
        print_json(body)
    else:
        print(text)
    return 0


def add_parsers(sub: argparse._SubParsersAction, add: Any) -> None:  # type: ignore[type-arg]
    ten = sub.add_parser("tenants", help="Tenants and their API keys, at the controller (every activator "
                                          "follows within a second).")
    t_sub = ten.add_subparsers(dest="tenants_command", metavar="SUBCOMMAND", required=True)

    def leaf(parent: Any, action: str, help_: str, hidden_as: str | None = None) -> None:
        name = action.split()[-1]
        p = add(parent, name, help_, run, needs="controller", hidden_as=hidden_as)
        p.set_defaults(tenants_action=action)
        add_arguments(action, p)

    for name, help_ in COMMANDS.items():
        leaf(t_sub, name, help_)
    keys = t_sub.add_parser("keys", help="Add, revoke and list tenants' API keys.")
    k_sub = keys.add_subparsers(dest="keys_command", metavar="SUBCOMMAND", required=True)
    for name, help_ in KEY_COMMANDS.items():
        leaf(k_sub, f"keys {name}", help_)
    for name, help_ in SETTINGS.items():
        group = t_sub.add_parser(name, help=help_)
        g_sub = group.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND", required=True)
        leaf(g_sub, f"{name} set", help_)
    # The old names (one release): `tenants add|revoke` are `tenants keys add|revoke`.
    for old in ("add", "revoke"):
        leaf(t_sub, f"keys {old}", KEY_COMMANDS[old], hidden_as=f"tenants keys {old}")
