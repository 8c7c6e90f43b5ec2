"""`thaw bench conversations`: what a continued conversation gets from stored state and
routing by conversation, against a plain load balancer in front of the same engines.

    thaw bench conversations --out conversations.json [--rounds 2] [--conversations 8] [--turns 6]

One ``thaw up`` (real vLLM on the CPU) with one model on two replicas. Each mode runs
``--conversations`` conversations at once, each ``--turns`` turns long (an opening
document of a few hundred tokens, then short questions), every turn streamed; the
modes are interleaved over ``--rounds`` rounds (the machine is shared: drift hits each
mode alike), and every conversation's opening is its own, so no mode finds another's
prefix in a cache:

``round_robin`` (the baseline)
    The client keeps the history and sends each turn as a chat completion straight to
    the engines, in turn: what a plain load balancer in front of vLLM does.
``thaw_chat``
    The client keeps the history and sends each turn through the activator, which
    routes by the prompt's prefix.
``thaw_responses``
    The Responses API through the activator: each turn sends only its new input and
    ``previous_response_id``; the history is Thaw's, stored at the controller, and the
    turn is routed by conversation.

Per mode, over the turns after the first: the share of prompt tokens the engine served
from its prefix cache (``cached_tokens``, as the engine reports it), TTFT p50/p90, the
share of turns served by the replica of the turn before, and the request bytes the
client sent; ``ratios`` compare each Thaw mode with ``round_robin``.

Module-level imports stay light: the CLI builds its parser from this module.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import random
import sys
import threading
import time
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

MODES = ("round_robin", "thaw_chat", "thaw_responses")
MODEL = "chat"
MAX_TOKENS = 24
OPENING_WORDS = 220
WORDS = ("river stone lantern orchard copper meadow signal harbor winter thread candle "
         "valley mirror garden engine ribbon forest marble window anchor").split()


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p, rounds_of="three modes")
    p.add_argument("--conversations", type=int, default=8, help="conversations at once per mode (default 8)")
    p.add_argument("--turns", type=int, default=6, help="turns per conversation (default 6)")
    p.add_argument("--seed", type=int, default=7, help="the openings' seed")


def _log(msg: str) -> None:
    print(f"[bench conversations] {msg}", file=sys.stderr, flush=True)


def stack_config(store: Any, uris: list[str], data_dir: Path, port: int) -> dict[str, Any]:
    return base_config(store, data_dir, port, standby=0, max_instances=2,
                       models=[bench_model(MODEL, uris[0], min_replicas=2, max_replicas=2, max_context_tokens=2048)])


def opening(rng: random.Random) -> str:
    return "Remember this document. " + " ".join(rng.choice(WORDS) for _ in range(OPENING_WORDS))


def _sse(lines: Any) -> Any:
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def chat_turn(url: str, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    """One streamed chat completion: TTFT, the text, the usage, who served it."""
    import httpx

    body = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    raw = json.dumps(body).encode()
    t0 = time.perf_counter()
    out: dict[str, Any] = {"ttft_s": None, "text": "", "usage": None, "sent_bytes": len(raw)}
    with httpx.stream("POST", f"{url}/chat/completions", content=raw, timeout=300,
                      headers={"Authorization": f"Bearer {API_KEY}", "content-type": "application/json"}) as r:
        r.raise_for_status()
        out["replica"] = r.headers.get("x-thaw-replica", url)
        for chunk in _sse(r.iter_lines()):
            if "error" in chunk:
                raise RuntimeError(f"error chunk from {url}: {chunk['error']}")
            delta = ((chunk.get("choices") or [{}])[0].get("delta") or {}).get("content")
            if delta:
                out["ttft_s"] = out["ttft_s"] or round(time.perf_counter() - t0, 4)
                out["text"] += delta
            if chunk.get("usage"):
                u = chunk["usage"]
                out["usage"] = (u["prompt_tokens"], (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    if out["usage"] is None:
        raise RuntimeError(f"no usage chunk from {url} (HTTP {r.status_code}, {len(out['text'])} chars)")
    return out


def responses_turn(base_url: str, text: str, previous: str | None) -> dict[str, Any]:
    """One streamed turn of the Responses API: TTFT, the response id, the usage, who served it."""
    import httpx

    body: dict[str, Any] = {"model": MODEL, "input": text, "max_output_tokens": MAX_TOKENS, "temperature": 0,
                            "stream": True}
    if previous:
        body["previous_response_id"] = previous
    raw = json.dumps(body).encode()
    t0 = time.perf_counter()
    out: dict[str, Any] = {"ttft_s": None, "id": None, "usage": None, "sent_bytes": len(raw)}
    with httpx.stream("POST", f"{base_url}/responses", content=raw, timeout=300,
                      headers={"Authorization": f"Bearer {API_KEY}", "content-type": "application/json"}) as r:
        r.raise_for_status()
        out["replica"] = r.headers.get("x-thaw-replica")
        for event in _sse(r.iter_lines()):
            if event["type"] == "response.output_text.delta":
                out["ttft_s"] = out["ttft_s"] or round(time.perf_counter() - t0, 4)
            elif event["type"] in ("response.completed", "response.incomplete"):  # incomplete: at max_output_tokens
                u = event["response"]["usage"]
                out["id"] = event["response"]["id"]
                out["usage"] = (u["input_tokens"], u["input_tokens_details"]["cached_tokens"])
            elif event["type"] == "error":
                raise RuntimeError(f"error event: {event}")
    if out["usage"] is None:
        raise RuntimeError(f"no response.completed or response.incomplete event (HTTP {r.status_code})")
    return out


def conversation(mode: str, stack: Stack, engines: list[tuple[str, str]], counter: Any, lock: threading.Lock,
                 rng: random.Random, turns: int) -> list[dict[str, Any]]:
    """One conversation in ``mode``; a record per turn."""
    first = opening(rng)
    history: list[dict[str, str]] = []
    previous: str | None = None
    records = []
    for n in range(turns):
        text = first if n == 0 else f"Question {n}: what came after the word {rng.choice(WORDS)}?"
        if mode == "thaw_responses":
            got = responses_turn(stack.base_url, text, previous)
            previous = got["id"]
        else:
            history.append({"role": "user", "content": text})
            if mode == "round_robin":
                with lock:
                    url, served = engines[next(counter) % len(engines)]
                got = chat_turn(f"{url}/v1", served, history)
            else:
                got = chat_turn(stack.base_url, MODEL, history)
            history.append({"role": "assistant", "content": got.pop("text")})
        prompt, cached = got["usage"]
        records.append({"turn": n, "ttft_s": got["ttft_s"], "prompt_tokens": prompt, "cached_tokens": cached,
                        "replica": got["replica"], "sent_bytes": got["sent_bytes"]})
    return records


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    modes: dict[str, Any] = {}
    for mode in MODES:
        convs = [c for r in runs if r["mode"] == mode for c in r["conversations"]]
        later = [t for c in convs for t in c[1:]]
        same = sum(1 for c in convs for a, b in itertools.pairwise(c) if a["replica"] == b["replica"])
        prompt = sum(t["prompt_tokens"] for t in later)
        ttfts = [t["ttft_s"] for t in later if t["ttft_s"] is not None]
        modes[mode] = {
            "conversations": len(convs), "continued_turns": len(later),
            "cached_share": round(sum(t["cached_tokens"] for t in later) / prompt, 4) if prompt else None,
            "prompt_tokens_mean": round(prompt / len(later), 1) if later else None,
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p90_s": percentile(ttfts, 90),
            "same_replica_share": round(same / len(later), 4) if later else None,
            "sent_bytes_mean": round(sum(t["sent_bytes"] for t in later) / len(later)) if later else None,
        }
    base = modes["round_robin"]

    def ratio(mode: str, key: str) -> float | None:
        a, b = modes[mode][key], base[key]
        return round(a / b, 3) if a is not None and b else None

    ratios = {f"{m}_{k}_vs_round_robin": ratio(m, k) for m in MODES[1:]
              for k in ("ttft_p50_s", "ttft_p90_s", "cached_share", "sent_bytes_mean")}
    return {"modes": modes, "ratios": ratios}


def engine_urls(stack: Stack) -> list[tuple[str, str]]:
    import httpx

    from thaw.auth import bearer, local_token

    r = httpx.get(f"{stack.control_url}/v1/routes", timeout=10, headers=bearer(local_token(stack.data_dir)))
    return [(x["url"], x["served_model_name"]) for x in r.json()["models"][MODEL]["replicas"]]


def run(args: argparse.Namespace) -> int:
    if min(args.rounds, args.conversations, args.turns - 1) < 1:
        raise SystemExit("--rounds and --conversations must be positive, --turns at least 2")
    started = time.time()
    runs: list[dict[str, Any]] = []
    with running(args, "conversations", (0,), stack_config) as (stack, environment):
        stack.wait("two ready replicas", lambda: sum(1 for w in stack.state()["workers"]
                                                     if w["model"] == MODEL and w["state"] == "ready") == 2)
        stack.wait("both in the route table", lambda: len(engine_urls(stack)) == 2, 60)
        engines = engine_urls(stack)
        counter, lock = itertools.count(), threading.Lock()
        for r in range(args.rounds):
            for mode in MODES:
                _log(f"round {r + 1}/{args.rounds}: {mode}")
                rngs = [random.Random(f"{args.seed}-{r}-{mode}-{i}") for i in range(args.conversations)]
                t0 = time.monotonic()
                with ThreadPoolExecutor(max_workers=args.conversations) as pool:
                    one = functools.partial(conversation, mode, stack, engines, counter, lock, turns=args.turns)
                    convs = list(pool.map(one, rngs))
                runs.append({"mode": mode, "round": r, "seconds": round(time.monotonic() - t0, 2),
                             "conversations": convs})
        assert serving(stack.state(), MODEL)
    report = {"benchmark": "conversations", **summarize(runs), "runs": runs, "environment": environment,
              "settings": {"rounds": args.rounds, "conversations": args.conversations, "turns": args.turns,
                           "max_tokens": MAX_TOKENS, "opening_words": OPENING_WORDS, "size": args.size,
                           "seed": args.seed, "started_at": started, "wall_s": round(time.time() - started, 1)}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for name, m in report["modes"].items():
        _log(f"{name:15} cached {m['cached_share']}, TTFT p50 {m['ttft_p50_s']} s p90 {m['ttft_p90_s']} s, "
             f"same replica {m['same_replica_share']}, {m['sent_bytes_mean']} bytes sent per turn")
    _log(f"ratios {report['ratios']}; wrote {args.out}")
    return 0
