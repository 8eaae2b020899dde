"""The W3C traceparent that reaches minipd from the network: valid ones are taken, every other
value is ignored (never raised), and the control plane's decoder refuses a malformed one."""

from __future__ import annotations

import sys

import msgspec
import pytest

from minipd.control import messages
from minipd.control.messages import Decode
from minipd.engine.sampling_params import SamplingParams
from minipd.tracing import exporter
from minipd.tracing.traceparent import TraceParent, parse_traceparent

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"
VALID = f"00-{TRACE_ID}-{SPAN_ID}-01"


def test_a_valid_header_is_parsed():
    assert parse_traceparent(VALID) == TraceParent(TRACE_ID, SPAN_ID, 1)
    assert parse_traceparent(VALID).sampled and parse_traceparent(VALID).header() == VALID
    assert not parse_traceparent(f"00-{TRACE_ID}-{SPAN_ID}-00").sampled


def test_a_future_version_is_read_as_version_00():
    parsed = parse_traceparent(f"cc-{TRACE_ID}-{SPAN_ID}-01-what-the-future-adds")
    assert parsed == TraceParent(TRACE_ID, SPAN_ID, 1)


@pytest.mark.parametrize(
    "value",
    [
        None,
        42,
        b"00-" + TRACE_ID.encode() + b"-" + SPAN_ID.encode() + b"-01",
        "",
        "garbage",
        VALID.upper(),  # lower-case hex only
        f"ff-{TRACE_ID}-{SPAN_ID}-01",  # version ff is invalid
        f"00-{'0' * 32}-{SPAN_ID}-01",  # all-zero trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero parent id
        f"00-{TRACE_ID}-{SPAN_ID}-01-extra",  # version 00 has exactly four fields
        f"00-{TRACE_ID[:-1]}-{SPAN_ID}-01",
        f"00-{TRACE_ID}-{SPAN_ID}-1",
        f"00-{TRACE_ID}x-{SPAN_ID}-01",
        f"00-{TRACE_ID}-{SPAN_ID}-01\n",
        f"cc-{TRACE_ID}-{SPAN_ID}-01-" + "x" * 10_000,  # longer than any header minipd looks at
    ],
)
def test_a_bad_value_is_ignored(value):
    assert parse_traceparent(value) is None


def _decode(traceparent):
    message = Decode(request_id="r", first_token=1, sampling=SamplingParams())
    frame = msgspec.msgpack.encode(msgspec.structs.asdict(message) | {"type": "decode", "traceparent": traceparent})
    return msgspec.msgpack.Decoder(messages.AnyMessage).decode(frame)


def test_the_control_plane_carries_a_valid_traceparent():
    assert _decode(VALID).traceparent == VALID
    assert _decode(None).traceparent is None


@pytest.mark.parametrize("bad", ["x" * 56, VALID.upper(), f"01-{TRACE_ID}-{SPAN_ID}-01", "", 7])
def test_the_decoder_refuses_a_malformed_traceparent(bad):
    with pytest.raises(msgspec.ValidationError, match="traceparent"):
        _decode(bad)


def test_an_endpoint_that_is_not_a_url_names_the_flag():
    with pytest.raises(exporter.TracingUnavailable, match="--otlp-traces-endpoint"):
        exporter.check_endpoint("localhost:4318")


def test_the_traces_path_is_added_to_a_bare_endpoint():
    assert exporter.check_endpoint("http://collector:4318") == "http://collector:4318/v1/traces"
    assert exporter.check_endpoint("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert exporter.check_endpoint("https://c/custom/path") == "https://c/custom/path"


def test_missing_packages_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # `import` raises ImportError
    with pytest.raises(exporter.TracingUnavailable, match=r"pip install 'minipd\[otel\]'"):
        exporter.check_endpoint("http://localhost:4318")


def test_tracing_is_off_unless_configured():
    assert exporter.tracer() is None
