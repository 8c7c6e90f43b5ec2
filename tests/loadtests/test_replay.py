"""`thaw load run` and `thaw load report`: the plan, the open loop on a virtual clock, the
records against a fake OpenAI server, and the report's arithmetic."""

from __future__ import annotations

import asyncio
import heapq
import json
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from loadtests import load_run, load_stats
from loadtests.load_report import read_run
from loadtests.load_schema import LagSummary, RequestRecord, RunConfig, RunCounts, RunInfo, Slo
from simulator.traces import from_columns, write_generic
from tests.activator.fake_engine import serve_app
from thaw.cli.main import main as thaw

# -- a virtual clock -------------------------------------------------------------------


class FakeClock:
    """Virtual time: ``sleep`` waits until :meth:`drive` moves time to its end, which it
    does only once everything runnable at the current instant has run."""

    def __init__(self) -> None:
        self.t = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = 0

    def now(self) -> float:
        return self.t

    async def sleep(self, s: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.t + max(0.0, s), self._seq, fut))
        self._seq += 1
        await fut

    def block(self, s: float) -> None:
        """The send-overhead hook: time passes while the loop is blocked."""
        self.t += s

    async def drive(self, coro: Coroutine[Any, Any, Any]) -> Any:
        task = asyncio.ensure_future(coro)
        while not task.done():
            for _ in range(50):  # let everything due at this instant run
                await asyncio.sleep(0)  # not a poll: turns of the loop at one virtual instant
            if task.done():
                break
            while self._sleepers and self._sleepers[0][2].done():
                heapq.heappop(self._sleepers)  # a cancelled sleep
            assert self._sleepers, "nothing is sleeping and the loop is not done: a deadlock"
            when, _, fut = heapq.heappop(self._sleepers)
            self.t = max(self.t, when)
            fut.set_result(None)
        return task.result()


def planned(times: list[float], model: str = "m") -> list[load_run.Planned]:
    return [load_run.Planned(index=i, at_s=t, trace_model=model, model=model, tenant=None, input_tokens=10,
                             max_tokens=4) for i, t in enumerate(times)]


# -- the open loop -----------------------------------------------------------------------


async def test_every_request_is_sent_on_schedule_while_earlier_ones_are_unanswered() -> None:
    clock = FakeClock()
    plan = planned([0.0, 0.5, 1.0, 2.5, 4.0])
    started: list[tuple[int, float, int]] = []  # (index, sent_s, answers finished by then)
    finished: list[int] = []
    all_sent = asyncio.Event()

    async def send(p: load_run.Planned, sent_s: float) -> None:
        started.append((p.index, sent_s, len(finished)))
        if len(started) == len(plan):
            all_sent.set()
        # No answer until every request is out: a closed loop would wait here forever
        # and the grace would cancel everything.
        await all_sent.wait()
        finished.append(p.index)

    result = await clock.drive(load_run.open_loop(plan, send, clock, start=0.0, window_s=4.0, grace_s=10.0))
    assert [(i, s) for i, s, _ in started] == [(p.index, p.at_s) for p in plan]  # lag 0 on a virtual clock
    assert all(done == 0 for _, _, done in started)
    assert sorted(finished) == [0, 1, 2, 3, 4]
    assert result.cancelled == 0
    assert result.end_s == 4.0  # the last send; the answers came at once


async def test_requests_running_after_window_and_grace_are_cancelled() -> None:
    clock = FakeClock()
    cancelled: list[int] = []

    async def send(p: load_run.Planned, sent_s: float) -> None:
        if p.index == 2:
            try:
                await asyncio.Event().wait()  # never answered
            except asyncio.CancelledError:
                cancelled.append(p.index)
                raise

    result = await clock.drive(load_run.open_loop(planned([0.0, 1.0, 2.0]), send, clock, start=0.0, window_s=3.0,
                                                  grace_s=10.0))
    assert cancelled == [2] and result.cancelled == 1
    assert result.end_s == 13.0  # window 3 + grace 10


