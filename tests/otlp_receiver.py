"""An OTLP/HTTP trace receiver in the test process: what a collector would get from the
services (protobuf ``ExportTraceServiceRequest`` on ``POST /v1/traces``), decoded into
plain spans."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from thaw.embedded_store import free_port


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: bool


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    return getattr(v, which) if which else None


class Received:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()

    def add(self, body: bytes) -> None:
        req = ExportTraceServiceRequest.FromString(body)
        out = []
        for rs in req.resource_spans:
            service = next((_value(a.value) for a in rs.resource.attributes if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(Span(service, s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                                    s.kind, s.start_time_unix_nano, s.end_time_unix_nano,
                                    {a.key: _value(a.value) for a in s.attributes}, s.status.code == 2))
        with self._lock:
            self.spans.extend(out)

    def all(self) -> list[Span]:
        with self._lock:
            return list(self.spans)

    def trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.all() if s.trace_id == trace_id]

    def roots(self, attr: str, value: Any) -> list[Span]:
        return [s for s in self.all() if s.attributes.get(attr) == value]


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    """Yields the endpoint to configure (``telemetry.otlp_endpoint``) and what arrives."""
    got = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            got.add(body)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", got
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
