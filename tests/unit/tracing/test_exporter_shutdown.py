"""The trace exporter's last flush is bounded (tracing/exporter.py): against a collector that
accepts connections and never answers, `shutdown(bound)` returns within the bound (plus a
little), says False and logs one `trace exporter dropped` line; against a collector that
answers, it delivers the queued span and says True."""

from __future__ import annotations

import logging
import time

import pytest
from black_hole import BlackHole
from otlp_receiver import OtlpReceiver

from minipd.tracing import exporter

BOUND_S = 0.5
SLACK_S = 0.5  # a thread's start and join on a busy machine


@pytest.fixture
def traced():
    """Tracing on for the test (the caller configures it), off after whatever happened."""
    yield
    exporter.shutdown(exporter.MIN_FLUSH_S)


def _one_span() -> None:
    exporter.tracer().start_span("minipd.test").end()


def test_a_flush_to_a_collector_that_never_answers_is_dropped_at_its_bound(traced, caplog):
    hole = BlackHole()
    try:
        exporter.configure(hole.endpoint, "minipd-test", "t0", "both")
        _one_span()
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger=exporter.__name__):
            assert exporter.shutdown(BOUND_S) is False
        elapsed_s = time.monotonic() - start
    finally:
        hole.close()
    assert BOUND_S <= elapsed_s < BOUND_S + SLACK_S, elapsed_s
    dropped = [r.getMessage() for r in caplog.records if r.getMessage().startswith(exporter.DROPPED)]
    assert len(dropped) == 1 and hole.endpoint in dropped[0], caplog.text
    assert exporter.tracer() is None and exporter.shutdown(BOUND_S) is True  # once only


def test_a_bound_below_the_minimum_still_gives_the_flush_its_minimum(traced):
    hole = BlackHole()
    try:
        exporter.configure(hole.endpoint, "minipd-test", "t0", "both")
        _one_span()
        start = time.monotonic()
        assert exporter.shutdown(0.0) is False
        elapsed_s = time.monotonic() - start
    finally:
        hole.close()
    assert exporter.MIN_FLUSH_S <= elapsed_s < exporter.MIN_FLUSH_S + SLACK_S, elapsed_s


def test_a_flush_to_a_collector_that_answers_delivers_the_spans_in_time(traced, caplog):
    receiver = OtlpReceiver()
    try:
        exporter.configure(receiver.endpoint, "minipd-test", "t0", "both")
        _one_span()
        with caplog.at_level(logging.WARNING, logger=exporter.__name__):
            assert exporter.shutdown(10.0) is True
        assert [s["name"] for s in receiver.spans()] == ["minipd.test"]
    finally:
        receiver.close()
    assert exporter.DROPPED not in caplog.text
