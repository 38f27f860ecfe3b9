"""An OTLP/HTTP trace receiver for tests: a real HTTP server in a thread that decodes each
``ExportTraceServiceRequest`` (opentelemetry-proto) and keeps the spans."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    links: tuple[str, ...]  # span ids
    attributes: dict[str, Any]
    start_ns: int
    end_ns: int


class OtlpReceiver:
    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        spans: list[ReceivedSpan] = []
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                req = ExportTraceServiceRequest.FromString(body)
                got = [ReceivedSpan(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                                    tuple(link.span_id.hex() for link in s.links),
                                    {a.key: _value(a.value) for a in s.attributes},
                                    s.start_time_unix_nano, s.end_time_unix_nano)
                       for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
                with lock:
                    spans.extend(got)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(b"")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.spans = spans
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None
