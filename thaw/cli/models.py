"""`thaw models deploy|update|rollback|rm|ls|show`: the controller's model registry
(``/v1/admin/models``), from the command line."""

from __future__ import annotations

import argparse
import json
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
from thaw.config import EngineArgs
from thaw.exits import EXIT_INVALID

COMMANDS = {
    "deploy": "Deploy a new model: checked (settings, weights in the store, fit) before it is served.",
    "update": "Change a model's weights or settings: a new revision (rolled where it serves).",
    "rollback": "Go back to an earlier revision's weights and settings (a new revision).",
    "rm": "Stop serving a model: new requests get 404, requests in flight finish, revisions are kept.",
    "ls": "The models in the registry: current revision, weights, shape, tenant, replicas.",
    "show": "One model: every revision (who changed what, when), replicas, last cold start.",
}
# Old names (one release): `models describe` is `models show`.
RENAMED = {"describe": "show"}
# The price flags are named like their fields (models[].pricing); the old ones.
PRICES = {
    "prompt_usd_per_mtok": ("--price-prompt", "USD per million prompt tokens (a price change is a revision; "
                                              "bills name it)"),
    "cached_usd_per_mtok": ("--price-cached", "USD per million cached prompt tokens (default: the prompt price)"),
    "completion_usd_per_mtok": ("--price-completion", "USD per million completion tokens"),
    "usd_per_gpu_second": ("--price-gpu-second", "USD per GPU-second of replica time the tenant's requests used"),
}


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    name = RENAMED.get(name, name)
    add_controller_argument(p)
    add_json_argument(p)
    if name in ("deploy", "update", "rollback", "rm", "show"):
        p.add_argument("name", metavar="NAME", help="the model's name")
    if name in ("deploy", "update"):
        p.add_argument("--uri", default=None, help="the weights: s3://bucket/prefix, pushed with `thaw push`")
        p.add_argument("--shape", default=None, help="the instance shape it runs on")
        p.add_argument("--tenant", default=None, help="only this tenant's keys may list and call it")
        p.add_argument("--base", default=None, help="a LoRA adapter: the model whose engines serve it")
        p.add_argument("--adapter-uri", default=None, help="a LoRA adapter: its files (PEFT layout)")
        p.add_argument("--served-name", default=None, help="what clients put in `model` (default: NAME)")
        p.add_argument("--max-context-tokens", type=int, default=None, metavar="N",
                       help="the longest prompt plus completion it serves (the engine's max_model_len)")
        p.add_argument("--min-replicas", type=int, default=None, metavar="N",
                       help="autoscaling.min_replicas: replicas kept even when idle")
        p.add_argument("--max-replicas", type=int, default=None, metavar="N",
                       help="autoscaling.max_replicas: replicas at the most")
        p.add_argument("--idle-grace-s", type=float, default=None, metavar="S",
                       help="autoscaling.idle_grace_s: with no request for this long, replicas above "
                            "--min-replicas are released")
        for field, (old, help_) in PRICES.items():
            new = "--" + field.replace("_", "-")
            add_renamed_flag(p, old, new, type=float)
            p.add_argument(new, type=float, default=None, metavar="USD", help=help_)
        p.add_argument("--prewarm", action="append", default=None, metavar="'CRON;FOR_S[;REPLICAS]'",
                       help="a scheduled pre-warm window (UTC cron, 5 fields): hold REPLICAS (default 1) for "
                            "FOR_S seconds from each time CRON fires; repeatable, replaces the schedule; "
                            "'none' clears it")
        p.add_argument("--engine-arg", action="append", default=[], metavar="K=V",
                       help="an engine setting (dtype, enforce_eager, cpu_kvcache_gib, ...) or any vLLM "
                            "argument; V is read as JSON where it parses (true, 2, 0.5), else as text; repeatable. "
                            "A deploy on a CPU shape runs eager unless enforce_eager=false")
    if name in ("deploy", "update", "rollback"):
        p.add_argument("--note", default=None, help="why, kept with the revision")
    if name in ("update", "rollback", "rm"):
        p.add_argument("--revision", type=int, default=None,
                       help="the revision this change is based on (refused if another change came first); "
                            "default: the current one, read just before")
    if name == "rollback":
        p.add_argument("--to", type=int, default=None, help="the revision to go back to (default: the previous)")