async def test_send_overhead_makes_the_generator_fall_behind() -> None:
    # Ten requests 10 ms apart; each send blocks 100 ms. Request k goes out at k x 100 ms,
    # so its lag is k x (100 - 10) = 90k ms.
    clock = FakeClock()

    async def send(p: load_run.Planned, sent_s: float) -> None:
        return None

    plan = planned([k * 0.01 for k in range(10)])
    result = await clock.drive(load_run.open_loop(plan, send, clock, start=0.0, window_s=0.09, grace_s=1.0,
                                                  send_overhead_s=0.1, block=clock.block))
    lags = [result.sent_s[p.index] - p.at_s for p in plan]
    assert lags == pytest.approx([0.09 * k for k in range(10)])
    lag = load_stats.lag_summary(lags)
    assert lag.max_ms == pytest.approx(810.0) and lag.over_threshold == 9  # 90 ms and up
    assert load_stats.fell_behind(lag)

    clock = FakeClock()
    on_time = await clock.drive(load_run.open_loop(plan, send, clock, start=0.0, window_s=0.09, grace_s=1.0))
    assert not load_stats.fell_behind(load_stats.lag_summary([on_time.sent_s[p.index] - p.at_s for p in plan]))


@pytest.mark.parametrize(
    ("lags_ms", "over", "p99", "behind"),
    [
        ([], 0, None, False),
        ([1.0] * 99 + [400.0], 1, 1.0, False),  # one late send in 100: p99 is the 99th value, 1 ms
        ([1.0] * 98 + [400.0] * 2, 2, 400.0, True),  # two in 100: the 99th value is late
        ([60.0, 10.0], 1, 60.0, True),  # few sends: the p99 is the max
        ([50.0], 0, 50.0, False),  # at the threshold is not past it
    ],
)
def test_lag_flag_is_the_p99_past_the_threshold(lags_ms: list[float], over: int, p99: float | None,
                                                behind: bool) -> None:
    lag = load_stats.lag_summary([x / 1000 for x in lags_ms], threshold_ms=50.0)
    assert lag.over_threshold == over
    assert lag.p99_ms == (pytest.approx(p99) if p99 is not None else None)
    assert load_stats.fell_behind(lag) is behind


# -- the plan ------------------------------------------------------------------------------


def trace_two_models() -> Any:
    # a at 0, 2, 4, 6 s; b at 1, 3, 5 s; outputs 10..70 tokens, inputs 100..700.
    t = [0, 1, 2, 3, 4, 5, 6]
    return from_columns(t, [0, 1, 0, 1, 0, 1, 0], [0] * 7, [100 * (i + 1) for i in range(7)],
                        [10 * (i + 1) for i in range(7)], ["a", "b"], ["t1"], "test")


def test_plan_applies_speedup_window_count_map_and_caps() -> None:
    plan = load_run.plan_requests(trace_two_models(), speedup=2.0, max_requests=None, duration_s=2.0,
                                  model_map={"a": "served-a"}, max_tokens_cap=25, max_input_tokens=250)
    # At 2x, times are 0, 0.5, 1, 1.5, 2, ...: the window [0, 2) keeps the first four.
    assert [p.at_s for p in plan] == [0.0, 0.5, 1.0, 1.5]
    assert [p.model for p in plan] == ["served-a", "b", "served-a", "b"]
    assert [p.trace_model for p in plan] == ["a", "b", "a", "b"]
    assert [p.max_tokens for p in plan] == [10, 20, 25, 25]
    assert [p.input_tokens for p in plan] == [100, 200, 250, 250]
    assert {p.tenant for p in plan} == {"t1"}
    first3 = load_run.plan_requests(trace_two_models(), speedup=1.0, max_requests=3, duration_s=None,
                                    model_map={}, max_tokens_cap=None)
    assert [p.index for p in first3] == [0, 1, 2] and first3[2].max_tokens == 30


@pytest.mark.parametrize("bad", ["a", "=b", "a=", ""])
def test_model_map_needs_trace_and_served_names(bad: str) -> None:
    with pytest.raises(ValueError, match="TRACE=SERVED"):
        load_run.parse_model_map([bad])


def test_prompts_are_deterministic_distinct_and_about_the_asked_size() -> None:
    synth = load_run.PromptSynth(seed=7, max_words=500)
    a, b = synth.prompt(0, 300), synth.prompt(1, 300)
    assert a == load_run.PromptSynth(seed=7, max_words=500).prompt(0, 300)
    assert a != b and a.startswith("Request 0: ")
    # 300 tokens less the template's overhead, one word a token, plus "Request 0:".
    assert len(a.split()) == 300 - load_run.PROMPT_OVERHEAD_TOKENS + 2
    assert synth.prompt(2, 1).split()[:2] == ["Request", "2:"]


