"""The tracing flag (minipd/tracing): every role has it, and a launcher passes it to every child."""

from __future__ import annotations

from minipd.entrypoints.flag_fields import flag
from minipd.entrypoints.flag_spec import ALL, EVERY_CHILD, PROCESS
from minipd.tracing.exporter import OTEL_EXTRA

FLAGS = (
    flag(
        "--otlp-traces-endpoint",
        roles=ALL,
        group=PROCESS,
        inherit=EVERY_CHILD,
        sets="process.otlp_traces_endpoint",
        metavar="URL",
        help="export OpenTelemetry traces over OTLP/HTTP (protobuf) to URL, e.g. an OpenTelemetry collector "
        "or Jaeger at http://localhost:4318 (/v1/traces is appended when URL has no path): one trace per "
        "request across the router and the instances, continuing the client's W3C traceparent header. "
        f"Needs the '{OTEL_EXTRA}' extra (pip install 'minipd[{OTEL_EXTRA}]'); `cluster` passes it to its "
        "children (default: off)",
    ),
)
