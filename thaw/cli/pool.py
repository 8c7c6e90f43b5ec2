"""`thaw status` and `thaw pool status|events|budget|clock`: the controller's view,
rendered or as JSON."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from thaw.cli.common import (
    EXIT_INVALID,
    CliError,
    _call,
    _controller,
    _get,
    _load,
)


def cmd_status(args: argparse.Namespace) -> int:
    from thaw.cli.status import render_status
    from thaw.cli.up import endpoint_file

    cfg = _load(args)
    path = endpoint_file(cfg)
    try:
        local = json.loads(path.read_text())
    except (OSError, ValueError):
        local = None
    # --controller, else the running `thaw up`'s, else the config's: no `thaw up` needed.
    url = _controller(args, cfg)
    # The endpoint of the local `thaw up` when it is that controller's; else none known here.
    info = local if isinstance(local, dict) and local.get("control_url") in url.split(",") else \
        {"base_url": None, "control_url": url}
    state = _get(cfg, url, "/v1/state")
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
        raise CliError("nothing to set: give --standby-min, --standby-max, --budget-usd-per-hour (with a SHAPE) "
                       "or --total-budget-usd-per-hour", EXIT_INVALID)
    if args.shape is None and set(change) - {"total_usd_per_hour"}:
        raise CliError("--standby-min, --standby-max and --budget-usd-per-hour need a SHAPE", EXIT_INVALID)
    view = _call(cfg, "PUT", _controller(args, cfg), "/v1/pool/budget", body=change)
    return _emit(args, view, _render_budget)


def _render_clock(view: dict) -> str:  # type: ignore[type-arg]
    from datetime import UTC, datetime

    at = datetime.fromtimestamp(view["now"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if not view["steppable"]:
        return f"{at} (the wall clock)"
    return (f"{at} (stepped {view['stepped_s']:g} s ahead of the wall clock; "
            f"one step at most {view['largest_step_s']:g} s)")


def cmd_pool_clock(args: argparse.Namespace) -> int:
    """The controller's time; with --advance, step it forward first (controller.stepped_clock)."""
    cfg = _load(args)
    url = _controller(args, cfg)
    if args.advance is None:
        return _emit(args, _get(cfg, url, "/v1/pool/clock"), _render_clock)
    return _emit(args, _call(cfg, "POST", url, "/v1/pool/clock", body={"advance_s": args.advance}), _render_clock)
