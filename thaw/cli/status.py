"""`thaw status`: the control plane's view, as text."""

from __future__ import annotations

import time
from typing import Any


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return "never"
    s = max(now - t, 0)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago"


def render_status(info: dict[str, Any], state: dict[str, Any]) -> str:
    now = state.get("now") or time.time()
    out = [f"endpoint {info['base_url']}  (control plane {info['control_url']})", "", "MODELS"]
    for m in state["models"]:
        reps = ", ".join(f"{n} {s}" for s, n in sorted(m["replicas"].items())) or "0 replicas"
        out.append(f"  {m['served_name']:20} {reps:24} queued {m['queued']:<3} in flight {m['in_flight']:<3} "
                   f"last request {_ago(m['last_request_at'], now)}")
        if m.get("error"):
            out.append(f"    failing: {m['error']}")
        cs = m.get("last_cold_start")
        if cs:
            phases = "  ".join(f"{k} {v:.2f}s" for k, v in cs["phases_s"].items())
            out.append(f"    last cold start {_ago(cs['at'], now)}: {cs['total_s']:.2f}s to first token = {phases}")
    out += ["", "WORKERS"]
    if not state["workers"]:
        out.append("  none")
    for w in state["workers"]:
        out.append(f"  {w['id']:16} {w['shape']:12} {w['state']:10} {w['model'] or '-':12} up {w['uptime_s']:.0f}s"
                   + (f"  error: {w['error']}" if w.get("error") else ""))
    return "\n".join(out)
