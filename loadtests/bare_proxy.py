"""The least a Python proxy does, as `thaw bench activator`'s floor (``bare_proxy``).

    python -m loadtests.bare_proxy --port PORT --upstream http://127.0.0.1:UPORT

The same server as `thaw activator` (:func:`thaw.serve.run_server`: uvicorn, uvloop,
httptools) and the same client to the replica (:class:`activator.upstream.UpstreamPool`),
and nothing else: each POST's body goes to the one upstream, and the answer comes back
as it arrives, unread (its last read together with the end of the response, as the
activator sends it). No key, no limits, no prompt bound, no routing, no usage tap, no
ledger, no metrics. Measured beside the activator and vllm-router, it splits the gap
between them into what a Python proxy costs and what the activator's own work costs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from activator.upstream import UpstreamPool

Message = dict[str, Any]


def proxy_app(upstream: str) -> Any:
    """An ASGI app forwarding every POST to ``upstream`` (its path kept); GET answers 200."""
    pool = UpstreamPool()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await pool.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["method"] != "POST":  # the benchmark's readiness check
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        answer = await pool.post(upstream + scope["path"], body, {"content-type": "application/json"})
        kind = answer.headers.get("content-type", "application/octet-stream").encode("latin-1")
        await send({"type": "http.response.start", "status": answer.status, "headers": [(b"content-type", kind)]})
        try:
            while chunk := await answer.readany():
                last = answer.at_eof()
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                if last:
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            answer.release()

    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="the replica's base URL")
    args = p.parse_args(argv)
    from thaw.serve import run_server

    return run_server(proxy_app(args.upstream.rstrip("/")), "127.0.0.1", args.port, graceful_s=5)


if __name__ == "__main__":
    sys.exit(main())
