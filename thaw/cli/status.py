"""`thaw status` and `thaw pool status|events`: the controller's view, as text."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return "never"
    s = max(now - t, 0)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago"


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(c.items())) or "none"


def _models(state: dict[str, Any], now: float) -> list[str]:
    out = ["MODELS"]
    for m in state["models"]:
        reps = _counts(m["replicas"]) if m["replicas"] else "0 replicas"
        out.append(f"  {m['served_name']:20} {reps:24} queued {m['queued']:<3} in flight {m['in_flight']:<3} "
                   f"last request {_ago(m['last_request_at'], now)}")
        if m.get("error"):
            out.append(f"    failing: {m['error']}"
                       + (f" (next try in {m['backoff_until'] - now:.0f}s)" if m.get("backoff_until") else ""))
        cs = m.get("last_cold_start")
        if cs:
            phases = "  ".join(f"{k} {v:.2f}s" for k, v in cs["phases_s"].items())
            tier = f" from {cs['tier']}" if cs.get("tier") else ""
            out.append(f"    last cold start {_ago(cs['at'], now)}{tier}: {cs['total_s']:.2f}s to first token = "
                       f"{phases}")
    return out


def _gib(n: int | None) -> str:
    return f"{(n or 0) / (1 << 30):.1f} GiB"


def _workers(state: dict[str, Any]) -> list[str]:
    """Each worker, and under one that packs, its packed engines and the memory each holds."""
    out = ["WORKERS"]
    details = {d["id"]: d for d in state.get("worker_details", [])}
    if not state["workers"]:
        out.append("  none")
    packed: dict[str, list[dict[str, Any]]] = {}
    for w in state["workers"]:
        host = details.get(w["id"], {}).get("host_worker_id")
        if host:
            packed.setdefault(host, []).append(w)
    for w in state["workers"]:
        d = details.get(w["id"], {})
        if d.get("host_worker_id") and d["host_worker_id"] in details:
            continue  # shown under its worker
        out.extend(_worker_lines(w, d, "  "))
        engines = packed.get(w["id"], [])
        if d.get("capacity_bytes"):
            held = (d.get("memory_bytes") or 0) + sum(details[e["id"]].get("memory_bytes") or 0 for e in engines)
            out.append(f"    memory: {_gib(held)} of {_gib(d['capacity_bytes'])} held by {len(engines) + bool(w['model'])}"
                       f" engine(s)" + (f" (its own {_gib(d.get('memory_bytes'))})" if w["model"] else ""))
        for e in engines:
            out.extend(_worker_lines(e, details[e["id"]], "    + "))
    return out


def _worker_lines(w: dict[str, Any], d: dict[str, Any], indent: str) -> list[str]:
    pad = " " * len(indent)
    memory = f" {_gib(d['memory_bytes'])}" if d.get("host_worker_id") and d.get("memory_bytes") else ""
    out = [f"{indent}{w['id']:14} {w['instance_id'] or '-':22} {d.get('shape', '-'):12} {w['state']:11} "
           f"{w['model'] or '-':12} age {w['age_s']:.0f}s  {w['control_url'] or '-'}{memory}"
           + (f"\n{pad}  error: {d['error']}" if d.get("error") else "")]
    load = d.get("load")
    if load and w["model"]:
        secs = f" in {load['seconds']:.2f}s" if load.get("seconds") is not None else ""
        how = f"swapped into its engine, weights from {load['tier']}" if load.get("swap") else \
            f"loaded from {load['tier']}"
        out.append(f"{pad}  {how}{secs}")
    if d.get("adapters"):
        held = ", ".join(f"{a['model']} ({a['state']})" for a in d["adapters"])
        out.append(f"{pad}  adapters: {held}")
        out.extend(f"{pad}    {a['model']} failed: {a['error']}" for a in d["adapters"] if a.get("error"))
    if d.get("prebuilt"):
        p = d["prebuilt"]
        out.append(f"{pad}  engine kept: class {p['engine_class']} ({p['state']}), weights of {p['model']}")
    if d.get("cached"):
        held = ", ".join(f"{c['uri']} {c['tier']} {_pct(c['bytes'], c['total_bytes'])}" for c in d["cached"])
        out.append(f"{pad}  cached: {held}")
    return out


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"


def render_status(info: dict[str, Any], state: dict[str, Any]) -> str:
    now = state.get("now") or time.time()
    # (No base_url: a controller named with --controller, whose activators are not known here.)
    out = [f"endpoint {info['base_url']}  (controller {info['control_url']})" if info.get("base_url")
           else f"controller {info['control_url']}", ""]
    return "\n".join(out + _models(state, now) + [""] + _workers(state))


def render_pool(state: dict[str, Any]) -> str:
    now = state.get("now") or time.time()
    out = [f"controller epoch {state['controller_epoch']}"
           + ("" if state["adopted"] else "  (still adopting the fleet after its start)"), "", "SHAPES"]
    for s in state["shapes"]:
        budget = "no budget" if s["budget_usd_per_hour"] is None else f"budget ${s['budget_usd_per_hour']:.2f}/h"
        target = "" if s.get("standby_target") is None else (
            f" now {s['standby_target']}" + (f" (budget grants {s['standby_granted']})"
                                             if s.get("budget_shortfall") else ""))
        out.append(f"  {s['shape']:14} {s['provider']:6} {_counts(s['counts']):40} standby "
                   f"{s['standby_min']}..{s['standby_max']}{target}, max {s['max_instances']}; {budget}, "
                   f"spending ${s['spend_usd_per_hour']:.2f}/h")
        if s.get("backoff_until"):
            out.append(f"    launches paused {s['backoff_until'] - now:.0f}s more: {s['backoff_reason']}")
        if s.get("standby_lent_to_batch") or s.get("standby_batch_share"):
            share = s.get("standby_batch_share")
            out.append(f"    batch: {s.get('standby_lent_to_batch', 0)} standby lent now; "
                       + ("no standby time yet" if share is None else f"{share:.0%} of standby time since start"))
    return "\n".join(out + _batch(state) + [""] + _models(state, now) + [""] + _workers(state))


def _batch(state: dict[str, Any]) -> list[str]:
    """The batch queue: batches by status, and their lines queued, running and ended."""
    b = state.get("batch") or {}
    batches, lines = b.get("batches") or {}, b.get("lines") or {}
    live = {s: n for s, n in batches.items() if s in ("validating", "in_progress", "finalizing", "cancelling")}
    if not live and not any(lines.values()):
        return []
    return [f"  batch: {', '.join(f'{n} {s}' for s, n in sorted(live.items())) or 'none running'}; lines "
            f"{lines.get('pending', 0)} queued, {lines.get('leased', 0)} running, {lines.get('done', 0)} done, "
            f"{lines.get('failed', 0) + lines.get('refused', 0)} failed"]


def render_events(events: list[dict[str, Any]], now: float) -> str:
    if not events:
        return "no decisions in that window"
    out = []
    for e in events:
        when = datetime.fromtimestamp(e["at"], UTC).strftime("%H:%M:%S")
        who = " ".join(f"{k}={e[k]}" for k in ("term", "controller", "shape", "model", "worker_id") if e.get(k))
        out.append(f"{when} ({_ago(e['at'], now):>8}) {e['kind']:10} {e['reason']:15} {e['outcome']:8} {who}  "
                   f"{json.dumps(e['inputs'], separators=(',', ':'))}")
    return "\n".join(out)
