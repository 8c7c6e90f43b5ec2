"""`thaw load run`: replay a request trace against a running Thaw, open loop, and record each request.

    thaw load run --trace FILE [--format FMT] --base-url URL --api-key KEY --out-dir DIR
                  [--speedup X] [--max-requests N] [--duration-s S] [--model-map TRACE=SERVED ...]
                  [--seed N] [--max-tokens-cap N] [--max-input-tokens N] [--timeout-s S] [--grace-s S]
                  [--controller URL --cluster-token TOKEN]

The trace is read with :func:`simulator.traces.read_trace` (generic, azure, mooncake,
servegen). Request ``i`` is sent ``t[i] / speedup`` seconds after the run's start
whether or not earlier ones have answered (one asyncio task per request): the stack
sees the trace's arrivals, not a rate the answers allow. Each is a streaming chat
completion through the official ``openai`` client (no retries) with a synthetic prompt
of about the trace's input tokens and ``max_tokens`` = its output tokens (capped).

``--duration-s`` is the schedule window: requests scheduled later are not sent.
Requests still running when the window ends get ``--grace-s`` more, then are
cancelled and recorded as such. ``--max-requests`` keeps the first N.

Written to DIR: ``requests.jsonl`` (one record per request, as it ends), ``run.json``
(config, counts, the generator's lag) and, with ``--controller``, ``replicas.jsonl``
(the controller's replicas per model, polled). The shapes are in
:mod:`loadtests.load_schema`; `thaw load report DIR` turns them into figures.

``--send-overhead-ms`` is a test knob: it blocks the event loop that long after every
send, as a generator too slow for its trace would, so a test can see
``generator_fell_behind`` raised.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from loadtests.load_schema import (
    REPLICAS_FILE,
    REQUESTS_FILE,
    RUN_FILE,
    ReplicaSample,
    RequestRecord,
    RunConfig,
    RunInfo,
)
from loadtests.load_stats import DEFAULT_LAG_THRESHOLD_MS, counts, fell_behind, lag_summary, tier_of
from thaw.aio import wait_event
from thaw.cli.aliases import add_renamed_flag

if TYPE_CHECKING:
    import openai

    from simulator.traces import Trace

FORMATS = ("generic", "azure", "mooncake", "servegen")  # simulator.traces.FORMATS, without importing numpy
DEFAULT_MAX_TOKENS_CAP = 64
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_GRACE_S = 60.0
# Tokens the chat template and the "Request N:" opener add around the words (the demo
# model's Llama-3 template: about ten): subtracted so the prompt is about the trace's size.
PROMPT_OVERHEAD_TOKENS = 14
# Common English words: about one token each in Llama-style tokenizers (1.09 for the
# demo model's), so n words make a prompt of about n tokens.
_WORDS = (
    "the of and to in is it that was for on are with as his they at be this from have or by one had "
    "not but what all were when we there can an your which their said if do will each about how up "
    "out them then she many some so these would other into has more her two like him see time could "
    "no make than first been its who now people my made over did down only way find use may water "
    "long little very after words called just where most know"
).split()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `thaw load run`."""
    p.add_argument("--trace", required=True, metavar="FILE", help="the request trace")
    p.add_argument("--format", choices=FORMATS, default=None, help="the trace's format (default: told from the file)")
    p.add_argument("--base-url", required=True, metavar="URL", help="the OpenAI API root, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--api-key", required=True, metavar="KEY", help="a tenant's API key (`thaw tenants keys add`)")
    add_renamed_flag(p, "--out", "--out-dir", dest="out")
    p.add_argument("--out-dir", dest="out", required=True, metavar="DIR", help="where the records and run.json go")
    p.add_argument("--speedup", type=float, default=1.0, help="replay X times faster than the trace (default 1)")
    p.add_argument("--max-requests", type=int, default=None, metavar="N", help="send at most the first N requests")
    p.add_argument("--duration-s", type=float, default=None, metavar="S",
                   help="schedule window: send only requests due in the first S seconds (after --speedup)")
    p.add_argument("--model-map", action="append", default=[], metavar="TRACE=SERVED",
                   help="send the trace's model TRACE as SERVED (repeatable; other models go unchanged)")
    p.add_argument("--seed", type=int, default=0, help="seeds the prompts (and servegen arrivals)")
    p.add_argument("--max-tokens-cap", type=int, default=DEFAULT_MAX_TOKENS_CAP, metavar="N",
                   help=f"max_tokens is the trace's output tokens, at most N (default {DEFAULT_MAX_TOKENS_CAP}; "
                        "0: no cap)")
    p.add_argument("--max-input-tokens", type=int, default=None, metavar="N",
                   help="make prompts of at most about N tokens (default: the trace's sizes)")
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"the client's timeout for any one read: headers, or the next chunk (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--grace-s", type=float, default=DEFAULT_GRACE_S, metavar="S",
                   help=f"after the window, wait this long for running requests, then cancel them "
                        f"(default {DEFAULT_GRACE_S:g})")
    p.add_argument("--lag-threshold-ms", type=float, default=DEFAULT_LAG_THRESHOLD_MS, metavar="MS",
                   help="the generator fell behind when its p99 send lag passes this (default %(default)s)")
    add_renamed_flag(p, "--controller-url", "--controller", dest="controller_url")
    p.add_argument("--controller", dest="controller_url", default=None, metavar="URL",
                   help="poll this controller's /v1/state for replicas per model (default: derive replicas "
                        "in use from x-thaw-replica)")
    p.add_argument("--cluster-token", default=None, metavar="TOKEN",
                   help="the controller's bearer token (default: $THAW_CLUSTER_TOKEN)")
    p.add_argument("--poll-interval-s", type=float, default=1.0, metavar="S",
                   help="how often to poll the controller (default 1)")
    p.add_argument("--send-overhead-ms", type=float, default=0.0, metavar="MS",
                   help="test knob: block the event loop this long after each send, so the generator falls behind")