# -- the report's arithmetic ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("xs", "q", "want"),
    [
        (list(range(1, 101)), 50, 50),  # ceil(0.5 x 100) = 50th value
        (list(range(1, 101)), 90, 90),
        (list(range(1, 101)), 99, 99),
        ([3.0, 1.0, 2.0], 50, 2.0),  # ceil(1.5) = 2nd of 1, 2, 3
        ([3.0, 1.0, 2.0], 99, 3.0),  # ceil(2.97) = 3rd
        ([5.0], 1, 5.0),
        ([], 50, None),
    ],
)
def test_percentile_is_nearest_rank(xs: list[float], q: float, want: float | None) -> None:
    assert load_stats.percentile(xs, q) == want


def rec(index: int = 0, *, model: str = "a", tier: str | None = "hot", ttft: float | None = 0.5,
        itl: list[float] | None = None, tokens: int = 5, status: int | None = 200, error: str | None = None,
        finished: bool = True, cancelled: bool = False, sent: float = 0.0, end: float | None = None,
        replica: str | None = None) -> RequestRecord:
    return RequestRecord(index=index, trace_model=model, model=model, input_tokens=10, max_tokens=tokens,
                         scheduled_s=sent, sent_s=sent, lag_s=0.0, end_s=end, tier=tier, ttft_s=ttft,
                         inter_token_s=[0.05] * (tokens - 1) if itl is None else itl, completion_tokens=tokens,
                         status=status, error_type=error, finished=finished, cancelled=cancelled, replica=replica)


SLO = Slo(ttft_s=1.0, tpot_ms=100.0)


@pytest.mark.parametrize(
    ("r", "tpot", "good"),
    [
        (rec(ttft=0.5, itl=[0.05] * 4, tokens=5), 50.0, True),  # 4 x 50 ms / (5 - 1) = 50 ms
        (rec(ttft=1.5), 50.0, False),  # TTFT past 1 s
        (rec(itl=[0.1, 0.3], tokens=3), 200.0, False),  # 400 ms / 2 = 200 ms per token
        (rec(itl=[0.1, 0.1], tokens=5), 50.0, True),  # chunks of two tokens: 200 ms / 4
        (rec(itl=[], tokens=1), None, True),  # one token: no TPOT, only the TTFT counts
        (rec(status=503, error="ServiceUnavailableError", finished=False, ttft=None, tokens=0), None, False),
        (rec(cancelled=True, finished=False), 50.0, False),
    ],
)
def test_tpot_and_slo(r: RequestRecord, tpot: float | None, good: bool) -> None:
    assert load_stats.tpot_ms(r) == (pytest.approx(tpot) if tpot is not None else None)
    assert load_stats.within_slo(r, SLO) is good


def run_info(duration_s: float = 10.0, behind: bool = False) -> RunInfo:
    cfg = RunConfig(trace="t.csv", format=None, base_url="http://x/v1", speedup=1, max_requests=None,
                    duration_s=None, model_map={}, seed=0, max_tokens_cap=64, max_input_tokens=None,
                    timeout_s=300, grace_s=60, send_overhead_ms=0, controller_url=None, poll_interval_s=1)
    return RunInfo(config=cfg, started_at=0, window_s=duration_s, duration_s=duration_s,
                   counts=RunCounts(trace_requests=9, scheduled=8, sent=0, completed=0, errors=0, cancelled=0),
                   lag=LagSummary(threshold_ms=50, over_threshold=0, max_ms=1, p50_ms=1, p99_ms=1),
                   generator_fell_behind=behind, replicas_source="x-thaw-replica")


