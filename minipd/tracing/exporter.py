"""The OpenTelemetry SDK of one process: set up once at start when `--otlp-traces-endpoint` is given.

Spans go through a `BatchSpanProcessor` to an `OTLPSpanExporter` over OTLP/HTTP (protobuf):
ending a span only appends it to a bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048 by default;
spans beyond are dropped, never waited for), and the processor's own thread exports batches
every `OTEL_BSP_SCHEDULE_DELAY` ms, so neither the event loop nor the compute thread ever
waits on the collector. `shutdown(timeout_s)` (also registered with `atexit`) flushes what is
queued, within a bound: the SDK's own shutdown waits on a collector that never answers for
its export timeout and retries (10 s and more), so it runs on a daemon thread that gets
`timeout_s` (at least MIN_FLUSH_S); one still running then is dropped, with one warning
(`DROPPED`), and the process goes on to exit (a daemon thread never holds it). The roles give
it what is left of `--shutdown-timeout-s` (entrypoints/roles.py).

While tracing is off nothing here runs and the SDK is never imported: `tracer()` is None,
which every caller checks first (spans.py); a request's path reads `current` instead (the same
tracer, without a call).
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

OTEL_EXTRA = "otel"
TRACES_PATH = "/v1/traces"  # the OTLP/HTTP path of traces on a collector
FLAG = "--otlp-traces-endpoint"
DROPPED = "trace exporter dropped"  # the start of the one line a flush past its bound logs
MIN_FLUSH_S = 0.25  # a flush gets at least this: a healthy collector's takes milliseconds
AT_EXIT_FLUSH_S = 5.0  # the bound of the flush `atexit` runs (a process that never called `shutdown`)

# opentelemetry.trace.Tracer while tracing is on: what `tracer()` returns, read as it is by the
# request path's one test per request (a module attribute: no call)
current: Any = None
_provider: Any = None
_url = ""


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
    global current, _provider, _url
    url = check_endpoint(endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": service_name, "service.instance.id": instance_id, "minipd.role": role})
    # sampling: ParentBased(always on), so a client's choice holds; no `atexit` of the SDK's own
    # (unbounded): ours is bounded
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    _provider, current, _url = provider, provider.get_tracer("minipd"), url
    atexit.register(shutdown, AT_EXIT_FLUSH_S)
    log.info("exporting traces to %s as %s/%s", url, service_name, instance_id)


def tracer() -> Any:
    """The process's tracer, or None while tracing is off."""
    return current


def shutdown(timeout_s: float) -> bool:
    """Flush the spans still queued and stop exporting, within `timeout_s` (at least
    MIN_FLUSH_S); idempotent. False when the flush outlasted it: the exporter is dropped (its
    thread left to die with the process, the spans it held lost) and one warning says so."""
    global current, _provider
    provider, _provider, current = _provider, None, None
    if provider is None:
        return True
    bound_s = max(timeout_s, MIN_FLUSH_S)
    flush = threading.Thread(target=_shutdown_provider, args=(provider,), name="otel-shutdown", daemon=True)
    flush.start()
    flush.join(bound_s)
    if flush.is_alive():
        log.warning(
            "%s: its flush to %s did not end within %.2f s (what was left of the shutdown bound); "
            "the spans it still held are lost",
            DROPPED,
            _url,
            bound_s,
        )
        return False
    return True


def _shutdown_provider(provider: Any) -> None:
    try:
        provider.shutdown()
    except Exception:  # a thread's exception would only be printed: say it in the log instead
        log.exception("the trace exporter failed to shut down")