# -- the plan (pure) -----------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    """One request to send: when (seconds from the run's start) and what."""

    index: int
    at_s: float
    trace_model: str
    model: str
    tenant: str | None
    input_tokens: int
    max_tokens: int


def parse_model_map(items: Sequence[str]) -> dict[str, str]:
    """``["a=served-a", ...]`` as a dict; raises ValueError naming a malformed item."""
    out: dict[str, str] = {}
    for item in items:
        trace_name, sep, served = item.partition("=")
        if not sep or not trace_name or not served:
            raise ValueError(f"--model-map {item!r}: expected TRACE=SERVED")
        out[trace_name] = served
    return out


def plan_requests(trace: Trace, *, speedup: float, max_requests: int | None, duration_s: float | None,
                  model_map: dict[str, str], max_tokens_cap: int | None,
                  max_input_tokens: int | None = None) -> list[Planned]:
    """The requests to send, in trace order: those due before ``duration_s`` (after the
    speedup), at most ``max_requests`` of them; ``max_tokens`` and the prompt's size
    capped by ``max_tokens_cap`` and ``max_input_tokens`` (None: no cap)."""
    out: list[Planned] = []
    for i, t in enumerate(trace.t):
        at = t / speedup
        if (duration_s is not None and at >= duration_s) or (max_requests is not None and len(out) >= max_requests):
            break
        name = trace.models[trace.model[i]]
        out_tokens = trace.output_tokens[i]
        if max_tokens_cap:
            out_tokens = min(out_tokens, max_tokens_cap)
        out.append(Planned(index=i, at_s=at, trace_model=name, model=model_map.get(name, name),
                           tenant=trace.tenants[trace.tenant[i]],
                           input_tokens=min(trace.input_tokens[i], max_input_tokens or trace.input_tokens[i]),
                           # A request for no tokens is not a completion a server serves.
                           max_tokens=max(1, out_tokens)))
    return out


class PromptSynth:
    """Prompts of about n tokens, deterministic from the seed and the request's index.

    One pool of words is drawn once; a request's prompt is a slice of it at an offset
    drawn from (seed, index), opened with the index so no two prompts share a prefix
    beyond their first tokens. Slicing costs microseconds, so the generator's loop is
    not held up by long prompts."""

    def __init__(self, seed: int, max_words: int) -> None:
        rng = random.Random(seed)
        words = rng.choices(_WORDS, k=max(0, max_words) + 1024)
        self._text = " ".join(words)
        self._starts: list[int] = []
        pos = 0
        for w in words:
            self._starts.append(pos)
            pos += len(w) + 1
        self._starts.append(pos)  # the end, as if one more word followed
        self._seed = seed

    def prompt(self, index: int, tokens: int) -> str:
        n = max(1, tokens - PROMPT_OVERHEAD_TOKENS)
        n = min(n, len(self._starts) - 1)
        off = random.Random(self._seed * 1_000_003 + index).randrange(len(self._starts) - n)
        return f"Request {index}: " + self._text[self._starts[off]:self._starts[off + n] - 1]


# -- the open loop ---------------------------------------------------------------------


class Clock(Protocol):
    """The generator's time: monotonic seconds, and a sleep on the same scale."""

    def now(self) -> float: ...

    async def sleep(self, s: float) -> None: ...