def test_report_counts_groups_errors_and_goodput() -> None:
    records = [
        rec(0, model="a", tier="hot", ttft=0.2),
        rec(1, model="a", tier="hot", ttft=0.4),
        rec(2, model="b", tier="disk", ttft=3.0),  # completed, misses the TTFT SLO
        rec(3, model="b", tier="hot", ttft=0.3, itl=[0.5] * 4),  # 500 ms per token: misses TPOT
        rec(4, model="b", tier="hot", status=503, error="InternalServerError", finished=False, ttft=None, tokens=0),
        rec(5, model="a", tier=None, status=None, error="APITimeoutError", finished=False, ttft=None, tokens=0),
        rec(6, model="a", tier="hot", status=200, error="APIError", finished=False, ttft=0.1, tokens=2),
        rec(7, model="b", tier="cold", cancelled=True, finished=False, ttft=None, tokens=0),
    ]
    r = load_stats.build_report(run_info(duration_s=10.0, behind=True), records, SLO, "dir")
    assert r.counts.model_dump() == {"trace_requests": 9, "scheduled": 8, "sent": 8, "completed": 4, "errors": 3,
                                     "cancelled": 1}
    assert r.errors_by_status == {"503": 1, "APIError": 1, "APITimeoutError": 1}
    assert r.overall.good == 2 and r.goodput_rps == pytest.approx(0.2)  # 2 good / 10 s
    assert r.overall.ttft_s.n == 4 and r.overall.ttft_s.p50 == 0.3  # ceil(0.5 x 4) = 2nd of .2 .3 .4 3
    assert r.overall.tpot_ms.p99 == pytest.approx(500.0)
    assert set(r.by_tier) == {"hot", "disk", "cold", "none"}
    hot = r.by_tier["hot"]
    assert (hot.requests, hot.completed, hot.errors, hot.cancelled, hot.good) == (5, 3, 2, 0, 2)
    assert r.by_tier["cold"].cancelled == 1 and r.by_tier["none"].errors == 1
    assert (r.by_model["a"].requests, r.by_model["b"].requests) == (4, 4)
    assert r.by_model["b"].ttft_s.p99 == 3.0
    assert r.generator_fell_behind


def test_goodput_of_a_run_without_duration_is_zero() -> None:
    assert load_stats.goodput_rps([rec()], SLO, 0.0) == 0.0


@pytest.mark.parametrize(
    ("cold", "tier", "want"),
    [("false", None, "hot"), ("true", None, "cold"), ("true", "disk", "disk"), ("false", "asleep", "asleep"),
     (None, None, None)],
)
def test_tier_from_headers(cold: str | None, tier: str | None, want: str | None) -> None:
    assert load_stats.tier_of(cold, tier) == want


def test_replicas_in_use_counts_each_replica_from_first_send_to_last_end() -> None:
    records = [rec(0, sent=0.0, end=2.0, replica="r1"), rec(1, sent=1.0, end=5.0, replica="r2"),
               rec(2, sent=3.0, end=4.0, replica="r1"), rec(3, model="b", sent=1.0, end=1.5, replica="r3"),
               rec(4, sent=9.0, end=9.5, replica=None)]
    # r1 spans 0..4, r2 1..5: 1 replica from 0, 2 from 1, 1 from 4, none from 5.
    assert load_stats.replicas_in_use(records) == {"a": [(0.0, 1), (1.0, 2), (4.0, 1), (5.0, 0)],
                                                   "b": [(1.0, 1), (1.5, 0)]}


# -- against a fake OpenAI server -------------------------------------------------------------


