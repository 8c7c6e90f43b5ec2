"""`thaw bench activator`: what the activator adds in front of a replica, and vllm-router as a peer.

    thaw bench activator --out bench_activator.json [--rates 50,100,200,...] [--duration-s 6]

One run starts, on loopback:

- a minimal fast upstream (:mod:`loadtests.fast_upstream`) that streams ``--tokens``
  one-token SSE chunks per request in vLLM's shape; it also serves the activator's
  route table, naming itself as the model's one ready replica;
- the activator (:mod:`loadtests.activator_process`: the app and server of `thaw
  activator`, with auth, limits, the model's tokenizer and chat template bounding or
  counting every prompt, routing, SSE proxy, usage tap, SQLite ledger), one process
  pinned to one core, or ``--activator-workers N`` on one port, all on that core;
- the bare proxy (:mod:`loadtests.bare_proxy`): the activator's server and upstream
  client and nothing else, the floor of a Python proxy, pinned to the same core;
- ``vllm-router`` (the Rust router from PyPI, policy ``cache_aware``) in front of the
  same upstream, pinned to the same core.

The load generator (open loop, Poisson arrivals, seeded) and the upstream share the
other core. For each offered rate, in ascending order, it runs ``--duration-s`` of
streaming chat completions straight at the upstream (``direct``), then through each
proxy in the order above, and records per request the latency from the
*scheduled* send time (so a proxy that falls behind is charged for its queue) to the
first body byte (TTFT) and to the end of the stream, and the tokens received.

Reported per target and rate: achieved rate, errors, p50/p99 TTFT and latency,
streamed tokens/s, the proxy's CPU time per request (and its split: user and kernel,
the processes' main threads against their other threads); for the proxies, the *added*
p50/p99 latency and TTFT (proxy minus direct at the same rate). A proxy *sustains*
a rate when every request succeeded and its added p99 latency is under
``--p99-budget-ms`` (10 ms); as latencies count from the scheduled send time, a proxy
that falls behind the arrivals fails this. ``max_sustained_rps`` is the highest rate
it sustained. A proxy is measured at higher rates until it is overloaded (errors, or
an added p50 past the budget) at two rates in a row. Each point
runs ``--duration-s`` or ``--min-requests`` requests, whichever is longer (a p99 of a
few hundred samples is mostly noise). The sweep ends at the first rate where the
direct path's own p99 passes the budget: there the generator and the upstream, not
the proxy, are the limit (``generator_saturated``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtests.activator_observers import otlp_sink, prompt_counts
from loadtests.activator_process import API_KEY, MODEL, activator_config
from loadtests.procs import cpu_split, pinned, serving, wait_for_files
from thaw.embedded_store import free_port

DEFAULT_RATES = (25, 50, 100, 150, 200, 300, 400, 600, 800, 1200)
TARGETS = ("direct", "activator", "activator_traced", "bare_proxy", "vllm_router")
# A point whose added median passes this was overloaded, not just noisy.
STEADY_ADDED_P50_MS = 10.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `thaw bench activator` (``--config`` and ``--log-level`` come from the CLI)."""
    p.add_argument("--out", default=None, metavar="FILE", help="write the JSON report here")
    p.add_argument("--rates", default=",".join(map(str, DEFAULT_RATES)),
                   help="offered request rates per second, ascending (default %(default)s)")
    p.add_argument("--duration-s", type=float, default=6.0,
                   help="seconds of load per rate and target, at least (default 6)")
    p.add_argument("--min-requests", type=int, default=1000,
                   help="requests per rate and target, at least: a p99 needs about a thousand (default 1000)")
    p.add_argument("--tokens", type=int, default=32, help="tokens streamed per request (default 32)")
    p.add_argument("--itl-ms", type=float, default=0.0, help="upstream pause between tokens (default 0)")
    p.add_argument("--p99-budget-ms", type=float, default=10.0,
                   help="added p99 latency under which a rate counts as sustained (default 10)")
    p.add_argument("--no-router", action="store_true", help="skip vllm-router")
    p.add_argument("--traced-ratio", type=float, default=0.01,
                   help="also measure an activator with tracing on (OTLP to a sink in this process), keeping "
                        "this share of requests (default 0.01); a negative value skips it")
    p.add_argument("--repeat", type=int, default=1,
                   help="measure each rate this many times, the targets' order alternating (default 1)")
    p.add_argument("--activator-workers", type=int, default=1, metavar="N",
                   help="processes per activator, on one port as `thaw activator --workers N` runs them, "
                        "all pinned to the proxy core (default 1)")
    p.add_argument("--seed", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    rates = sorted({float(r) for r in str(args.rates).split(",") if r.strip()})
    if not rates or rates[0] <= 0:
        print("--rates needs positive numbers", file=sys.stderr)
        return 2
    if args.activator_workers < 1:
        print("--activator-workers needs at least 1", file=sys.stderr)
        return 2
    router_bin = None if args.no_router else shutil.which("vllm-router") or _venv_bin("vllm-router")
    if not args.no_router and router_bin is None:
        print("vllm-router is not installed (pip install vllm-router, or --no-router)", file=sys.stderr)
        return 2
    report = asyncio.run(_bench(args, rates, router_bin))
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    _print_summary(report)
    return 0


def _venv_bin(name: str) -> str | None:
    p = Path(sys.executable).with_name(name)
    return str(p) if p.exists() else None


# -- processes under test -------------------------------------------------------------
def _cores() -> tuple[set[int] | None, set[int] | None]:
    """(proxy core, load generator + upstream cores); None where the machine has one core."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])


# -- load generator -------------------------------------------------------------------
@dataclass
class Sample:
    ok: bool
    ttft_s: float
    latency_s: float
    tokens: int
    error: str | None = None


async def _one(session: Any, url: str, body: bytes, headers: dict[str, str], scheduled: float) -> Sample:
    first = None
    buf = bytearray()
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            if resp.status != 200:
                text = await resp.text()
                return Sample(False, 0.0, time.perf_counter() - scheduled, 0, f"{resp.status}: {text[:200]}")
            async for chunk in resp.content.iter_any():
                if first is None:
                    first = time.perf_counter()
                buf += chunk
    except Exception as exc:  # noqa: BLE001 - every failure is a sample
        return Sample(False, 0.0, time.perf_counter() - scheduled, 0, f"{type(exc).__name__}: {exc}")
    end = time.perf_counter()
    tokens = buf.count(b'"content":" tok"')
    done = buf.rstrip().endswith(b"data: [DONE]")
    return Sample(done, (first or end) - scheduled, end - scheduled, tokens, None if done else "no [DONE]")


async def _load(base_url: str, rate: float, duration_s: float, tokens: int, seed: int) -> tuple[list[Sample], float]:
    """Open-loop Poisson arrivals at ``rate`` for ``duration_s``; returns the samples and
    the wall seconds from the first send to the last answer."""
    import aiohttp

    rng = random.Random(seed)
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "system", "content": "You are a benchmark."},
                                    {"role": "user", "content": "Say tok."}]}).encode()
    headers = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    url = base_url + "/v1/chat/completions"
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        tasks = []
        start = time.perf_counter()
        t = start
        while True:
            t += rng.expovariate(rate)
            if t - start >= duration_s:
                break
            delay = t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, url, body, headers, t)))
        samples = await asyncio.gather(*tasks)
        return list(samples), time.perf_counter() - start


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[k]


def summarize(samples: list[Sample], rate: float, duration_s: float, wall_s: float, cpu_s: float | None) -> dict[str, Any]:
    ok = [s for s in samples if s.ok]
    lat = [s.latency_s for s in ok]
    ttft = [s.ttft_s for s in ok]
    errors = [s.error for s in samples if not s.ok]
    ms = 1000.0
    return {
        "offered_rps": rate,
        "requests": len(samples),
        "achieved_rps": len(ok) / duration_s,
        "errors": len(errors),
        "error_examples": sorted(set(e for e in errors if e))[:3],
        "latency_p50_ms": _scale(_pct(lat, 50), ms),
        "latency_p99_ms": _scale(_pct(lat, 99), ms),
        "ttft_p50_ms": _scale(_pct(ttft, 50), ms),
        "ttft_p99_ms": _scale(_pct(ttft, 99), ms),
        "tokens_per_s": sum(s.tokens for s in ok) / wall_s if wall_s > 0 else None,
        "proxy_cpu_ms_per_request": (cpu_s * ms / len(samples)) if cpu_s is not None and samples else None,
    }


def _scale(v: float | None, k: float) -> float | None:
    return None if v is None else v * k


def added(proxy: dict[str, Any], direct: dict[str, Any]) -> dict[str, float | None]:
    """The proxy's figures minus the direct path's at the same rate."""
    out: dict[str, float | None] = {}
    for k in ("latency_p50_ms", "latency_p99_ms", "ttft_p50_ms", "ttft_p99_ms"):
        a, b = proxy.get(k), direct.get(k)
        out[f"added_{k}"] = None if a is None or b is None else a - b
    return out


def sustained(point: dict[str, Any], budget_ms: float) -> bool:
    # Latency counts from the scheduled send time, so a proxy that falls behind the
    # arrivals shows it here; errors would hide that, so there must be none.
    return (point["errors"] == 0 and point.get("added_latency_p99_ms") is not None
            and point["added_latency_p99_ms"] < budget_ms)


async def _bench(args: argparse.Namespace, rates: list[float], router_bin: str | None) -> dict[str, Any]:
    proxy_cores, gen_cores = _cores()
    before = os.sched_getaffinity(0)
    if gen_cores is not None:
        os.sched_setaffinity(0, gen_cores)
    try:
        return await _bench_in(args, rates, router_bin, proxy_cores, gen_cores)
    finally:
        os.sched_setaffinity(0, before)


async def _bench_in(args: argparse.Namespace, rates: list[float], router_bin: str | None,
                    proxy_cores: set[int] | None, gen_cores: set[int] | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="thaw-bench-activator-") as tmp:
        work = Path(tmp)
        import yaml

        up_port, act_port, router_port = free_port(), free_port(), free_port()
        cfg_path = work / "activator.yaml"
        cfg_path.write_text(yaml.safe_dump(activator_config(work, act_port)))
        from thaw.demo_model import build_demo_model

        build_demo_model(work / "model")  # its tokenizer and chat template
        upstream_url = f"http://127.0.0.1:{up_port}"
        py = sys.executable
        up_cmd = pinned([py, "-m", "loadtests.fast_upstream", "--port", str(up_port), "--model", MODEL,
                         "--tokens", str(args.tokens), "--itl-ms", str(args.itl_ms)], gen_cores)

        def activator(procs: ExitStack, cfg: Path, port: int) -> list[int]:
            """`--activator-workers` processes of the activator of ``cfg``: their pids, once each is up."""
            started = []
            for k in range(args.activator_workers):
                cmd = pinned([py, "-m", "loadtests.activator_process", "--config", str(cfg),
                              "--pool-url", upstream_url, "--model-dir", str(work / "model"),
                              "--worker", str(k), "--workers", str(args.activator_workers)], proxy_cores)
                started.append(procs.enter_context(serving(cmd, cfg.with_suffix(f".{k}.log"),
                                                           f"http://127.0.0.1:{port}/healthz")).pid)
            wait_for_files([cfg.with_name(f"{cfg.name}.ready.{k}") for k in range(args.activator_workers)])
            return started

        with ExitStack() as procs:
            procs.enter_context(serving(up_cmd, work / "upstream.log", upstream_url + "/health"))
            base = {"direct": upstream_url, "activator": f"http://127.0.0.1:{act_port}"}
            pids: dict[str, list[int]] = {"direct": [], "activator": activator(procs, cfg_path, act_port)}
            sink = None
            if args.traced_ratio >= 0:
                # The same activator with tracing on, its spans sent to a sink here.
                sink = procs.enter_context(otlp_sink())
                traced_port = free_port()
                traced_cfg = activator_config(work / "traced", traced_port)
                traced_cfg["telemetry"] = {"otlp_endpoint": sink.url, "sample_ratio": args.traced_ratio}
                (work / "traced").mkdir()
                (work / "traced.yaml").write_text(yaml.safe_dump(traced_cfg))
                pids["activator_traced"] = activator(procs, work / "traced.yaml", traced_port)
                base["activator_traced"] = f"http://127.0.0.1:{traced_port}"
            bare_port = free_port()
            bare = procs.enter_context(serving(
                pinned([py, "-m", "loadtests.bare_proxy", "--port", str(bare_port), "--upstream", upstream_url],
                       proxy_cores), work / "bare_proxy.log", f"http://127.0.0.1:{bare_port}/health"))
            base["bare_proxy"] = f"http://127.0.0.1:{bare_port}"
            pids["bare_proxy"] = [bare.pid]
            if router_bin is not None:
                router_cmd = pinned([router_bin, "--host", "127.0.0.1", "--port", str(router_port),
                                     "--worker-urls", upstream_url, "--policy", "cache_aware",
                                     "--log-level", "warning", "--max-concurrent-requests", "100000",
                                     "--queue-size", "100000", "--disable-retries",
                                     # Its metrics listener has a fixed default port.
                                     "--prometheus-host", "127.0.0.1",
                                     "--prometheus-port", str(free_port())], proxy_cores)
                router = procs.enter_context(
                    serving(router_cmd, work / "router.log", f"http://127.0.0.1:{router_port}/health"))
                base["vllm_router"] = f"http://127.0.0.1:{router_port}"
                pids["vllm_router"] = [router.pid]
            report = await _sweep(args, rates, base, pids, proxy_cores, gen_cores)
            data_dirs = {"activator": work / "data", "activator_traced": work / "traced" / "data"}
            if args.activator_workers == 1:  # (with more, /metrics is one worker's, whichever answers)
                report["prompt_counts"] = {t: prompt_counts(base[t], d) for t, d in data_dirs.items() if t in base}
            if sink is not None:
                procs.close()  # the traced activator sends its last spans as it stops
                requests = sum(p["requests"] for p in report["results"].get("activator_traced", []))
                report["tracing"] = {"sample_ratio": args.traced_ratio, "requests": requests,
                                     "spans_received": sink.spans, "exports_received": sink.exports}
            return report


async def _sweep(args: argparse.Namespace, rates: list[float], base: dict[str, str], pids: dict[str, list[int]],
                 proxy_cores: set[int] | None, gen_cores: set[int] | None) -> dict[str, Any]:
    targets = [t for t in TARGETS if t in base]
    # Warm every path (connections, caches, the ledger file) before measuring.
    for t in targets:
        await _load(base[t], 50.0, 1.0, args.tokens, args.seed)
    results: dict[str, list[dict[str, Any]]] = {t: [] for t in targets}
    misses = {t: 0 for t in targets if t != "direct"}
    saturated = False
    for i, rate in enumerate(rates):
        for rep in range(args.repeat):
            live = [t for t in targets if t == "direct" or misses[t] < 2]
            if live == ["direct"]:
                break
            if (i + rep) % 2 and "activator" in live and "activator_traced" in live:
                # Traced first every other time: neither is always the one measured after the other.
                a, b = live.index("activator"), live.index("activator_traced")
                live[a], live[b] = live[b], live[a]
            saturated = await _measure_rate(args, i, rep, rate, live, base, pids, results, misses)
            if saturated:
                break
        if saturated or (misses and all(m >= 2 for m in misses.values())):
            break
    summary = {t: _target_summary(results[t], results["direct"]) for t in targets if t != "direct"}
    return {
        "benchmark": "activator",
        "params": {"rates": rates, "repeat": args.repeat, "duration_s": args.duration_s,
                   "min_requests": args.min_requests,
                   "tokens": args.tokens, "itl_ms": args.itl_ms,
                   "p99_budget_ms": args.p99_budget_ms, "seed": args.seed,
                   "proxy_cores": sorted(proxy_cores) if proxy_cores else None,
                   "generator_and_upstream_cores": sorted(gen_cores) if gen_cores else None,
                   "activator_workers": args.activator_workers,
                   "vllm_router_policy": "cache_aware" if "vllm_router" in base else None},
        "environment": _environment(),
        "results": results,
        "summary": summary,
        "ratios": _ratios(results, summary),
        "cpu_cost": {t: cpu_cost(results[t]) for t in targets if t != "direct"},
    }


async def _measure_rate(args: argparse.Namespace, i: int, rep: int, rate: float, live: list[str],
                        base: dict[str, str], pids: dict[str, list[int]],
                        results: dict[str, list[dict[str, Any]]], misses: dict[str, int]) -> bool:
    """One rate, once, for each live target; True once the generator is the limit."""
    direct: dict[str, Any] | None = None
    duration = max(args.duration_s, args.min_requests / rate)
    seed = args.seed + i + 1000 * rep
    for t in live:
        procs = pids.get(t) or []
        cpu0 = cpu_split(procs) if procs else None
        samples, wall = await _load(base[t], rate, duration, args.tokens, seed)
        split = cpu_split(procs, since=cpu0) if cpu0 is not None else None
        point = summarize(samples, rate, duration, wall, split["total_s"] if split else None)
        if split is not None and samples:
            # Where the proxy's CPU went, per request: user and kernel time, and for the
            # activator its event loops' threads against the rest (the ledger's writer).
            point["proxy_cpu_split_ms_per_request"] = {k.removesuffix("_s"): v * 1000 / len(samples)
                                                       for k, v in split.items() if k != "total_s"}
        point["repeat"] = rep
        if t == "direct" and not _within(point, args.p99_budget_ms):
            # Once more before concluding: a shared machine has its moments.
            samples, wall = await _load(base[t], rate, duration, args.tokens, seed)
            point = summarize(samples, rate, duration, wall, None)
            point["repeat"] = rep
        if t == "direct":
            direct = point
            if not _within(point, args.p99_budget_ms):
                # The load generator and the upstream (one core) are the limit here:
                # nothing in front of them can be judged at this rate or above.
                point["generator_saturated"] = True
                results[t].append(point)
                print(_line(t, point) + "  (generator saturated: sweep ends)", file=sys.stderr, flush=True)
                return True
        else:
            assert direct is not None
            point.update(added(point, direct))
            point["sustained"] = sustained(point, args.p99_budget_ms)
            # Keep measuring a proxy that misses the p99 budget (its figures at more
            # rates are the point); stop once it is overloaded: errors, or a median
            # past the budget.
            overloaded = point["errors"] > 0 or (point["added_latency_p50_ms"] or 0) >= args.p99_budget_ms
            misses[t] = misses[t] + 1 if overloaded else 0
        results[t].append(point)
        print(_line(t, point), file=sys.stderr, flush=True)
    return False


def _within(point: dict[str, Any], budget_ms: float) -> bool:
    return point["errors"] == 0 and point["latency_p99_ms"] is not None and point["latency_p99_ms"] < budget_ms


def _target_summary(points: list[dict[str, Any]], direct: list[dict[str, Any]]) -> dict[str, Any]:
    # With --repeat, a rate is sustained when every time it was measured was.
    by_rate: dict[float, list[bool]] = {}
    for p in points:
        by_rate.setdefault(p["offered_rps"], []).append(bool(p.get("sustained")))
    best = max((r for r, oks in by_rate.items() if all(oks)), default=None)
    # A proxy still sustaining the highest rate the generator could offer was not
    # measured to its limit.
    judged = [d["offered_rps"] for d in direct if not d.get("generator_saturated")]
    return {"max_sustained_rps": best, "lower_bound_only": best is not None and best == max(judged, default=None),
            "rates_tried": list(by_rate)}


def _common(results: dict[str, list[dict[str, Any]]], a: str, b: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    # Paired by rate and repeat: measured one after the other.
    pb = {(p["offered_rps"], p.get("repeat", 0)): p for p in results.get(b, [])}
    return [(p, pb[k]) for p in results.get(a, []) if (k := (p["offered_rps"], p.get("repeat", 0))) in pb]


def _ratios(results: dict[str, list[dict[str, Any]]], summary: dict[str, Any]) -> dict[str, float | None]:
    """Ratios of the same run: activator over vllm-router and over the direct path."""
    out: dict[str, float | None] = {}
    act = summary.get("activator", {}).get("max_sustained_rps")
    rt = summary.get("vllm_router", {}).get("max_sustained_rps")
    out["max_sustained_rps_activator_over_router"] = (act / rt) if act and rt else None
    traced = summary.get("activator_traced", {}).get("max_sustained_rps")
    out["max_sustained_rps_traced_over_untraced"] = (traced / act) if traced and act else None
    # At the lowest rate every target ran: latency and tokens/s against direct and the router.
    first = {t: pts[0] for t, pts in results.items() if pts}
    d, a, r = first.get("direct"), first.get("activator"), first.get("vllm_router")

    def div(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None or y == 0 else x / y

    if d and a:
        out["latency_p50_activator_over_direct_at_lowest_rate"] = div(a["latency_p50_ms"], d["latency_p50_ms"])
        out["tokens_per_s_activator_over_direct_at_lowest_rate"] = div(a["tokens_per_s"], d["tokens_per_s"])
    if a and r:
        out["added_p50_ms_activator_over_router_at_lowest_rate"] = div(
            a.get("added_latency_p50_ms"), r.get("added_latency_p50_ms"))
    # CPU per request, rate by rate (the median of the ratios): against the router, and
    # split at the bare Python proxy (what Python costs; what the activator's work costs).
    for a_, b_ in (("activator", "vllm_router"), ("bare_proxy", "vllm_router"), ("activator", "bare_proxy")):
        if results.get(a_) and results.get(b_):
            out[f"cpu_per_request_{a_}_over_{b_.removeprefix('vllm_')}_median"] = _median_ratio(
                [div(x["proxy_cpu_ms_per_request"], y["proxy_cpu_ms_per_request"]) for x, y in _common(results, a_, b_)])
    # Tracing on (at --traced-ratio) over off, pair by pair (the same rate, one after the
    # other) where neither was overloaded: a p99 past the budget is this machine's noise
    # as often as the proxy's, and CPU per request is measured either way.
    both = [(x, y) for x, y in _common(results, "activator_traced", "activator") if _steady(x) and _steady(y)]
    out["traced_untraced_pairs"] = len(both)
    for key in ("proxy_cpu_ms_per_request", "added_latency_p50_ms", "added_latency_p99_ms"):
        out[f"{key.removeprefix('proxy_')}_traced_over_untraced_median"] = _median_ratio(
            [div(x[key], y[key]) for x, y in both])
    return out


def cpu_cost(points: list[dict[str, Any]]) -> dict[str, float] | None:
    """A proxy's CPU as a fixed part and a slope: the least-squares line through its CPU
    per second against the rate it carried (``fixed_ms_per_s``: what it spends whatever
    the load, e.g. its background tasks; ``ms_per_request``: what each request adds)."""
    measured = [p for p in points if p.get("proxy_cpu_ms_per_request") is not None]
    if len({p["offered_rps"] for p in measured}) < 2:  # one rate (repeated or not) has no slope
        return None
    xy = [(p["achieved_rps"], p["proxy_cpu_ms_per_request"] * p["achieved_rps"]) for p in measured]
    n = len(xy)
    mx, my = sum(x for x, _ in xy) / n, sum(y for _, y in xy) / n
    slope = sum((x - mx) * (y - my) for x, y in xy) / sum((x - mx) ** 2 for x, _ in xy)
    return {"fixed_ms_per_s": my - slope * mx, "ms_per_request": slope, "points": n}


def _steady(point: dict[str, Any]) -> bool:
    return point["errors"] == 0 and (point.get("added_latency_p50_ms") or 0) < STEADY_ADDED_P50_MS


def _median_ratio(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _environment() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    def v(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "uvicorn": v("uvicorn"), "fastapi": v("fastapi"), "httpx": v("httpx"), "uvloop": v("uvloop"),
            "vllm_router": v("vllm-router"), "aiohttp": v("aiohttp")}


def _fmt(v: Any, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _line(target: str, p: dict[str, Any]) -> str:
    extra = ""
    if "added_latency_p99_ms" in p:
        extra = (f"  added p50 {_fmt(p['added_latency_p50_ms'], '.2f')} p99 {_fmt(p['added_latency_p99_ms'], '.2f')} ms"
                 f"  {'ok' if p['sustained'] else 'MISS'}")
    return (f"{target:12s} {p['offered_rps']:7.0f} rps: got {p['achieved_rps']:7.1f}, err {p['errors']},"
            f" ttft p50 {_fmt(p['ttft_p50_ms'], '.2f')} p99 {_fmt(p['ttft_p99_ms'], '.2f')},"
            f" lat p50 {_fmt(p['latency_p50_ms'], '.2f')} p99 {_fmt(p['latency_p99_ms'], '.2f')} ms,"
            f" {_fmt(p['tokens_per_s'], '.0f')} tok/s, cpu/req {_fmt(p['proxy_cpu_ms_per_request'], '.2f')} ms{extra}")


def _print_summary(report: dict[str, Any]) -> None:
    for t, s in report["summary"].items():
        bound = " (the highest rate tried: a lower bound)" if s["lower_bound_only"] else ""
        print(f"{t}: max sustained {_fmt(s['max_sustained_rps'], '.0f')} rps "
              f"(added p99 < {report['params']['p99_budget_ms']:.0f} ms, no errors){bound}")
    for k, v in report["ratios"].items():
        print(f"  {k}: {_fmt(v, '.3f')}")
    for t, c in report.get("cpu_cost", {}).items():
        if c is not None:
            print(f"{t}: CPU {c['fixed_ms_per_s']:.1f} ms per second + {c['ms_per_request']:.3f} ms per request")
    for t, c in report.get("prompt_counts", {}).items():
        print(f"{t}: prompts counted exactly {c.get('exact', 0):.0f}, decided by their bound {c.get('bound', 0):.0f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
