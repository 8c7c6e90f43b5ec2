"""`thaw bench batch`: what batch work costs online traffic, and what it gets done.

    thaw bench batch --out batch.json [--rounds 2] [--phase-s 30] [--rate 4]

One ``thaw up`` (real vLLM on the CPU): a model served online (``online``, one warm
replica) and a pool standby. An open-loop Poisson load of streamed chat completions to
``online`` runs through three phases, interleaved over ``--rounds`` rounds (the
machine is shared: drift hits every phase alike):

``alone``
    No batch running: the baseline.
``batch_on_standby``
    A batch for another model at zero (``bulk``) runs on the pool's standby, lent to it
    (``warm_pool.policy.batch``): the batch throughput Thaw gets from a standby the pool
    pays for anyway. On this one machine the lent standby's engine shares the CPU with
    the online replica's; on GPU instances they share nothing.
``batch_on_spare_slots``
    A batch for ``online`` itself runs on the online replica's spare slots (at most
    ``batch.max_share`` of them, cut the moment an online request finds none free).

Each phase: the batch (if any) is created and running before the online load starts,
and cancelled after it ends (waited for). The JSON has every online request (TTFT,
errors), per phase TTFT p50/p90/p99 and the batch's lines and tokens per second while
the load ran, ``ratios`` (each batch phase's online p99 over ``alone``'s), the goal
(online p99 within 1.1 x of ``alone``) and whether it was met, the environment.

Module-level imports stay light: the CLI builds its parser from this module.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from loadtests.bench_stack import (
    API_KEY,
    Stack,
    add_common_arguments,
    base_config,
    bench_model,
    percentile,
    running,
    serving,
)

PHASES = ("alone", "batch_on_standby", "batch_on_spare_slots")
ONLINE, BULK = "online", "bulk"
GOAL_P99_RATIO = 1.1
ONLINE_MAX_TOKENS = 16
BATCH_MAX_TOKENS = 64
BATCH_LINES = 20_000  # more than any phase finishes: it is cancelled at the phase's end


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p, rounds_of="three phases")
    p.add_argument("--phase-s", type=float, default=30.0, help="seconds of online load per phase (default 30)")
    p.add_argument("--rate", type=float, default=4.0, help="online requests per second, Poisson (default 4)")
    p.add_argument("--seed", type=int, default=7, help="the arrival process's seed")


def _log(msg: str) -> None:
    print(f"[bench batch] {msg}", file=sys.stderr, flush=True)


def stack_config(store: Any, uris: list[str], data_dir: Path, port: int) -> dict[str, Any]:
    online_uri, bulk_uri = uris
    return base_config(store, data_dir, port, standby=1, max_instances=2,
                       models=[bench_model(ONLINE, online_uri, min_replicas=1, max_replicas=1),
                               bench_model(BULK, bulk_uri, min_replicas=0, max_replicas=1)],
                       batch={"poll_interval_s": 0.2})


def batch_input(model: str, n: int) -> bytes:
    return b"\n".join(json.dumps({
        "custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": f"Write about the number {i}."}],
                 "max_tokens": BATCH_MAX_TOKENS, "temperature": 0, "ignore_eos": True}}).encode()
        for i in range(n)) + b"\n"


def online_request(base_url: str, rid: str) -> dict[str, Any]:
    """One streamed chat completion to the online model: TTFT and outcome."""
    import httpx

    body = {"model": ONLINE, "messages": [{"role": "user", "content": "Tell me a short story."}],
            "max_tokens": ONLINE_MAX_TOKENS, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    out: dict[str, Any] = {"request_id": rid, "sent_at": time.time(), "ttft_s": None, "error": None}
    try:
        with httpx.stream("POST", f"{base_url}/chat/completions", json=body, timeout=120,
                          headers={"Authorization": f"Bearer {API_KEY}", "x-request-id": rid}) as r:
            if r.status_code != 200:
                out["error"] = f"HTTP {r.status_code}"
                return out
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        out["error"] = "stream error"
                        return out
                    delta = ((chunk.get("choices") or [{}])[0].get("delta") or {}).get("content")
                    if delta and out["ttft_s"] is None:
                        out["ttft_s"] = round(time.perf_counter() - t0, 4)
    except Exception as exc:  # a failed request is a sample too
        out["error"] = type(exc).__name__
    out["total_s"] = round(time.perf_counter() - t0, 4)
    return out


def online_load(base_url: str, rate: float, seconds: float, rng: random.Random) -> list[dict[str, Any]]:
    """Open loop: Poisson arrivals at ``rate`` for ``seconds``, each on a thread of its own."""
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    with ThreadPoolExecutor(max_workers=64) as pool:
        start = time.monotonic()
        at = 0.0
        futures = []
        while True:
            at += rng.expovariate(rate)
            if at >= seconds:
                break
            time.sleep(max(0.0, start + at - time.monotonic()))
            futures.append(pool.submit(online_request, base_url, f"bench-{uuid.uuid4().hex[:12]}"))
        for f in futures:
            r = f.result()
            with lock:
                results.append(r)
    return results


def run_phase(stack: Stack, phase: str, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    client = stack.client()
    batch = None
    if phase != "alone":
        model = BULK if phase == "batch_on_standby" else ONLINE
        f = client.files.create(file=(f"{phase}.jsonl", batch_input(model, BATCH_LINES)), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        if phase == "batch_on_standby":
            stack.wait(f"{BULK} on a lent standby", lambda: serving(stack.state(), BULK))

        def counts() -> int:
            b = client.batches.retrieve(batch.id)
            return b.request_counts.completed if b.request_counts else 0

        stack.wait("batch lines answered", lambda: counts() >= 1)
    before = counts() if batch is not None else 0
    t0 = time.monotonic()
    requests = online_load(stack.base_url, args.rate, args.phase_s, rng)
    took = time.monotonic() - t0
    lines = (counts() - before) if batch is not None else 0
    if batch is not None:
        client.batches.cancel(batch.id)
        stack.wait("the batch cancelled", lambda: client.batches.retrieve(batch.id).status == "cancelled")
        if phase == "batch_on_standby":
            stack.wait(f"{BULK} released", lambda: not serving(stack.state(), BULK))
    return {"phase": phase, "seconds": round(took, 2), "requests": requests, "batch_lines": lines,
            "batch_lines_per_s": round(lines / took, 3),
            "batch_tokens_per_s": round(lines * BATCH_MAX_TOKENS / took, 1)}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    phases: dict[str, Any] = {}
    for name in PHASES:
        mine = [r for r in runs if r["phase"] == name]
        reqs = [q for r in mine for q in r["requests"]]
        ttfts = [q["ttft_s"] for q in reqs if q["error"] is None and q["ttft_s"] is not None]
        secs = sum(r["seconds"] for r in mine)
        lines = sum(r["batch_lines"] for r in mine)
        phases[name] = {
            "requests": len(reqs), "errors": sum(1 for q in reqs if q["error"] is not None),
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p90_s": percentile(ttfts, 90),
            "ttft_p99_s": percentile(ttfts, 99),
            "batch_lines": lines, "batch_lines_per_s": round(lines / secs, 3) if secs else None,
            "batch_tokens_per_s": round(lines * BATCH_MAX_TOKENS / secs, 1) if secs else None,
        }
    base = phases["alone"]["ttft_p99_s"]
    ratios = {f"online_p99_{p}_vs_alone": (round(phases[p]["ttft_p99_s"] / base, 3)
                                           if base and phases[p]["ttft_p99_s"] else None)
              for p in PHASES if p != "alone"}
    goals = {k: {"goal": GOAL_P99_RATIO, "value": v, "met": v is not None and v <= GOAL_P99_RATIO}
             for k, v in ratios.items()}
    return {"phases": phases, "ratios": ratios, "goals": goals,
            "goals_not_met": sorted(k for k, g in goals.items() if not g["met"])}


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.phase_s <= 0 or args.rate <= 0:
        raise SystemExit("--rounds, --phase-s and --rate must be positive")
    started = time.time()
    runs: list[dict[str, Any]] = []
    rng = random.Random(args.seed)
    with running(args, "batch", (0, 1), stack_config) as (stack, environment):
        stack.wait("the online model warm and a standby",
                   lambda: (s := stack.state()) and serving(s, ONLINE)
                   and any(w["state"] == "standby" for w in s["workers"]))
        online_request(stack.base_url, "warm-up")
        for r in range(args.rounds):
            for phase in PHASES:
                _log(f"round {r + 1}/{args.rounds}: {phase}")
                runs.append(run_phase(stack, phase, args, rng))
    report = {"benchmark": "batch", **summarize(runs), "runs": runs, "environment": environment,
              "settings": {"rounds": args.rounds, "phase_s": args.phase_s, "rate_per_s": args.rate,
                           "online_max_tokens": ONLINE_MAX_TOKENS, "batch_max_tokens": BATCH_MAX_TOKENS,
                           "batch_max_share": 0.5, "size": args.size, "seed": args.seed,
                           "started_at": started, "wall_s": round(time.time() - started, 1)}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for name, p in report["phases"].items():
        _log(f"{name:22} online TTFT p50 {p['ttft_p50_s']} s p99 {p['ttft_p99_s']} s, {p['errors']} errors; "
             f"batch {p['batch_lines_per_s']} lines/s")
    _log(f"ratios {report['ratios']}; wrote {args.out}")
    return 0 if all(p["errors"] == 0 for p in report["phases"].values()) else 1
