"""What `thaw bench activator` reads from the activators besides its load: the spans of
the traced one (an OTLP/HTTP sink that counts them), and how each counted its prompts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from thaw.embedded_store import free_port


def prompt_counts(base_url: str, data_dir: Path) -> dict[str, float]:
    """How the activator counted its prompts (``thaw_prompt_counts_total``: exactly, or
    decided by the bound from their bytes), with the share counted exactly."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from thaw.auth import bearer, local_token

    text = httpx.get(f"{base_url}/metrics", headers=bearer(local_token(data_dir)), timeout=10).text
    counts = {s.labels["how"]: s.value for fam in text_string_to_metric_families(text)
              if fam.name == "thaw_prompt_counts" for s in fam.samples if s.name == "thaw_prompt_counts_total"}
    total = sum(counts.values())
    return {**counts, "exact_share": counts.get("exact", 0.0) / total if total else 0.0}


class _Sink:
    url = ""
    spans = 0
    exports = 0


@contextmanager
def otlp_sink() -> Iterator[_Sink]:
    """An OTLP/HTTP endpoint that counts the spans it is sent and keeps nothing."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    sink = _Sink()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            req = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers.get("content-length") or 0)))
            sink.exports += 1
            sink.spans += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    sink.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        server.shutdown()
        server.server_close()