class MonotonicClock:
    def now(self) -> float:
        return time.perf_counter()

    async def sleep(self, s: float) -> None:
        await asyncio.sleep(max(0.0, s))


@dataclass(frozen=True)
class LoopResult:
    sent_s: dict[int, float]  # index -> when it was sent, from the start
    end_s: float  # when the last request ended or was cancelled
    cancelled: int  # tasks still running at the deadline


Send = Callable[[Planned, float], Coroutine[Any, Any, None]]


async def open_loop(plan: Sequence[Planned], send: Send, clock: Clock, *, start: float, window_s: float,
                    grace_s: float, send_overhead_s: float = 0.0,
                    block: Callable[[float], None] = time.sleep) -> LoopResult:
    """Send each planned request at ``start + at_s`` as its own task, whatever the
    others are doing; then wait for them until ``start + window_s + grace_s`` and cancel
    the rest. ``send(p, sent_s)`` records its request itself, cancelled or not.

    ``send_overhead_s`` (a test knob) calls ``block`` that long after every send: with
    the default ``time.sleep`` it stalls the loop, as a generator too slow for its trace."""
    tasks: list[asyncio.Task[None]] = []
    sent: dict[int, float] = {}
    for p in plan:
        delay = start + p.at_s - clock.now()
        if delay > 0:
            await clock.sleep(delay)
        sent_s = clock.now() - start
        sent[p.index] = sent_s
        tasks.append(asyncio.create_task(send(p, sent_s)))
        if send_overhead_s > 0:
            block(send_overhead_s)
    cancelled = 0
    pending = [t for t in tasks if not t.done()]
    if pending:
        all_done = asyncio.gather(*pending, return_exceptions=True)
        timer = asyncio.create_task(clock.sleep(start + window_s + grace_s - clock.now()))
        waiters: list[asyncio.Future[Any]] = [all_done, timer]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        timer.cancel()
        for t in tasks:
            if not t.done():
                t.cancel()
                cancelled += 1
        await asyncio.gather(*tasks, all_done, return_exceptions=True)
    return LoopResult(sent, clock.now() - start, cancelled)


# -- one request -------------------------------------------------------------------------


def apply_headers(rec: RequestRecord, headers: Any) -> None:
    """The activator's headers into the record (``headers``: a case-insensitive mapping)."""
    rec.request_id = headers.get("x-request-id")
    cold = headers.get("x-thaw-cold-start")
    rec.cold_start = None if cold is None else cold.strip().lower() == "true"
    queue_ms = headers.get("x-thaw-queue-ms")
    try:
        rec.queue_ms = None if queue_ms is None else float(queue_ms)
    except ValueError:
        rec.queue_ms = None
    rec.replica = headers.get("x-thaw-replica")
    tier = headers.get("x-thaw-tier")
    rec.tier = tier_of(cold, tier)
    rec.tier_from_header = bool(tier)


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "…"


class Sender:
    """Sends one planned request through the openai client and records what it saw."""

    def __init__(self, client: openai.AsyncOpenAI, prompts: PromptSynth, clock: Clock, start: float,
                 on_record: Callable[[RequestRecord], None]) -> None:
        self.client = client
        self.prompts = prompts
        self.clock = clock
        self.start = start
        self.on_record = on_record

    async def __call__(self, p: Planned, sent_s: float) -> None:
        import openai

        rec = RequestRecord(index=p.index, trace_model=p.trace_model, model=p.model, tenant=p.tenant,
                            input_tokens=p.input_tokens, max_tokens=p.max_tokens, scheduled_s=p.at_s,
                            sent_s=sent_s, lag_s=sent_s - p.at_s)
        t0 = self.start + sent_s
        chunks = 0
        usage_seen = False
        last: float | None = None
        try:
            async with self.client.chat.completions.with_streaming_response.create(
                model=p.model, messages=[{"role": "user", "content": self.prompts.prompt(p.index, p.input_tokens)}],
                max_tokens=p.max_tokens, stream=True, stream_options={"include_usage": True},
            ) as resp:
                rec.status = resp.status_code
                apply_headers(rec, resp.headers)
                stream = await resp.parse()
                async for chunk in stream:
                    if chunk.usage is not None:
                        usage_seen = True
                        rec.completion_tokens = chunk.usage.completion_tokens
                        rec.prompt_tokens = chunk.usage.prompt_tokens
                    if not any(c.delta is not None and c.delta.content for c in chunk.choices):
                        continue  # the role chunk, a finish reason, the usage
                    now = self.clock.now()
                    if last is None:
                        rec.ttft_s = now - t0
                    else:
                        rec.inter_token_s.append(now - last)
                    last = now
                    chunks += 1
            rec.finished = True
        except asyncio.CancelledError:
            rec.cancelled = True
            raise
        except openai.APIStatusError as exc:
            rec.status = exc.status_code
            apply_headers(rec, exc.response.headers)
            rec.error_type, rec.error = type(exc).__name__, _short(exc)
        except Exception as exc:  # noqa: BLE001 - every failure is a record
            rec.error_type, rec.error = type(exc).__name__, _short(exc)
        finally:
            rec.end_s = self.clock.now() - self.start
            if not usage_seen:
                rec.completion_tokens = chunks
            self.on_record(rec)


