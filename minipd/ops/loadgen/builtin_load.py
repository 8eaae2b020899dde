"""A load generator built into the server: one named workload at a time, sent to the server's
own OpenAI API, with its progress readable while it runs.

It is the benchmarks' load client, not a second one: the workload is `make_workload`'s
(minipd/ops/workload), sent by `run_workload` (minipd/ops/loadgen/runner.py: warm-up, prompts of the
requested token length, Poisson arrivals at `rate` or a fixed `concurrency`, every request a
streamed `/v1/completions` timed as `vllm bench serve` times it) over HTTP to the port the
call came in on, with the server's API key. `LoadProgress` counts what the runner's observer
hears (sent, completed, failed) and the latencies so far (TTFT of every request, ITL of every
gap, in a constant-memory histogram).

Bounds: at most `num_requests` requests (MAX_REQUESTS) and `duration_s` seconds (MAX_DURATION_S):
at that time the run stops as `stop()` stops it, and the requests in flight are aborted (their
connections close); a rate in [MIN_RATE, MAX_RATE] requests per second, or a concurrency in
[1, MAX_CONCURRENCY]. Lengths fit the server's `max_model_len` (`fit_lengths`): one whose
upper bound was given (`fixed:N`, `uniform:LO:HI`, `lognormal:MEDIAN:SIGMA:LO:HI`) must fit
it, with the other's when both were (else the load is refused, naming the field); one whose
bound was not (a workload's default, or `lognormal:MEDIAN:SIGMA`) is fitted: an output to at
most `max_model_len - 1` tokens, less a given prompt's length, a prompt to `max_model_len`
less its request's output. The client shares the server's event loop and CPU: on a small
machine it takes a share of what it measures (the dashboard says so).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from typing import Callable, Sequence

import msgspec
import numpy as np

from minipd.engine.sampling_params import InvalidRequestError
from minipd.ops.loadgen.prompts import PromptBuilder, PromptTokens
from minipd.ops.loadgen.records import RequestRecord
from minipd.ops.loadgen.runner import RunnerConfig, WarmupFailed, run_workload
from minipd.ops.workload import WORKLOADS, ArrivalProcess, LengthDist, RequestSpec, make_workload
from minipd.ops.workload.lengths import open_ended
from minipd.slo.histogram import LogHistogram
from minipd.slo.latency import LatencyStats

log = logging.getLogger(__name__)

MAX_REQUESTS = 10_000
MAX_DURATION_S = 3600.0
MIN_RATE, MAX_RATE = 0.001, 1000.0  # requests per second: one in 17 minutes, at least
MAX_CONCURRENCY = 256
REQUEST_TIMEOUT_S = 300.0
MAX_ERRORS_KEPT = 5

IDLE, RUNNING, FINISHED, STOPPED, FAILED = "idle", "running", "finished", "stopped", "failed"


class LoadRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The body of `POST /admin/load`: a rate (Poisson arrivals) or a concurrency, not both."""

    workload: str
    rate: float | None = None  # requests per second
    concurrency: int | None = None  # requests kept in flight
    num_requests: int = 100
    duration_s: float = 60.0
    prompt_len: str | None = None  # fixed:N, uniform:LO:HI or lognormal:MEDIAN:SIGMA[:LO:HI]
    output_len: str | None = None
    seed: int = 0


class LoadProgress(msgspec.Struct, kw_only=True):
    state: str = IDLE  # idle, running, finished, stopped or failed
    reason: str = ""  # why it ended: "all requests done", "time limit", "stopped", the error
    run: str = ""  # the run's tag (its prompts start with it)
    workload: str = ""
    arrivals: str = ""  # "poisson 2 req/s" or "concurrency 4"
    num_requests: int = 0
    duration_s: float = 0.0
    started_at: float = 0.0  # time.time()
    elapsed_s: float = 0.0
    sent: int = 0
    completed: int = 0  # ended with their tokens
    failed: int = 0
    in_flight: int = 0
    output_tokens: int = 0
    ttft_s: LatencyStats = msgspec.field(default_factory=LatencyStats.empty)
    itl_s: LatencyStats = msgspec.field(default_factory=LatencyStats.empty)
    errors: list[str] = []  # the first few


