"""What a request leaves behind: one usage record and one settlement, its TTFT, and one
cold-start record per cold-started replica."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from activator.context import RequestContext
from activator.ledger import UsageRecord
from activator.metrics import ActivatorMetrics
from activator.recording import RequestRecorder
from activator.routing.replicas import Replica
from thaw.config import parse_config
from thaw.wire import ColdStartRecord

CFG = parse_config({
    "shapes": [{"name": "cpu", "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8, "price_per_hour_usd": 0}],
    "models": [{"name": "demo", "uri": "s3://thaw/demo", "shape": "cpu"}],
})
MODEL = CFG.models[0]


class Fakes:
    """The ledger, limiter and router the recorder writes to, keeping what it is told."""

    def __init__(self) -> None:
        self.records: list[UsageRecord] = []
        self.settled: list[int | None] = []
        self.ttfts: list[float] = []
        self.cold: list[ColdStartRecord] = []

    async def append(self, record: UsageRecord) -> None:
        self.records.append(record)

    async def settle(self, admission: Any, used_tokens: int | None, now: float) -> None:
        self.settled.append(used_tokens)

    def note_ttft(self, model: str, seconds: float) -> None:
        self.ttfts.append(seconds)

    def record_cold_start(self, record: ColdStartRecord) -> None:
        self.cold.append(record)


def recorder(now: list[float]) -> tuple[RequestRecorder, Fakes, ActivatorMetrics]:
    fakes, metrics = Fakes(), ActivatorMetrics(CollectorRegistry())
    return RequestRecorder(fakes, fakes, metrics, fakes, lambda: now[0]), fakes, metrics  # type: ignore[arg-type]


async def test_a_request_is_recorded_and_settled_once_and_not_before_authentication() -> None:
    now = [12.0]
    rec, fakes, _ = recorder(now)
    anonymous = RequestContext("r0", arrival=10.0)
    await rec.record(anonymous)
    assert fakes.records == []
    ctx = RequestContext("r1", arrival=10.0, tenant="acme", model=MODEL, status=200, admission=object())  # type: ignore[arg-type]
    ctx.usage.prompt_tokens, ctx.usage.completion_tokens = 7, 3
    await rec.record(ctx, error_code="upstream_error")
    await rec.record(ctx)
    [r] = fakes.records
    assert (r.request_id, r.tenant, r.model, r.error_code, r.duration_ms) == ("r1", "acme", "demo",
                                                                               "upstream_error", 2000.0)
    assert fakes.settled == [10]  # 7 + 3 tokens


def test_a_hot_first_byte_is_an_autoscaler_sample_and_a_cold_one_is_recorded_once_per_replica() -> None:
    now = [10.5]
    rec, fakes, metrics = recorder(now)
    replica = Replica("w1", "http://r", "demo", "a-1", {"assigned": 10.1, "engine_ready": 10.4}, load_tier="host")
    hot = RequestContext("hot", arrival=10.0)
    rec.first_byte(MODEL, replica, hot)
    assert hot.first_byte_at == 10.5 and fakes.ttfts == [0.5] and fakes.cold == []
    for rid in ("c1", "c2"):  # two cold requests answered by the same replica: one record
        rec.first_byte(MODEL, replica, RequestContext(rid, arrival=10.0, cold=True))
    assert fakes.ttfts == [0.5]  # a cold start is no sample of serving capacity
    [cold] = fakes.cold
    assert (cold.request_id, cold.total_s, cold.weights_from) == ("c1", 0.5, "host")
    # 10.0 queued -> 10.1 assigned -> (no snapshot, weights) -> 10.4 engine ready -> 10.5 first token.
    assert cold.phases_s == {"queued": 0.0, "instance_acquired": 0.1, "snapshot_restored": 0.0,
                             "weights_loaded": 0.0, "engine_ready": 0.3, "first_token": 0.1}
    assert cold.tier == "host"
    assert metrics.registry.get_sample_value("thaw_cold_starts_total", {"model": "demo", "tier": "host"}) == 1


async def test_the_genai_conventions_metrics_are_kept_beside_thaws() -> None:
    # gen_ai.server.time_to_first_token (a cold request's hold included), its request
    # duration (error_type on a failure) and token usage, by operation and the model as
    # the client named it.
    now = [14.0]
    rec, _, metrics = recorder(now)
    replica = Replica("w1", "http://r", "demo", "a-1", {"assigned": 10.1, "engine_ready": 13.9}, load_tier="s3")
    cold = RequestContext("c1", arrival=10.0, cold=True, tenant="acme", model=MODEL, status=200, operation="chat")
    rec.first_byte(MODEL, replica, cold)
    cold.usage.prompt_tokens, cold.usage.completion_tokens = 12, 5
    now[0] = 15.0
    await rec.record(cold)
    failed = RequestContext("f1", arrival=14.5, tenant="acme", model=MODEL, status=502, operation="text_completion")
    await rec.record(failed, error_code="upstream_error")
    get = metrics.registry.get_sample_value
    chat = {"gen_ai_operation_name": "chat", "gen_ai_request_model": MODEL.resolved_served_name}
    assert get("gen_ai_server_time_to_first_token_seconds_sum", chat) == 4.0
    assert get("gen_ai_server_time_to_first_token_seconds_bucket", {**chat, "le": "2.5"}) == 0  # held 4 s
    assert get("gen_ai_server_request_duration_seconds_sum", {**chat, "error_type": ""}) == 5.0
    assert get("gen_ai_client_token_usage_sum", {**chat, "gen_ai_token_type": "input"}) == 12
    assert get("gen_ai_client_token_usage_sum", {**chat, "gen_ai_token_type": "output"}) == 5
    text = {"gen_ai_operation_name": "text_completion", "gen_ai_request_model": MODEL.resolved_served_name}
    assert get("gen_ai_server_request_duration_seconds_count", {**text, "error_type": "upstream_error"}) == 1
    # A request that is no completion (or not authenticated) adds nothing.
    await rec.record(RequestContext("x", arrival=1.0, tenant="acme", model=MODEL, status=200))
    assert get("gen_ai_server_request_duration_seconds_count", {**chat, "error_type": ""}) == 1
