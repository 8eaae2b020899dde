"""A real OTLP/HTTP trace receiver for tests: `POST /v1/traces` with a protobuf
`ExportTraceServiceRequest`, decoded with the `opentelemetry-proto` package, as a collector does.

Runs an `http.server` on a free port in a thread of the test process; `spans()` returns every
span received so far, flattened to plain dicts (the shape `benchmarks/trace_waterfall.py`
reads from JSON): ids in hex, times in ns since the epoch, attributes and the resource's
`service.name` and `service.instance.id` as plain values.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

MAX_BODY_BYTES = 16 << 20
TRACES_PATH = "/v1/traces"


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, kind) if kind else None


def _attributes(key_values) -> dict:
    return {kv.key: _value(kv.value) for kv in key_values}


def flatten(request: ExportTraceServiceRequest) -> list[dict]:
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    {
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "kind": span.kind,
                        "service": resource.get("service.name"),
                        "instance": resource.get("service.instance.id"),
                        "start_ns": span.start_time_unix_nano,
                        "end_ns": span.end_time_unix_nano,
                        "attributes": _attributes(span.attributes),
                        "events": [
                            {"name": e.name, "time_ns": e.time_unix_nano, "attributes": _attributes(e.attributes)}
                            for e in span.events
                        ],
                        "status_code": span.status.code,  # 2: error
                        "status_message": span.status.message,
                    }
                )
    return spans


class OtlpReceiver:
    def __init__(self) -> None:
        self._spans: list[dict] = []
        self._lock = threading.Lock()
        self.num_posts = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length", "0"))
                if self.path != TRACES_PATH or not 0 < length <= MAX_BODY_BYTES:
                    self.send_error(404 if self.path != TRACES_PATH else 413)
                    return
                request = ExportTraceServiceRequest.FromString(self.rfile.read(length))
                with receiver._lock:
                    receiver._spans.extend(flatten(request))
                    receiver.num_posts += 1
                body = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """The URL to give `--otlp-traces-endpoint` (no path: minipd appends /v1/traces)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def spans(self, trace_id: str | None = None) -> list[dict]:
        with self._lock:
            return [s for s in self._spans if trace_id is None or s["trace_id"] == trace_id]

    def wait_for(self, predicate, timeout_s: float, what: str) -> list[dict]:
        """Poll (bounded) until `predicate(spans)` holds for the spans received; returns them."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if predicate(spans):
                return spans
            assert time.monotonic() < deadline, f"{what} not received within {timeout_s} s: {spans_summary(spans)}"
            time.sleep(0.1)  # a condition poll, bounded by the deadline

    def dump(self, path: str, trace_id: str) -> None:
        with open(path, "w") as out:
            json.dump(self.spans(trace_id), out, indent=1)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> "OtlpReceiver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def spans_summary(spans: list[dict]) -> str:
    return "; ".join(f"{s['service']}/{s['name']}" for s in spans) or "none"
