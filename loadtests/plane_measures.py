"""What `thaw bench control-plane` reads and counts (loadtests/bench_control_plane.py):
quantiles and growth, the controller's loop from its metrics, how long a version takes
to reach every activator, and steady traffic through the activators."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadtests.bench_control_plane import Plane

# The bench tenant's key (every model allowed).
API_KEY = "thaw-bench-key"


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))], 4)


def exponent(a: float | None, b: float | None, size_a: int, size_b: int) -> float | None:
    """How ``a`` at ``size_a`` grows to ``b`` at ``size_b``: 1 is linear."""
    if not a or not b or size_a == size_b:
        return None
    return round(math.log(b / a) / math.log(size_b / size_a), 2)


def histogram(metrics_text: str, name: str) -> dict[float, float]:
    """A Prometheus histogram's cumulative bucket counts (``le`` -> count)."""
    out = {}
    for line in metrics_text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[math.inf if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def counter(metrics_text: str, name: str) -> float:
    """A Prometheus counter's (or a histogram's ``_sum``/``_count``) value; 0 when absent."""
    for line in metrics_text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def loop_figures(before: str, after: str) -> dict[str, Any]:
    """The controller's loop between two scrapes of its metrics: its turns (whole, and
    the policy's part), the models each judged, database statements per turn."""
    out: dict[str, Any] = {}
    for key, name in (("step", "thaw_pool_step_seconds"), ("policy", "thaw_pool_policy_seconds"),
                      ("judged", "thaw_pool_models_judged")):
        b, a = histogram(before, name), histogram(after, name)
        n = counter(after, f"{name}_count") - counter(before, f"{name}_count")
        unit = "" if key == "judged" else "_s"
        out[f"{key}_p50{unit}"] = bucket_quantile(b, a, 0.5)
        out[f"{key}_p99{unit}"] = bucket_quantile(b, a, 0.99)
        out[f"{key}_mean{unit}"] = round((counter(after, f"{name}_sum") - counter(before, f"{name}_sum")) / n, 4) \
            if n else None
        if key == "step":
            out["turns"] = n
    statements = counter(after, "thaw_pool_db_statements_total") - counter(before, "thaw_pool_db_statements_total")
    out["db_statements_per_turn"] = round(statements / out["turns"], 2) if out["turns"] else None
    return out


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The ``q`` quantile of what a histogram counted between two reads, as the upper
    bound of its bucket (Prometheus' histogram_quantile without the interpolation)."""
    delta = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = delta[-1][1] if delta else 0.0
    if total <= 0:
        return None
    for le, n in delta:
        if n >= q * total:
            return le
    return None


class Traffic:
    """``rps`` streamed requests a second (in a thread of its own), each to one of the
    models ready when it started, through the activators in turn, while in use: how many
    were answered, and their times to first token."""

    def __init__(self, plane: Plane, rps: float) -> None:
        self.plane, self.rps = plane, rps
        self.models = list(plane.ready_models()) if rps > 0 else []
        self.rows: list[tuple[int | None, float | None, str | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> Traffic:
        if self.models:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    async def _one(self, client: Any, k: int) -> None:
        import httpx

        model = self.models[(k * 7919) % len(self.models)]
        url = self.plane.activator_urls[k % len(self.plane.activator_urls)]
        body = {"model": model, "stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        t0, status, ttft, error = time.perf_counter(), None, None, None
        try:
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {API_KEY}"}) as r:
                status = r.status_code
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and ttft is None:
                        ttft = time.perf_counter() - t0
        except httpx.HTTPError as exc:
            error = str(exc) or type(exc).__name__
        self.rows.append((status, ttft, error))

    async def _run(self) -> None:
        import httpx

        tasks = []
        async with httpx.AsyncClient(timeout=120) as client:
            start, k = time.monotonic(), 0
            while not self._stop.is_set():
                tasks.append(asyncio.create_task(self._one(client, k)))
                k += 1
                await asyncio.sleep(max(start + k / self.rps - time.monotonic(), 0.0))
            await asyncio.gather(*tasks)

    def report(self) -> dict[str, Any]:
        ok = [ttft for status, ttft, _ in self.rows if status == 200 and ttft is not None]
        failed = [f"{status} {error or ''}".strip() for status, ttft, error in self.rows
                  if status != 200 or ttft is None]
        return {"rps": self.rps, "models": len(self.models), "sent": len(self.rows), "answered": len(ok),
                "failed": failed[:10], "ttft_p50_s": percentile(ok, 50), "ttft_p99_s": percentile(ok, 99)}


class Versions:
    """Polls the controller's and each activator's ``/healthz`` every 25 ms (in a thread)
    while in use: when each version of ``key`` (``routes_version``, ``catalog_version``)
    was first seen at the controller and at every activator."""

    def __init__(self, plane: Plane, key: str = "routes_version") -> None:
        self.plane, self.key = plane, key
        self.first: dict[str, dict[int, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> Versions:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        import httpx

        urls = {"controller": self.plane.controller_url,
                **{f"activator-{i}": u for i, u in enumerate(self.plane.activator_urls)}}
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(0.025):
                for name, url in urls.items():
                    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                        v = int(client.get(f"{url}/healthz").json()[self.key])
                        self.first.setdefault(name, {}).setdefault(v, time.time())

    def report(self) -> dict[str, Any]:
        at_controller = self.first.get("controller", {})
        lags = []
        for v, t in at_controller.items():
            seen = []
            for name, versions in self.first.items():
                if name == "controller":
                    continue
                # An activator that skipped v (a newer table came first) has it at its next.
                later = [tt for vv, tt in versions.items() if vv >= v]
                if later:
                    seen.append(min(later))
            if len(seen) == len(self.plane.activator_urls):
                lags.append(max(max(seen) - t, 0.0))
        return {"versions": len(at_controller), "p50_s": percentile(lags, 50), "p99_s": percentile(lags, 99),
                "poll_s": 0.025}
