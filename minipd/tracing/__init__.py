"""OpenTelemetry traces of requests across the router and the instances (`--otlp-traces-endpoint`).

- `traceparent.py`: the W3C `traceparent` header, parsed and validated (no SDK needed);
- `exporter.py`: sets up the OpenTelemetry SDK for one process (a `BatchSpanProcessor` over
  OTLP/HTTP, flushed at exit); nothing of the SDK is imported while tracing is off;
- `spans.py`: the few span operations minipd uses, a no-op (`None`) while tracing is off;
- `names.py`: the span, event and attribute names (docs/observability.md's tracing table).
"""