class FakeOpenAI:
    """A small OpenAI-compatible server that answers as the activator would: model
    ``m-hot`` hot, ``m-cold`` after a cold start (with x-thaw-tier), ``m-old`` cold
    without x-thaw-tier, ``m-missing`` 404, ``m-busy`` 503; ``m-stuck`` sends its headers and no token;
    with ``hold_until`` no answer starts before that many requests have arrived."""

    def __init__(self, hold_until: int = 0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.hold_until = hold_until
        self.arrived = asyncio.Event() if hold_until else None
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.chat)

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        n = len(self.bodies)
        rid = f"req-{n}"
        model = body["model"]
        if model == "m-missing":
            return JSONResponse({"error": {"message": "no such model", "type": "NotFoundError", "code": 404}},
                                status_code=404, headers={"x-request-id": rid})
        if model == "m-busy":
            return JSONResponse({"error": {"message": "queue full", "type": "ServiceUnavailable", "code": 503}},
                                status_code=503, headers={"x-request-id": rid, "x-thaw-cold-start": "true"})
        if self.arrived is not None:
            if n >= self.hold_until:
                self.arrived.set()
            await self.arrived.wait()
        headers = {"x-request-id": rid, "x-thaw-cold-start": "false", "x-thaw-replica": f"{model}-r1"}
        if model in ("m-cold", "m-old"):
            headers.update({"x-thaw-cold-start": "true", "x-thaw-queue-ms": "1234"})
        if model == "m-cold":
            headers["x-thaw-tier"] = "disk"
        tokens = int(body["max_tokens"])

        async def gen() -> AsyncIterator[bytes]:
            def frame(obj: dict[str, Any]) -> bytes:
                return f"data: {json.dumps({'id': rid, 'object': 'chat.completion.chunk', 'created': 0, 'model': model, **obj})}\n\n".encode()

            yield frame({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            if model == "m-stuck":
                # Stream nothing more (the response ends when the client hangs up).
                await asyncio.sleep(3600)
            for i in range(tokens):
                yield frame({"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]})
            yield frame({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                words = len(body["messages"][0]["content"].split())
                yield frame({"choices": [], "usage": {"prompt_tokens": words, "completion_tokens": tokens,
                                                      "total_tokens": words + tokens}})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream", headers=headers)


def write_trace(path: Path, rows: list[tuple[float, str, int, int]]) -> Path:
    t, models, inp, out = zip(*rows, strict=True)
    names = sorted(set(models))
    write_generic(from_columns(list(t), [names.index(m) for m in models], [0] * len(rows), list(inp), list(out),
                               names, ["t"], "test"), path)
    return path


def test_run_records_headers_tokens_and_errors_then_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeOpenAI()
    trace = write_trace(tmp_path / "trace.csv", [
        (0.0, "hot", 120, 3), (0.1, "cold", 60, 100), (0.2, "m-old", 30, 2), (0.3, "m-missing", 30, 2),
        (0.4, "m-busy", 30, 2), (0.5, "hot", 30, 0), (9.0, "hot", 30, 2)])
    out = tmp_path / "run"
    with serve_app(fake.app) as url:
        rc = thaw(["load", "run", "--trace", str(trace), "--base-url", f"{url}/v1", "--api-key", "sk-secret-1",
                   "--out-dir", str(out), "--speedup", "2", "--duration-s", "1", "--max-tokens-cap", "5",
                   "--model-map", "hot=m-hot", "--model-map", "cold=m-cold", "--grace-s", "30"])
    assert rc == 0
    info, records, samples = read_run(out)
    assert samples == [] and not (out / "replicas.jsonl").exists()
    # At 2x the window of 1 s holds the six requests due before t = 2 s in the trace.
    assert [r.index for r in records] == [0, 1, 2, 3, 4, 5]
    assert info.counts.model_dump() == {"trace_requests": 7, "scheduled": 6, "sent": 6, "completed": 4,
                                        "errors": 2, "cancelled": 0}
    assert info.config.model_map == {"hot": "m-hot", "cold": "m-cold"} and "sk-secret" not in (out / "run.json").read_text()
    by = {r.index: r for r in records}
    hot, cold, old, missing, busy, zero = (by[i] for i in range(6))
    assert [r.scheduled_s for r in records] == [0.0, 0.05, 0.1, 0.15, 0.2, 0.25]
    assert all(r.sent_s >= r.scheduled_s and r.lag_s == pytest.approx(r.sent_s - r.scheduled_s) for r in records)

    assert (hot.trace_model, hot.model, hot.tenant) == ("hot", "m-hot", "t")
    assert (hot.status, hot.finished, hot.error_type, hot.cancelled) == (200, True, None, False)
    assert (hot.tier, hot.tier_from_header, hot.cold_start, hot.queue_ms) == ("hot", False, False, None)
    assert hot.replica == "m-hot-r1" and hot.request_id is not None and hot.request_id.startswith("req-")
    assert hot.completion_tokens == 3 and len(hot.inter_token_s) == 2 and hot.ttft_s is not None
    assert hot.end_s is not None and hot.end_s >= hot.sent_s + hot.ttft_s
    # The prompt was ~120 - overhead words; the server's count is what is recorded.
    assert hot.prompt_tokens == 120 - load_run.PROMPT_OVERHEAD_TOKENS + 2
    assert (cold.tier, cold.tier_from_header, cold.cold_start, cold.queue_ms) == ("disk", True, True, 1234.0)
    assert cold.max_tokens == 5 and cold.completion_tokens == 5  # 100 capped at 5
    assert (old.tier, old.tier_from_header) == ("cold", False)
    assert (missing.status, missing.error_type, missing.finished) == (404, "NotFoundError", False)
    assert missing.request_id is not None and missing.tier is None  # no x-thaw-cold-start on that answer
    assert (busy.status, busy.error_type, busy.tier) == (503, "InternalServerError", "cold")
    assert zero.max_tokens == 1 and zero.completion_tokens == 1 and zero.inter_token_s == []
    sent = {b["model"]: b for b in fake.bodies}
    assert sent["m-hot"]["stream"] is True and sent["m-hot"]["stream_options"] == {"include_usage": True}
    # Whether the generator kept to its schedule depends on the machine's load; what the
    # run says must be what its records show.
    lags = load_stats.lag_summary([r.lag_s for r in records])
    assert info.generator_fell_behind == load_stats.fell_behind(lags) and info.replicas_source == "x-thaw-replica"

    capsys.readouterr()
    assert thaw(["load", "report", str(out), "--ttft-slo-s", "30", "--tpot-slo-ms", "10000"]) == 0
    table = capsys.readouterr().out
    verdict = "YES" if info.generator_fell_behind else "no"
    assert "errors by status: 404: 1, 503: 1" in table and f"generator fell behind: {verdict}" in table
    report = json.loads((out / "report.json").read_text())
    assert report["counts"]["completed"] == 4 and report["errors_by_status"] == {"404": 1, "503": 1}
    assert report["overall"]["good"] == 4 and report["goodput_rps"] == pytest.approx(4 / info.duration_s)
    assert set(report["by_tier"]) == {"hot", "disk", "cold", "none"}
    assert set(report["by_model"]) == {"m-hot", "m-cold", "m-old", "m-missing", "m-busy"}
    for png in ("ttft_cdf.png", "timeline.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_open_loop_against_a_server_that_answers_only_when_all_have_arrived(tmp_path: Path) -> None:
    # Five requests 50 ms apart; the server holds every answer until the fifth arrives.
    # A generator that waited for answers would send one and be cancelled at the grace.
    fake = FakeOpenAI(hold_until=5)
    trace = write_trace(tmp_path / "trace.csv", [(0.05 * i, "m", 20, 2) for i in range(5)])
    out = tmp_path / "run"
    with serve_app(fake.app) as url:
        assert thaw(["load", "run", "--trace", str(trace), "--base-url", f"{url}/v1", "--api-key", "k",
                     "--out-dir", str(out), "--grace-s", "30"]) == 0
    info, records, _ = read_run(out)
    assert info.counts.completed == 5 and info.counts.cancelled == 0
    assert len(fake.bodies) == 5


def test_a_request_still_running_after_the_grace_is_cancelled_and_recorded(tmp_path: Path) -> None:
    fake = FakeOpenAI()
    trace = write_trace(tmp_path / "trace.csv", [(0.0, "m-hot", 20, 2), (0.1, "m-stuck", 20, 2)])
    out = tmp_path / "run"
    with serve_app(fake.app) as url:
        assert thaw(["load", "run", "--trace", str(trace), "--base-url", f"{url}/v1", "--api-key", "k",
                     "--out-dir", str(out), "--grace-s", "0.5"]) == 0
    info, records, _ = read_run(out)
    stuck = next(r for r in records if r.model == "m-stuck")
    assert stuck.cancelled and not stuck.finished and stuck.end_s is not None
    assert info.counts.cancelled == 1 and info.counts.completed == 1 and info.counts.errors == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["--model-map", "nothing"],
        ["--speedup", "0"],
        ["--max-requests", "0"],
        ["--trace", "/nonexistent/trace.csv"],
    ],
)
def test_bad_options_exit_2(tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "trace.csv", [(0.0, "m", 20, 2)])
    base = ["load", "run", "--trace", str(trace), "--base-url", "http://127.0.0.1:9/v1", "--api-key", "k",
            "--out-dir", str(tmp_path / "out")]
    assert thaw(base + argv) == 2
    assert "thaw load run:" in capsys.readouterr().err


def test_report_of_a_directory_without_a_run_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert thaw(["load", "report", str(tmp_path)]) == 2
    assert "run.json" in capsys.readouterr().err
