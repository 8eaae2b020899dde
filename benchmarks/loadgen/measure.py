"""One measured run, start to summary, for the experiments (which run many)."""

from __future__ import annotations

import asyncio
import sys
from typing import NamedTuple, Sequence

from benchmarks.loadgen.host_load import QuietGuard
from benchmarks.loadgen.stats import RunSummary, summarize
from minipd.ops.loadgen.prompts import PromptBuilder
from minipd.ops.loadgen.records import RequestRecord, attainment, num_good
from minipd.ops.loadgen.runner import RunnerConfig, RunResult, run_workload
from minipd.ops.workload import RequestSpec
from minipd.slo.latency import percentile
from minipd.slo.targets import SLO

MS_PER_S = 1e3


class Measured(NamedTuple):
    result: RunResult
    summary: RunSummary  # against the run's main SLO
    foreign_cpu: float  # share of the machine other jobs used during the run (host_load.ForeignCpu)
    reruns: int  # times the run was repeated because other jobs took too much of the machine

    @property
    def records(self) -> list[RequestRecord]:
        return self.result.records

    def attainment(self, slo: SLO) -> float:
        return attainment(self.records, slo)

    def good_per_s(self, slo: SLO) -> float:
        """Requests that met `slo` per second of the run (vLLM's request goodput)."""
        return num_good(self.records, slo) / self.result.duration_s if self.result.duration_s > 0 else 0.0

    def p90_ttft_ms(self) -> float:
        return percentile([r.ttft_s * MS_PER_S for r in self.records if r.success], 90)

    def p90_itl_ms(self) -> float:
        return self.itl_percentile_ms(90)

    def itl_percentile_ms(self, p: float) -> float:
        return percentile([gap * MS_PER_S for r in self.records if r.success for gap in r.itl_s], p)


def measure(
    urls: Sequence[str],
    specs: Sequence[RequestSpec],
    builder: PromptBuilder,
    run_tag: str,
    config: RunnerConfig,
    slo: SLO = SLO(),
) -> Measured:
    """Run `specs` against `urls` and summarize; warns when the server counted prompts otherwise.
    A run that other jobs disturbed beyond `config.max_foreign_cpu` is repeated (new prompts)."""
    guard = QuietGuard(config.max_foreign_cpu, config.quiet_wait_s, config.max_reruns)
    attempts = iter(range(config.max_reruns + 1))

    def attempt() -> RunResult:
        n = next(attempts)
        return asyncio.run(run_workload(urls, specs, builder, run_tag if n == 0 else f"{run_tag}-rerun{n}", config))

    result, foreign, reruns = guard.measure(attempt)
    if result.num_prompt_len_mismatches:
        print(
            f"warning: {run_tag}: the server counted {result.num_prompt_len_mismatches} of {len(specs)} prompts "
            "at another length than requested (is --tokenizer the served model's?)",
            file=sys.stderr,
        )
    return Measured(result, summarize(result.records, result.duration_s, slo), foreign, reruns)


def record_rows(records: Sequence[RequestRecord]) -> list[dict]:
    """Per-request figures for the JSON (milliseconds)."""
    return [
        {
            "index": r.index,
            "sent_s": r.sent_s,
            "success": r.success,
            "error": r.error,
            "prompt_len": r.prompt_len,
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
            "ttft_ms": r.ttft_s * MS_PER_S,
            "tpot_ms": r.tpot_s * MS_PER_S,
            "e2el_ms": r.e2el_s * MS_PER_S,
            "itl_ms": [gap * MS_PER_S for gap in r.itl_s],
        }
        for r in records
    ]
