"""Talking to the engine's own HTTP server (vLLM's OpenAI-compatible API) on loopback."""

from __future__ import annotations

from typing import Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

# vLLM gauges whose sum is the engine's in-flight count (all label sets).
IN_FLIGHT_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")


class EngineClient(Protocol):
    async def healthy(self) -> bool: ...
    async def in_flight(self) -> int | None: ...
    async def aclose(self) -> None: ...


class HttpEngineClient:
    """``GET /health`` and ``GET /metrics`` of one engine; errors read as "not yet"/"unknown"."""

    def __init__(self, base_url: str, timeout_s: float = 2.0, health_timeout_s: float = 1.0) -> None:
        # trust_env=False: a proxy from the environment must never see loopback traffic.
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout_s, trust_env=False)
        # vLLM binds its port before the engine is built: a request made then waits in
        # the backlog; a short timeout keeps the readiness poll going.
        self._health_timeout_s = health_timeout_s

    async def healthy(self) -> bool:
        try:
            r = await self._http.get("/health", timeout=self._health_timeout_s)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    async def in_flight(self) -> int | None:
        try:
            r = await self._http.get("/metrics")
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        return parse_in_flight(r.text)

    async def aclose(self) -> None:
        await self._http.aclose()


def parse_in_flight(text: str) -> int | None:
    """Running + waiting requests from vLLM's Prometheus text, summed over label sets;
    None when neither gauge is there."""
    total = 0.0
    found = False
    for family in text_string_to_metric_families(text):
        if family.name not in IN_FLIGHT_METRICS:
            continue
        for sample in family.samples:
            if sample.name == family.name:
                total += sample.value
                found = True
    return round(total) if found else None
