"""A real OTLP/HTTP trace receiver on loopback, as a collector's `otlp` receiver takes
traces: `POST /v1/traces` with an `application/x-protobuf` ExportTraceServiceRequest
(opentelemetry-proto's own message), answered with an ExportTraceServiceResponse. It keeps
every span it decoded, with its resource and scope, and the headers each request carried."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class Received:
    spans: list[Any] = field(default_factory=list)  # opentelemetry.proto.trace.v1.Span
    resources: list[dict[str, Any]] = field(default_factory=list)
    scopes: list[str] = field(default_factory=list)
    posts: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)
    fail_next: int = 0  # answer this many posts with 503 (a collector that is overloaded)


def value_of(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def attrs(span: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in span.attributes}


class OtlpReceiver:
    def __init__(self) -> None:
        self.received = Received()
        self.lock = threading.Lock()
        received, lock = self.received, self.lock

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_error(404 if self.path != "/v1/traces" else 415)
                    return
                with lock:
                    if received.fail_next:
                        received.fail_next -= 1
                        self.send_error(503)
                        return
                    message = ExportTraceServiceRequest()
                    message.ParseFromString(body)
                    received.posts += 1
                    received.headers.append({k.lower(): v for k, v in self.headers.items()})
                    for rs in message.resource_spans:
                        resource = {kv.key: value_of(kv.value) for kv in rs.resource.attributes}
                        for ss in rs.scope_spans:
                            for span in ss.spans:
                                received.spans.append(span)
                                received.resources.append(resource)
                                received.scopes.append(ss.scope.name)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
