"""The OpenTelemetry SDK of one process: set up once at start when `--otlp-traces-endpoint` is given.

Spans go through a `BatchSpanProcessor` to an `OTLPSpanExporter` over OTLP/HTTP (protobuf):
ending a span only appends it to a bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048 by default;
spans beyond are dropped, never waited for), and the processor's own thread exports batches
every `OTEL_BSP_SCHEDULE_DELAY` ms, so neither the event loop nor the compute thread ever
waits on the collector. `shutdown` (also registered with `atexit`) flushes what is queued.

While tracing is off nothing here runs and the SDK is never imported: `tracer()` is None,
which every caller checks first (spans.py).
"""

from __future__ import annotations

import atexit
import logging
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

OTEL_EXTRA = "otel"
TRACES_PATH = "/v1/traces"  # the OTLP/HTTP path of traces on a collector
FLAG = "--otlp-traces-endpoint"

_tracer: Any = None  # opentelemetry.trace.Tracer while tracing is on
_provider: Any = None


class TracingUnavailable(ValueError):
    """The flag is set but the packages are missing (or the endpoint is not a URL)."""


def check_endpoint(endpoint: str) -> str:
    """The URL spans are posted to: `endpoint` as given, with `/v1/traces` appended when it
    names no path (`http://collector:4318`); TracingUnavailable names the flag and the extra."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise TracingUnavailable(f"{FLAG}: expected an http(s) URL such as http://localhost:4318, got {endpoint!r}")
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise TracingUnavailable(
            f"{FLAG} needs the OpenTelemetry SDK and its OTLP/HTTP exporter, which are not installed "
            f"({exc.name} is missing): pip install 'minipd[{OTEL_EXTRA}]'"
        ) from None
    return endpoint if parts.path not in ("", "/") else endpoint.rstrip("/") + TRACES_PATH


def configure(endpoint: str, service_name: str, instance_id: str, role: str) -> None:
    """Export this process's spans to `endpoint` from now on, as `service_name` (its
    `service.instance.id`: `instance_id`). Called once per process, before any span."""
    global _tracer, _provider
    url = check_endpoint(endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": service_name, "service.instance.id": instance_id, "minipd.role": role})
    provider = TracerProvider(resource=resource)  # sampling: ParentBased(always on), so a client's choice holds
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    _provider, _tracer = provider, provider.get_tracer("minipd")
    atexit.register(shutdown)
    log.info("exporting traces to %s as %s/%s", url, service_name, instance_id)


def tracer() -> Any:
    """The process's tracer, or None while tracing is off."""
    return _tracer


def shutdown() -> None:
    """Flush the spans still queued and stop exporting (idempotent)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()