def spec_of(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gives (``thaw.wire.ModelSpec``'s fields)."""
    spec: dict[str, Any] = {k: v for k, v in (
        ("uri", args.uri), ("shape", args.shape), ("tenant", args.tenant), ("base", args.base),
        ("adapter_uri", args.adapter_uri), ("served_name", args.served_name),
        ("max_context_tokens", args.max_context_tokens)) if v is not None}
    scaling = {k: v for k, v in (("min_replicas", args.min_replicas), ("max_replicas", args.max_replicas),
                                 ("idle_grace_s", args.idle_grace_s)) if v is not None}
    if scaling:
        spec["autoscaling"] = scaling
    pricing = {k: v for k in PRICES if (v := getattr(args, k, None)) is not None}
    if pricing:
        spec["pricing"] = pricing
    if args.prewarm is not None:
        spec["prewarm"] = prewarm_windows(args.prewarm)
    engine: dict[str, Any] = {}
    for item in args.engine_arg:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise CliError(f"--engine-arg {item!r}: expected KEY=VALUE", EXIT_INVALID)
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if key in EngineArgs.model_fields and key != "extra":
            engine[key] = value
        else:
            engine.setdefault("extra", {})[key] = value
    if engine:
        spec["engine"] = engine
    return spec


def eager_note(sent: dict[str, Any], record: dict[str, Any]) -> str | None:
    """The line saying that the controller chose eager mode (a deploy on a CPU shape
    that left ``enforce_eager`` out: warm_pool.registry.models.eager_on_cpu), else None."""
    rev = _current(record) or {}
    engine = rev.get("spec", {}).get("engine") or {}
    if "enforce_eager" in (sent.get("engine") or {}) or engine.get("enforce_eager") is not True:
        return None
    return (f"  engine: eager (enforce_eager: true), the default on CPU shape {rev['spec'].get('shape')!r}: a "
            "compiled engine's CPU cold start (~110 s) nears activation_timeout_s; "
            "`--engine-arg enforce_eager=false` compiles")


def prewarm_windows(items: list[str]) -> list[dict[str, Any]]:
    """``--prewarm`` values as ``models[].prewarm`` entries (checked by the controller)."""
    if items == ["none"]:
        return []
    out = []
    for item in items:
        parts = [p.strip() for p in item.split(";")]
        if len(parts) not in (2, 3):
            raise CliError(f"--prewarm {item!r}: expected 'CRON;FOR_S' or 'CRON;FOR_S;REPLICAS' (or 'none')", EXIT_INVALID)
        try:
            window: dict[str, Any] = {"cron": parts[0], "for_s": float(parts[1])}
            if len(parts) == 3:
                window["replicas"] = int(parts[2])
        except ValueError:
            raise CliError(f"--prewarm {item!r}: FOR_S is seconds and REPLICAS a whole number", EXIT_INVALID) from None
        out.append(window)
    return out


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _current(record: dict[str, Any]) -> dict[str, Any] | None:
    return next((r for r in record["revisions"] if r["revision"] == record["revision"]), None)


def run(args: argparse.Namespace) -> int:
    cfg = _load(args)
    url = _controller(args, cfg)
    command = args.models_command
    path = f"/v1/admin/models/{getattr(args, 'name', '')}"

    def based_on() -> int:
        if args.revision is not None:
            return int(args.revision)
        revision = _get(cfg, url, path)["revision"]
        if revision is None:
            raise CliError(f"no model {args.name!r} is deployed (removed)", EXIT_INVALID)
        return int(revision)

    # A change: the registry's record of the model after it, and what a person reads.
    if command == "deploy":
        spec = spec_of(args)
        record = _call(cfg, "POST", url, "/v1/admin/models", body={"name": args.name, "spec": spec, "note": args.note})
        note = eager_note(spec, record)
        text = (f"deployed {args.name} revision {record['revision']}; every activator serves it within a second"
                + (f"\n{note}" if note else ""))
    elif command == "update":
        spec = spec_of(args)
        if not spec:
            raise CliError("nothing to change: give --uri or a setting", EXIT_INVALID)
        record = _call(cfg, "PATCH", url, path, body={"revision": based_on(), "spec": spec, "note": args.note})
        text = f"updated {args.name} to revision {record['revision']}"
    elif command == "rollback":
        record = _call(cfg, "POST", url, f"{path}/rollback",
                       body={"to": args.to, "revision": based_on(), "note": args.note})
        rev = _current(record)
        text = (f"rolled {args.name} back to the settings of revision {rev['from_revision'] if rev else '?'}: "
                f"revision {record['revision']}")
    elif command == "rm":
        record = _call(cfg, "DELETE", url, path, params={"revision": based_on()})
        text = (f"removed {args.name}: new requests get 404, requests in flight finish; its revisions are kept "
                f"(`thaw models show {args.name}`)")
    if command in ("deploy", "update", "rollback", "rm"):
        if args.json:
            print_json(record)
        else:
            print(text)
        return 0
    if command == "ls":
        records = _get(cfg, url, "/v1/admin/models")["models"]
        rows = {r["name"]: r for r in _get(cfg, url, "/v1/state")["models"]}
        if args.json:
            print(json.dumps([{**r, "replicas": rows.get(r["name"], {}).get("replicas", {}),
                               "engine_class": rows.get(r["name"], {}).get("engine_class")} for r in records],
                             indent=2))
            return 0
        # CLASS: the engine class (models of one class swap into one pre-built engine).
        print(f"{'NAME':24} {'REV':>4} {'STATE':8} {'SHAPE':10} {'TENANT':12} {'REPLICAS':10} {'CLASS':12} "
              f"{'CHANGED':20} URI")
        for r in records:
            rev = _current(r) or (r["revisions"][-1] if r["revisions"] else {})
            spec = rev.get("spec", {})
            row = rows.get(r["name"], {})
            ready = row.get("replicas", {}).get("ready", 0)
            state = "serving" if r["revision"] else "removed"
            print(f"{r['name']:24} {r['revision'] or '-':>4} {state:8} {spec.get('shape', '-'):10} "
                  f"{spec.get('tenant') or '-':12} {ready:<10} {row.get('engine_class') or '-':12} "
                  f"{_when(r['removed_at'] if not r['revision'] else rev.get('created_at')):20} "
                  f"{spec.get('uri') or spec.get('adapter_uri') or '-'}")
    elif command in ("show", "describe"):
        record = _get(cfg, url, path)
        row = next((m for m in _get(cfg, url, "/v1/state")["models"] if m["name"] == args.name), None)
        if args.json:
            print(json.dumps({**record, "status": row}, indent=2))
            return 0
        print(render_record(record, row))
    return 0


def render_record(record: dict[str, Any], row: dict[str, Any] | None) -> str:
    lines = [f"{record['name']}: " + (f"revision {record['revision']}" if record["revision"] else
                                       f"removed {_when(record['removed_at'])} by {record['removed_by']}")]
    if row is not None:
        lines.append(f"  replicas: {row['replicas']}  queued: {row['queued']}  in flight: {row['in_flight']}")
        cs = row.get("last_cold_start")
        if cs:
            lines.append(f"  last cold start: {_when(cs['at'])}, {cs['total_s']:.2f} s to first token "
                         f"(tier {cs.get('tier') or '?'})")
    lines.append(f"  {'REV':>4} {'CHANGE':9} {'WHEN':20} {'WHO':28} {'WEIGHTS':14} SETTINGS")
    for r in record["revisions"]:
        change = r["change"] + (f" {r['from_revision']}" if r.get("from_revision") else "")
        weights = (r["weights_sha256"] or "")[:12] or "-"
        current = "*" if r["revision"] == record["revision"] else " "
        lines.append(f" {current}{r['revision']:>4} {change:9} {_when(r['created_at']):20} {r['who'][:28]:28} "
                     f"{weights:14} {json.dumps(r['spec'], sort_keys=True)}"
                     + (f"  ({r['note']})" if r.get("note") else ""))
    return "\n".join(lines)


# -- thaw apply -----------------------------------------------------------------------------

_MARK = {"deploy": "+", "create": "+", "update": "~", "change": "~", "remove": "-"}


def add_apply_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--file", required=True, metavar="FILE",
                   help="YAML with `models:` and/or `tenants:` as a config file declares them (a whole "
                        "config file will do: its other sections are ignored); a section left out is not touched")
    p.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    p.add_argument("--note", default=None, help="why, kept with each revision made")
    add_controller_argument(p)
    add_json_argument(p, "print the plan (and whether it was applied) as one JSON document: "
                         '{"changes": [...], "applied": true|false}')


def render_plan(changes: list[dict[str, Any]]) -> str:
    lines = []
    for c in changes:
        head = f"{_MARK[c['action']]} {c['kind']} {c['name']} ({c['action']}"
        head += f", revision {c['revision']})" if c.get("revision") else ")"
        lines.append(head)
        if c["action"] in ("update", "change"):
            for field, (now, then) in c["fields"].items():
                lines.append(f"    {field}: {json.dumps(now, sort_keys=True)} -> {json.dumps(then, sort_keys=True)}")
    return "\n".join(lines)


def run_apply(args: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from thaw.config import expand_env

    cfg = _load(args)
    try:
        data = yaml.safe_load(expand_env(Path(args.file).read_text()))
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"{args.file}: {exc}", EXIT_INVALID) from None
    if not isinstance(data, dict) or not ({"models", "tenants"} & set(data)):
        raise CliError(f"{args.file}: declares neither `models:` nor `tenants:`", EXIT_INVALID)
    body: dict[str, Any] = {"dry_run": args.dry_run, "note": args.note}
    if "models" in data:
        # Only `thaw up` reads demo_if_missing; the registry has no use for it.
        body["models"] = [{k: v for k, v in m.items() if k != "demo_if_missing"} if isinstance(m, dict) else m
                          for m in data["models"] or []]
    if "tenants" in data:
        body["tenants"] = data["tenants"] or []
    reply = _call(cfg, "POST", _controller(args, cfg), "/v1/admin/apply", body=body)
    changes = reply["changes"]
    if args.json:
        print_json(reply)
        return 0
    if not changes:
        print("nothing to change: the registry holds what the file declares")
        return 0
    print(render_plan(changes))
    print(f"{'applied' if reply['applied'] else 'dry run: nothing changed'}: {len(changes)} change(s)")
    return 0