class LoadConflict(RuntimeError):
    """A load run is under way already (start), or none is (stop)."""


class _Observer:
    """What the runner tells the progress (on the loop: no locking)."""

    def __init__(self, progress: LoadProgress):
        self.progress = progress
        self.ttfts: list[float] = []
        self.gaps = LogHistogram()

    def sent(self, record: RequestRecord) -> None:
        self.progress.sent += 1

    def done(self, record: RequestRecord) -> None:
        progress = self.progress
        if record.success:
            progress.completed += 1
            progress.output_tokens += record.output_tokens
            self.ttfts.append(record.ttft_s)
            if record.itl_s:
                self.gaps.add(np.asarray(record.itl_s, dtype=float))
        else:
            progress.failed += 1
            if len(progress.errors) < MAX_ERRORS_KEPT:
                progress.errors.append(record.error or "failed")


def _length(field: str, text: str | None, max_model_len: int) -> tuple[LengthDist | None, bool]:
    """(the distribution, whether its upper bound was given); an open-ended lognormal's bound
    is the model's, one given must fit it. InvalidRequestError naming `field` otherwise."""
    if text is None:
        return None, False
    try:
        dist = LengthDist.parse(text)
    except ValueError as exc:
        raise InvalidRequestError(field, str(exc)) from None
    if open_ended(text):
        return msgspec.structs.replace(dist, high=max(1, min(dist.high, max_model_len - 1))), False
    if dist.high >= max_model_len:
        raise InvalidRequestError(field, f"up to {dist.high} tokens cannot fit max_model_len {max_model_len}")
    return dist, True


def _arrivals(body: LoadRequest) -> ArrivalProcess:
    if (body.rate is None) == (body.concurrency is None):
        raise InvalidRequestError("rate", "give either a rate (requests per second) or a concurrency, not both")
    if body.rate is not None:
        if not (MIN_RATE <= body.rate <= MAX_RATE and math.isfinite(body.rate)):
            raise InvalidRequestError(
                "rate", f"must be in [{MIN_RATE:g}, {MAX_RATE:g}] requests per second, got {body.rate}"
            )
        return ArrivalProcess.poisson(body.rate)
    if not 1 <= body.concurrency <= MAX_CONCURRENCY:
        raise InvalidRequestError("concurrency", f"must be in [1, {MAX_CONCURRENCY}], got {body.concurrency}")
    return ArrivalProcess.fixed_concurrency(body.concurrency)


def plan_load(body: LoadRequest, max_model_len: int) -> list[RequestSpec]:
    """The requests of `body`, fitted to `max_model_len`; InvalidRequestError naming the field."""
    if body.workload not in WORKLOADS:
        raise InvalidRequestError(
            "workload", f"unknown workload {body.workload!r}; choose one of {', '.join(WORKLOADS)}"
        )
    arrivals = _arrivals(body)
    if not 1 <= body.num_requests <= MAX_REQUESTS:
        raise InvalidRequestError("num_requests", f"must be in [1, {MAX_REQUESTS}], got {body.num_requests}")
    if not (0 < body.duration_s <= MAX_DURATION_S):
        raise InvalidRequestError("duration_s", f"must be in (0, {MAX_DURATION_S:g}] seconds, got {body.duration_s}")
    prompt_len, prompt_given = _length("prompt_len", body.prompt_len, max_model_len)
    output_len, output_given = _length("output_len", body.output_len, max_model_len)
    try:
        specs = make_workload(body.workload, body.num_requests, arrivals, body.seed, prompt_len, output_len)
    except ValueError as exc:
        raise InvalidRequestError("prompt_len" if body.prompt_len else "output_len", str(exc)) from None
    return fit_lengths(specs, max_model_len, prompt_given, output_given)


def fit_lengths(
    specs: list[RequestSpec], max_model_len: int, prompt_given: bool, output_given: bool
) -> list[RequestSpec]:
    """Every request's prompt and output within `max_model_len` together: a length whose
    upper bound was not given yields to the other (the prompt when neither was); both
    given and too long together: InvalidRequestError naming `prompt_len`."""
    if prompt_given and output_given:
        longest = max(s.prompt_len + s.output_len for s in specs)
        if longest > max_model_len:
            raise InvalidRequestError(
                "prompt_len", f"a prompt and its output reach {longest} tokens, beyond max_model_len {max_model_len}"
            )
        return specs
    if prompt_given:
        return [s._replace(output_len=max(1, min(s.output_len, max_model_len - s.prompt_len))) for s in specs]
    # a workload's default lengths suit a CPU model's context; clip them to this server's
    return [s._replace(prompt_len=max(1, min(s.prompt_len, max_model_len - s.output_len))) for s in specs]