# -- the controller's view of replicas ----------------------------------------------------


async def poll_replicas(url: str, token: str | None, clock: Clock, start: float, interval_s: float,
                        on_sample: Callable[[ReplicaSample], None], stop: asyncio.Event) -> int:
    """Poll ``url``/v1/state every ``interval_s`` until ``stop``; each model's replicas
    per state go to ``on_sample``. Returns how many polls failed (they are skipped)."""
    import httpx

    headers = {"authorization": f"Bearer {token}"} if token else {}
    errors = 0
    async with httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=5.0) as http:
        while not stop.is_set():
            try:
                r = await http.get("/v1/state")
                r.raise_for_status()
                t = clock.now() - start
                for m in r.json().get("models", []):
                    on_sample(ReplicaSample(t_s=t, model=m.get("served_name") or m["name"],
                                            replicas=dict(m.get("replicas") or {})))
            except (httpx.HTTPError, ValueError, KeyError):
                errors += 1
            await wait_event(stop, interval_s)
    return errors


# -- the command ---------------------------------------------------------------------


class _Lines:
    """A JSONL file written as records come (so a killed run keeps what it saw)."""

    def __init__(self, f: IO[str]) -> None:
        self.f = f
        self.n = 0

    def write(self, model: Any) -> None:
        self.f.write(model.model_dump_json() + "\n")
        self.f.flush()
        self.n += 1


