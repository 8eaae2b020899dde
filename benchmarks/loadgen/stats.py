"""A measured run's summary, with the names and definitions `vllm bench serve` prints, and its
table (in milliseconds, as vLLM prints it; the summary itself holds seconds).

Latency statistics (`minipd.slo.latency`) are over successful requests only (TTFT, TPOT of
requests with more than one output token, every ITL gap, E2EL), as vLLM computes them;
failures are counted and lower the SLO attainment and the goodput instead.
"""

from __future__ import annotations

import math
from typing import Sequence

import msgspec

from minipd.ops.loadgen.records import RequestRecord, attainment, num_good
from minipd.slo.latency import PERCENTILES, LatencyStats
from minipd.slo.targets import SLO

MS_PER_S = 1e3  # tables print milliseconds, as vLLM's do


class RunSummary(msgspec.Struct, kw_only=True):
    num_requests: int
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # completed requests per second
    request_goodput: float  # completed requests meeting the SLO, per second (vLLM's "goodput")
    output_throughput: float
    total_token_throughput: float
    slo: SLO
    num_good: int
    attainment: float  # good / all requests sent
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2el: LatencyStats
    errors: list[str]  # the first few distinct failure messages


MAX_ERRORS_KEPT = 5


def summarize(records: Sequence[RequestRecord], duration_s: float, slo: SLO) -> RunSummary:
    ok = [r for r in records if r.success]
    total_in = sum(r.prompt_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: math.nan)
    errors = list(dict.fromkeys(r.error or "unknown error" for r in records if not r.success))[:MAX_ERRORS_KEPT]
    good = num_good(records, slo)
    return RunSummary(
        num_requests=len(records),
        completed=len(ok),
        failed=len(records) - len(ok),
        duration_s=duration_s,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=per_s(len(ok)),
        request_goodput=per_s(good),
        output_throughput=per_s(total_out),
        total_token_throughput=per_s(total_in + total_out),
        slo=slo,
        num_good=good,
        attainment=attainment(records, slo),
        ttft=LatencyStats.of([r.ttft_s for r in ok]),
        tpot=LatencyStats.of([r.tpot_s for r in ok if r.output_tokens > 1]),
        itl=LatencyStats.of([gap for r in ok for gap in r.itl_s]),
        e2el=LatencyStats.of([r.e2el_s for r in ok]),
        errors=errors,
    )


def _line(label: str, value: str) -> str:
    return f"{label:<40}{value:<10}"


def format_summary(summary: RunSummary, title: str = "Serving Benchmark Result") -> str:
    """The summary as `vllm bench serve` prints it (plus P90, failures and the SLO attainment)."""
    lines = [
        f"{' ' + title + ' ':=^50}",
        _line("Successful requests:", str(summary.completed)),
        _line("Failed requests:", str(summary.failed)),
        _line("Benchmark duration (s):", f"{summary.duration_s:.2f}"),
        _line("Total input tokens:", str(summary.total_input_tokens)),
        _line("Total generated tokens:", str(summary.total_output_tokens)),
        _line("Request throughput (req/s):", f"{summary.request_throughput:.2f}"),
    ]
    if not summary.slo.is_empty:
        lines += [
            _line("Request goodput (req/s):", f"{summary.request_goodput:.2f}"),
            _line(f"SLO attainment ({summary.slo}):", f"{summary.attainment:.1%}"),
        ]
    lines += [
        _line("Output token throughput (tok/s):", f"{summary.output_throughput:.2f}"),
        _line("Total Token throughput (tok/s):", f"{summary.total_token_throughput:.2f}"),
    ]
    sections = (
        ("ttft", "TTFT", "Time to First Token"),
        ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
        ("itl", "ITL", "Inter-token Latency"),
        ("e2el", "E2EL", "End-to-end Latency"),
    )
    for field, short, heading in sections:
        stats: LatencyStats = getattr(summary, field)
        lines.append(f"{heading:-^50}")
        lines.append(_line(f"Mean {short} (ms):", f"{stats.mean * MS_PER_S:.2f}"))
        lines.append(_line(f"Median {short} (ms):", f"{stats.median * MS_PER_S:.2f}"))
        for p in PERCENTILES[1:]:
            lines.append(_line(f"P{p} {short} (ms):", f"{getattr(stats, f'p{p}') * MS_PER_S:.2f}"))
    lines.append("=" * 50)
    lines += [f"error: {message}" for message in summary.errors]
    return "\n".join(lines)
