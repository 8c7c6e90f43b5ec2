"""Talking to the engine's own HTTP server (vLLM's OpenAI-compatible API) on loopback."""

from __future__ import annotations

from typing import Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

# vLLM gauges whose sum is the engine's in-flight count (all label sets).
IN_FLIGHT_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")


class EngineError(Exception):
    """The engine refused or failed an operation (sleep, wake-up)."""


class EngineClient(Protocol):
    async def healthy(self) -> bool: ...
    async def in_flight(self) -> int | None: ...
    async def sleep(self, level: int) -> None: ...
    async def wake_up(self) -> None: ...
    async def load_lora(self, name: str, path: str) -> None: ...
    async def unload_lora(self, name: str) -> None: ...
    async def lora_busy(self) -> set[str] | None: ...
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

    async def sleep(self, level: int) -> None:
        """vLLM's ``POST /sleep`` (an engine started with ``--enable-sleep-mode`` and
        ``VLLM_SERVER_DEV_MODE=1``): level 1 moves the weights to host memory and drops
        the KV cache. Returns once the engine sleeps."""
        await self._post("/sleep", {"level": str(level)}, what="sleep")

    async def wake_up(self) -> None:
        """vLLM's ``POST /wake_up``: weights back on the device, KV cache reallocated."""
        body = await self._post("/wake_up", {}, what="wake up")
        if body.get("status") not in (None, "awake"):
            raise EngineError(f"engine did not fully wake up: {body}")

    async def load_lora(self, name: str, path: str) -> None:
        """vLLM's ``POST /v1/load_lora_adapter`` (an engine started with ``--enable-lora``
        and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``): requests may name ``name`` from now on."""
        await self._post_json("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, what="LoRA load")

    async def unload_lora(self, name: str) -> None:
        await self._post_json("/v1/unload_lora_adapter", {"lora_name": name}, what="LoRA unload")

    async def lora_busy(self) -> set[str] | None:
        """The adapters with requests running or waiting (vLLM's ``lora_requests_info``);
        None when unknown."""
        try:
            r = await self._http.get("/metrics")
        except httpx.HTTPError:
            return None
        return parse_lora_busy(r.text) if r.status_code == 200 else None

    async def _post_json(self, path: str, body: dict[str, str], what: str) -> None:
        await self._post(path, {}, what=what, body=body)

    async def _post(self, path: str, params: dict[str, str], what: str,
                    body: dict[str, str] | None = None) -> dict[str, object]:
        try:
            # Moving a large model's weights takes a while: no short timeout here.
            r = await self._http.post(path, params=params, json=body, timeout=600.0)
        except httpx.HTTPError as exc:
            raise EngineError(f"engine {what} failed: {exc}") from None
        if r.status_code != 200:
            raise EngineError(f"engine {what} answered {r.status_code}: {r.text[:500]}")
        try:
            answer = r.json()
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) else {}

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


LORA_INFO = "vllm:lora_requests_info"


def parse_lora_busy(text: str) -> set[str] | None:
    """The adapters named in the running or waiting lists of vLLM's ``lora_requests_info``
    gauge: its newest sample (the value is when it was written); None when absent."""
    newest: tuple[float, dict[str, str]] | None = None
    for family in text_string_to_metric_families(text):
        if family.name != LORA_INFO:
            continue
        for sample in family.samples:
            if newest is None or sample.value > newest[0]:
                newest = (sample.value, sample.labels)
    if newest is None:
        return None
    labels = newest[1]
    names = ",".join((labels.get("running_lora_adapters", ""), labels.get("waiting_lora_adapters", "")))
    return {n for n in names.split(",") if n}
