"""Cold-start and hot-TTFT probe against a running `thaw up`.

    python -m loadtests.probe --endpoint .thaw/endpoint.json --cycles 3 --hot 10 --out probe.json

Each cycle waits until the model is at zero with a worker in standby (the model's
idle grace must pass, and the released worker must re-warm), sends one
streamed request (a cold start: time to first token, and the phase breakdown the
activator recorded), then ``--hot`` streamed requests one after another (hot TTFT).
Prints a summary and writes every sample as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from thaw.auth import bearer, local_token


def _stream_ttft(base_url: str, key: str, model: str, prompt: str) -> tuple[float, float, str, dict[str, str]]:
    """(ttft_s, total_s, text, headers) of one streamed chat completion."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8, "stream": True}
    t0 = time.perf_counter()
    ttft = None
    text = []
    with httpx.stream("POST", f"{base_url}/chat/completions", json=body, timeout=600,
                      headers={"Authorization": f"Bearer {key}"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            delta = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
            if delta and ttft is None:
                ttft = time.perf_counter() - t0
            text.append(delta or "")
        headers = dict(r.headers)
    total = time.perf_counter() - t0
    return (ttft if ttft is not None else total), total, "".join(text), headers


# The cluster token of the `thaw up` being probed (set from --endpoint's directory).
HEADERS: dict[str, str] = {}


def _state(control_url: str) -> dict[str, Any]:
    return httpx.get(f"{control_url}/v1/state", timeout=10, headers=HEADERS).json()  # type: ignore[no-any-return]


def _model_state(control_url: str, model: str) -> dict[str, Any]:
    return next(m for m in _state(control_url)["models"] if model in (m["served_name"], m["name"]))


def _at_zero_with_standby(control_url: str, model: str) -> bool:
    # The standby tier: no replica, and a worker standing by (engine runtime imported).
    state = _state(control_url)
    m = next(m for m in state["models"] if model in (m["served_name"], m["name"]))
    return not m["replicas"] and any(w["state"] == "standby" for w in state["workers"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", type=Path, default=Path(".thaw/endpoint.json"))
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--hot", type=int, default=10)
    p.add_argument("--zero-timeout-s", type=float, default=600)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    info = json.loads(args.endpoint.read_text())
    HEADERS.update(bearer(local_token(args.endpoint.parent)))
    base, key, model, control = info["base_url"], info["api_key"], info["model"], info["control_url"]
    cold: list[dict[str, Any]] = []
    hot: list[dict[str, Any]] = []
    for cycle in range(args.cycles):
        deadline = time.time() + args.zero_timeout_s
        while not _at_zero_with_standby(control, model):
            if time.time() > deadline:
                raise SystemExit("the model did not scale to zero in time (check its idle_grace_s)")
            time.sleep(0.5)
        ttft, total, _, headers = _stream_ttft(base, key, model, f"cold cycle {cycle}")
        record = _model_state(control, model).get("last_cold_start") or {}
        cold.append({"ttft_s": ttft, "total_s": total, "cold_header": headers.get("x-thaw-cold-start"),
                     "queue_ms": headers.get("x-thaw-queue-ms"), "phases_s": record.get("phases_s")})
        print(f"cycle {cycle}: cold TTFT {ttft:.2f}s  phases {record.get('phases_s')}", flush=True)
        for i in range(args.hot):
            t, tot, _, h = _stream_ttft(base, key, model, f"hot {cycle}.{i}")
            hot.append({"ttft_s": t, "total_s": tot, "cold_header": h.get("x-thaw-cold-start")})
    phases = sorted({k for c in cold if c["phases_s"] for k in c["phases_s"]})
    summary = {
        "cold_ttft_median_s": statistics.median(c["ttft_s"] for c in cold),
        "cold_phase_medians_s": {ph: statistics.median(c["phases_s"][ph] for c in cold if c["phases_s"])
                                 for ph in phases},
        "hot_ttft_median_s": statistics.median(h["ttft_s"] for h in hot) if hot else None,
        "hot_ttft_p90_s": statistics.quantiles([h["ttft_s"] for h in hot], n=10)[-1] if len(hot) >= 10 else None,
        "cold_over_hot": None,
    }
    if summary["hot_ttft_median_s"]:
        summary["cold_over_hot"] = summary["cold_ttft_median_s"] / summary["hot_ttft_median_s"]
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "cold": cold, "hot": hot}, indent=2))


if __name__ == "__main__":
    main()