def _check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, if anything."""
    if not (args.speedup > 0 and math.isfinite(args.speedup)):
        return f"--speedup must be a positive number, not {args.speedup}"
    for name in ("max_requests", "max_input_tokens"):
        v = getattr(args, name)
        if v is not None and v < 1:
            return f"--{name.replace('_', '-')} must be >= 1, not {v}"
    if args.max_tokens_cap < 0:
        return f"--max-tokens-cap must be >= 0, not {args.max_tokens_cap}"
    for name in ("duration_s", "timeout_s", "poll_interval_s"):
        v = getattr(args, name)
        if v is not None and not v > 0:
            return f"--{name.replace('_', '-')} must be > 0, not {v}"
    for name in ("grace_s", "send_overhead_ms", "lag_threshold_ms"):
        if getattr(args, name) < 0:
            return f"--{name.replace('_', '-')} must be >= 0, not {getattr(args, name)}"
    return None


def run(args: argparse.Namespace) -> int:
    """`thaw load run`: replay, write DIR, print a summary; 2 for bad options or trace."""
    import os

    from simulator.traces import TraceError, read_trace

    problem = _check(args)
    try:
        model_map = parse_model_map(args.model_map)
    except ValueError as exc:
        problem = problem or str(exc)
    if problem:
        print(f"thaw load run: {problem}", file=sys.stderr)
        return 2
    try:
        trace = read_trace(args.trace, args.format, seed=args.seed)
    except (TraceError, ValueError) as exc:
        print(f"thaw load run: {exc}", file=sys.stderr)
        return 2
    plan = plan_requests(trace, speedup=args.speedup, max_requests=args.max_requests, duration_s=args.duration_s,
                         model_map=model_map, max_tokens_cap=args.max_tokens_cap or None,
                         max_input_tokens=args.max_input_tokens)
    token = args.cluster_token or os.environ.get("THAW_CLUSTER_TOKEN")
    config = RunConfig(trace=str(args.trace), format=args.format, base_url=args.base_url, speedup=args.speedup,
                       max_requests=args.max_requests, duration_s=args.duration_s, model_map=model_map,
                       seed=args.seed, max_tokens_cap=args.max_tokens_cap or None,
                       max_input_tokens=args.max_input_tokens, timeout_s=args.timeout_s, grace_s=args.grace_s,
                       send_overhead_ms=args.send_overhead_ms, controller_url=args.controller_url,
                       poll_interval_s=args.poll_interval_s)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / REQUESTS_FILE, "w", encoding="utf-8") as rf, \
            open(out / REPLICAS_FILE, "w", encoding="utf-8") as pf:
        info = asyncio.run(replay(plan, config, api_key=args.api_key, cluster_token=token,
                                  trace_requests=len(trace), lag_threshold_ms=args.lag_threshold_ms,
                                  on_record=_Lines(rf).write, on_sample=_Lines(pf).write))
    if not config.controller_url:
        (out / REPLICAS_FILE).unlink()
    (out / RUN_FILE).write_text(info.model_dump_json(indent=2) + "\n", encoding="utf-8")
    _print_summary(info, out)
    return 0


def _unlimited_connections() -> Any:
    """The openai client's httpx client without a connection limit: the default (1000)
    would queue requests inside the client at a cold start, a wait that neither the
    generator's lag nor the server's headers would show."""
    import openai

    limits = type(openai.DEFAULT_CONNECTION_LIMITS)(max_connections=None, max_keepalive_connections=256)
    return openai.DefaultAsyncHttpxClient(limits=limits)


async def _warm_up(client: openai.AsyncOpenAI) -> None:
    """Pay the client's first-use costs before time 0: its first request builds its
    resources, response types and connection in the event loop (about 0.1 s, blocking),
    which would make the first sends late. ``GET /v1/models`` loads no model and is not
    metered; its answer, even an error, does not matter."""
    import openai
    from openai.types.chat import ChatCompletionChunk

    _ = client.chat.completions.with_streaming_response
    ChatCompletionChunk.model_validate({
        "id": "warm-up", "object": "chat.completion.chunk", "created": 0, "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "x"}, "finish_reason": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
    try:
        await client.models.list()
    except openai.APIError:
        pass


async def replay(plan: Sequence[Planned], config: RunConfig, *, api_key: str, cluster_token: str | None,
                 trace_requests: int, on_record: Callable[[RequestRecord], None],
                 on_sample: Callable[[ReplicaSample], None] = lambda s: None,
                 lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS, clock: Clock | None = None) -> RunInfo:
    """Send ``plan`` to ``config.base_url`` open loop; each request's record goes to
    ``on_record`` as it ends (and, with a controller, each poll's samples to
    ``on_sample``). Returns the run's summary (what run.json holds)."""
    import openai

    clock = clock or MonotonicClock()
    window_s = config.duration_s if config.duration_s is not None else (plan[-1].at_s if plan else 0.0)
    prompts = PromptSynth(config.seed, max((p.input_tokens for p in plan), default=0))
    client = openai.AsyncOpenAI(base_url=config.base_url, api_key=api_key, max_retries=0,
                                timeout=openai.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s)),
                                http_client=_unlimited_connections())
    await _warm_up(client)
    records: list[RequestRecord] = []

    def record(r: RequestRecord) -> None:
        records.append(r)
        on_record(r)

    started_at = time.time()
    start = clock.now()
    stop = asyncio.Event()
    poller = None
    if config.controller_url:
        poller = asyncio.create_task(poll_replicas(config.controller_url, cluster_token, clock, start,
                                                   config.poll_interval_s, on_sample, stop))
    try:
        result = await open_loop(plan, Sender(client, prompts, clock, start, record), clock, start=start,
                                 window_s=window_s, grace_s=config.grace_s,
                                 send_overhead_s=config.send_overhead_ms / 1000.0)
    finally:
        stop.set()
        poll_errors = await poller if poller is not None else 0
        await client.close()
    lag = lag_summary([r.lag_s for r in records], lag_threshold_ms)
    return RunInfo(config=config, started_at=started_at, window_s=window_s, duration_s=result.end_s,
                   counts=counts(records, trace_requests, len(plan)), lag=lag, generator_fell_behind=fell_behind(lag),
                   replicas_source="controller" if config.controller_url else "x-thaw-replica",
                   controller_poll_errors=poll_errors)


def _print_summary(info: RunInfo, out: Path) -> None:
    c, lag = info.counts, info.lag
    print(f"sent {c.sent} of {c.trace_requests} trace requests in {info.duration_s:.1f} s: "
          f"{c.completed} completed, {c.errors} errors, {c.cancelled} cancelled")
    behind = "YES" if info.generator_fell_behind else "no"
    print(f"generator fell behind: {behind} (send lag p99 {_ms(lag.p99_ms)}, max {_ms(lag.max_ms)}, "
          f"{lag.over_threshold} over {lag.threshold_ms:g} ms)")
    print(f"records in {out / REQUESTS_FILE}; figures: thaw load report {out}")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