class BuiltinLoad:
    """One load run at a time against `base_url` (given per start: the port the call came in on)."""

    def __init__(self, tokens: PromptTokens, max_model_len: Callable[[], int], api_key: str | None = None):
        self.tokens, self.max_model_len = tokens, max_model_len
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.progress = LoadProgress()
        self._observer: _Observer | None = None
        self._task: asyncio.Task | None = None
        self._started = 0.0
        self._runs = itertools.count()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, body: LoadRequest, base_url: str) -> LoadProgress:
        """Start a run; InvalidRequestError for bad input, LoadConflict while one runs."""
        if self.running:
            raise LoadConflict(f"load run {self.progress.run!r} is under way; stop it first (POST /admin/load/stop)")
        specs = plan_load(body, self.max_model_len())
        tag = f"load{next(self._runs)}-{int(time.time())}"
        arrivals = f"poisson {body.rate:g} req/s" if body.rate is not None else f"concurrency {body.concurrency}"
        self.progress = LoadProgress(
            state=RUNNING,
            run=tag,
            workload=body.workload,
            arrivals=arrivals,
            num_requests=len(specs),
            duration_s=body.duration_s,
            started_at=time.time(),
        )
        self._observer = _Observer(self.progress)
        self._started = time.perf_counter()
        config = RunnerConfig(
            num_warmup=1,
            request_timeout_s=REQUEST_TIMEOUT_S,
            progress=False,
            concurrency=body.concurrency,
            headers=self.headers,
            observer=self._observer,
        )
        run = run_workload([base_url], specs, PromptBuilder(self.tokens, body.seed), tag, config)
        self._task = asyncio.get_running_loop().create_task(self._run(run, body.duration_s))
        log.warning(
            "built-in load %s: %s, %d requests, %s, at most %g s",
            tag,
            body.workload,
            len(specs),
            arrivals,
            body.duration_s,
        )
        return self.status()

    async def _run(self, run, duration_s: float) -> None:
        progress = self.progress
        try:
            await asyncio.wait_for(run, duration_s)
            progress.state, progress.reason = FINISHED, "all requests done"
        except asyncio.TimeoutError:
            progress.state, progress.reason = FINISHED, "time limit"
        except asyncio.CancelledError:
            progress.state, progress.reason = STOPPED, "stopped"
        except WarmupFailed as exc:
            progress.state, progress.reason = FAILED, str(exc)
        except Exception as exc:  # the run must end in a state the page can show, whatever broke it
            log.exception("built-in load %s failed", progress.run)
            progress.state, progress.reason = FAILED, f"{type(exc).__name__}: {exc}"
        progress.elapsed_s = time.perf_counter() - self._started
        log.warning("built-in load %s: %s (%s)", progress.run, progress.state, progress.reason)

    async def stop(self) -> LoadProgress:
        """Stop the run under way (its requests in flight are aborted); LoadConflict if none is."""
        if not self.running:
            raise LoadConflict("no load run is under way")
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        return self.status()

    def status(self) -> LoadProgress:
        progress, observer = self.progress, self._observer
        if observer is not None:
            if progress.state == RUNNING:
                progress.elapsed_s = time.perf_counter() - self._started
            progress.in_flight = progress.sent - progress.completed - progress.failed
            progress.ttft_s = LatencyStats.of(observer.ttfts)
            progress.itl_s = LatencyStats.of_histogram(observer.gaps)
        return progress

    async def close(self) -> None:
        if self.running:
            await self.stop()


class TokenizerPrompts:
    """A server's tokenizer (models/tokenizers/tokenizer.py) as the prompt builder's `PromptTokens`."""

    def __init__(self, tokenizer, name: str = "served"):
        self._tokenizer, self.name = tokenizer, name

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_bos=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids)
