"""Where a Python proxy's CPU goes: the HTTP client and the ASGI server, each alone.

    python -m loadtests.http_overhead [--requests 3000] [--out FILE.json]

Supports the analysis of `thaw bench activator` (docs/BENCHMARKS.md). On loopback,
with the measured side pinned to one core and the other side on another:

- ``client_httpx`` / ``client_aiohttp`` / ``client_thaw``: CPU per streamed request of
  an ``httpx.AsyncClient`` (with the limits the activator once used), an
  ``aiohttp.ClientSession`` and the activator's own client (``activator/upstream.py``),
  as the only work of a process, against
  :mod:`loadtests.fast_upstream`;
- ``server_fastapi`` / ``server_raw_asgi``: CPU per request of a uvicorn process serving
  a 2-chunk SSE stream from a FastAPI route with ``StreamingResponse``, and from a bare
  ASGI callable, driven by an aiohttp client.

Closed loop, 4 requests in flight. CPU is the measured process's user + system time
over the requests (``resource``/``psutil``), so a busy neighbour changes the wall time
but hardly the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from loadtests.procs import pinned, serving
from thaw.embedded_store import free_port

BODY = json.dumps({"model": "bench", "stream": True, "max_tokens": 1,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
CONCURRENCY = 4


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _closed_loop(one: Any, n: int) -> None:
    for _ in range(100):  # warm connections and caches
        await one()
    for _ in range(0, n, CONCURRENCY):
        await asyncio.gather(*(one() for _ in range(CONCURRENCY)))


async def client_httpx(url: str, n: int) -> float:
    import httpx

    # The activator's upstream client until it was measured here: the same limits.
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=2.0),
                                 limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100)) as c:
        async def one() -> None:
            req = c.build_request("POST", url, content=BODY, headers={"content-type": "application/json"})
            r = await c.send(req, stream=True)
            async for _ in r.aiter_raw():
                pass
            await r.aclose()

        await _closed_loop(one, 100)
        t = _cpu_self()
        await _closed_loop(one, n)
        return (_cpu_self() - t) / n


async def client_thaw(url: str, n: int) -> float:
    from activator.service import upstream_client

    pool = upstream_client()  # the activator's own (activator/upstream.py)

    async def one() -> None:
        r = await pool.post(url, BODY, {"content-type": "application/json"})
        while await r.readany():
            pass
        r.release()

    try:
        await _closed_loop(one, 100)
        t = _cpu_self()
        await _closed_loop(one, n)
        return (_cpu_self() - t) / n
    finally:
        await pool.close()


async def client_aiohttp(url: str, n: int) -> float:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1000), auto_decompress=False) as s:
        async def one() -> None:
            async with s.post(url, data=BODY, headers={"content-type": "application/json"}) as r:
                async for _ in r.content.iter_any():
                    pass

        await _closed_loop(one, 100)
        t = _cpu_self()
        await _closed_loop(one, n)
        return (_cpu_self() - t) / n


async def drive(url: str, pid: int, n: int) -> float:
    """CPU per request of process ``pid`` while an aiohttp client sends ``n`` requests."""
    import aiohttp
    import psutil

    proc = psutil.Process(pid)
    async with aiohttp.ClientSession() as s:
        async def one() -> None:
            async with s.post(url, data=BODY, headers={"content-type": "application/json"}) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url}: {r.status}")

        await _closed_loop(one, 100)
        c0 = sum(proc.cpu_times()[:2])
        await _closed_loop(one, n)
        return (sum(proc.cpu_times()[:2]) - c0) / n


def _serve_asgi(kind: str, port: int) -> None:
    """The server side of ``server_fastapi`` / ``server_raw_asgi`` (``--serve``)."""
    import uvicorn

    chunks = [b'data: {"choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n', b"data: [DONE]\n\n"]
    app: Any
    if kind == "fastapi":
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> StreamingResponse:
            await request.json()

            async def gen() -> Any:
                for c in chunks:
                    yield c

            return StreamingResponse(gen(), media_type="text/event-stream")
    else:
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                while True:
                    m = await receive()
                    done = m["type"] == "lifespan.shutdown"
                    await send({"type": m["type"] + ".complete"})
                    if done:
                        return
            if scope["method"] != "POST":  # the readiness probe
                await send({"type": "http.response.start", "status": 404, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
            body = b""
            while True:
                m = await receive()
                body += m.get("body", b"")
                if not m.get("more_body"):
                    break
            json.loads(body)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for c in chunks:
                await send({"type": "http.response.body", "body": c, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    uvicorn.run(app, host="127.0.0.1", port=port, log_config=None, access_log=False)


def run(n: int, tokens: int = 1) -> dict[str, float]:
    cpus = sorted(os.sched_getaffinity(0))
    mine, other = ({cpus[0]}, {cpus[1]}) if len(cpus) > 1 else (None, None)
    before = os.sched_getaffinity(0)
    out: dict[str, float] = {}
    py = sys.executable
    try:
        with tempfile.TemporaryDirectory(prefix="thaw-http-overhead-") as tmp:
            if mine is not None:
                os.sched_setaffinity(0, mine)
            port = free_port()
            with serving(pinned([py, "-m", "loadtests.fast_upstream", "--port", str(port), "--tokens", str(tokens)],
                                other),
                         Path(tmp) / "upstream.log", f"http://127.0.0.1:{port}/health"):
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                out["client_httpx_ms"] = asyncio.run(client_httpx(url, n)) * 1000
                out["client_aiohttp_ms"] = asyncio.run(client_aiohttp(url, n)) * 1000
                out["client_thaw_ms"] = asyncio.run(client_thaw(url, n)) * 1000
            if other is not None:
                os.sched_setaffinity(0, other)
            for kind in ("fastapi", "raw_asgi"):
                port = free_port()
                cmd = pinned([py, "-m", "loadtests.http_overhead", "--serve", kind, "--port", str(port)], mine)
                with serving(cmd, Path(tmp) / f"{kind}.log", f"http://127.0.0.1:{port}/") as srv:
                    out[f"server_{kind}_ms"] = asyncio.run(
                        drive(f"http://127.0.0.1:{port}/v1/chat/completions", srv.pid, n)) * 1000
    finally:
        os.sched_setaffinity(0, before)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--tokens", type=int, default=1, help="tokens the upstream streams per request (clients)")
    p.add_argument("--out", default=None, metavar="FILE")
    p.add_argument("--serve", choices=("fastapi", "raw_asgi"), help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        _serve_asgi("raw" if args.serve == "raw_asgi" else "fastapi", args.port)
        return 0
    figures = run(args.requests, args.tokens)
    report = {"benchmark": "http_overhead", "requests": args.requests, "tokens": args.tokens,
              "concurrency": CONCURRENCY,
              "cpu_ms_per_request": figures,
              "ratios": {"httpx_over_aiohttp": figures["client_httpx_ms"] / figures["client_aiohttp_ms"],
                         "aiohttp_over_thaw": figures["client_aiohttp_ms"] / figures["client_thaw_ms"],
                         "fastapi_over_raw_asgi": figures["server_fastapi_ms"] / figures["server_raw_asgi_ms"]}}
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
