"""The crossover's two measurements, each a median over interleaved repeats.

- `interference`: per prompt length, what one decode stream on a colocated instance loses
  while a probe prompt is prefilled beside it (a fresh stream per probe, warmed up first);
- `extra_ttft`: per link and prompt length, the probe's TTFT on that link minus its TTFT on
  the unlimited baseline, probed back to back (the order alternating between repeats), so
  that the drift of a shared machine cancels out of each difference.
Each probe (or back-to-back set) that other jobs disturbed beyond the guard's limit is
repeated once the machine is calmer (`host_load.QuietGuard`). A link is an endpoint
  and how to select its bandwidth before a probe (reshaping a tc link, or nothing for a
  deployment started with `--link-gbps`).
"""

from __future__ import annotations

import statistics
from typing import Callable, NamedTuple, Sequence

import aiohttp

from benchmarks.loadgen.crossover_model import stall_s
from benchmarks.loadgen.host_load import QuietGuard
from benchmarks.loadgen.probes import DecodeStream, probe_ttft, warm_up_and_calibrate
from benchmarks.loadgen.server_metrics import transfer_totals
from minipd.ops.loadgen.client import served_model
from minipd.ops.loadgen.prompts import PromptBuilder

BACKGROUND_PROMPT_LEN = 32
WARM_TOKENS = 16  # decode tokens before a probe, so the stream is in its steady state
SETTLE_TOKENS = 4  # and after it, so its gaps around the probe are all seen


class Link(NamedTuple):
    gbps: float | None  # None: unlimited
    url: str
    select: Callable[[], None]  # make this link's bandwidth the one in force


class Interference(NamedTuple):
    stall_s: list[float]  # per prompt length, medians
    decode_gap_s: list[float]
    ttft_s: list[float]


class ExtraTtft(NamedTuple):
    extra_s: dict[float, list[float]]  # bandwidth -> per prompt length, median paired difference
    baseline_ttft_s: list[float]  # per prompt length, median on the unlimited link
    kv_bytes: list[float | None]  # per prompt length, KV bytes per transfer (the baseline's /metrics)


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))


async def interference(
    url: str,
    prompt_lens: Sequence[int],
    repeats: int,
    builder: PromptBuilder,
    background_tokens: int,
    timeout_s: float,
    guard: QuietGuard | None = None,
) -> Interference:
    guard = guard or QuietGuard()
    stalls: dict[int, list[float]] = {n: [] for n in prompt_lens}
    gaps: dict[int, list[float]] = {n: [] for n in prompt_lens}
    ttfts: dict[int, list[float]] = {n: [] for n in prompt_lens}
    async with _session() as session:
        model = await served_model(session, url)
        await warm_up_and_calibrate(session, url, model, builder, prompt_lens[0], timeout_s)

        async def one(r: int, n: int, attempt: int) -> tuple[float, float, float]:
            tag = f"{r}-{attempt}"
            background = builder.prompt(f"background-{n}", tag, BACKGROUND_PROMPT_LEN)
            async with DecodeStream(session, url, model, background, background_tokens) as stream:
                await stream.wait_for_tokens(WARM_TOKENS)
                start, end = await probe_ttft(session, url, model, builder.prompt(f"coloc-{n}", tag, n), n, timeout_s)
                await stream.wait_for_tokens(SETTLE_TOKENS)
                times = list(stream.times)
            undisturbed = statistics.median(b - a for a, b in zip(times, times[1:]) if b <= start or a >= end)
            return stall_s(times, start, end, undisturbed), undisturbed, end - start

        for r in range(repeats):
            for n in prompt_lens:
                (stall, gap, ttft), _, _ = await guard.measure_async(lambda attempt, r=r, n=n: one(r, n, attempt))
                stalls[n].append(stall)
                gaps[n].append(gap)
                ttfts[n].append(ttft)
    return Interference(*([statistics.median(d[n]) for n in prompt_lens] for d in (stalls, gaps, ttfts)))


async def extra_ttft(
    baseline: Link,
    links: Sequence[Link],
    prompt_lens: Sequence[int],
    repeats: int,
    builder: PromptBuilder,
    tag: str,
    timeout_s: float,
    guard: QuietGuard | None = None,
) -> ExtraTtft:
    guard = guard or QuietGuard()
    base: dict[int, list[float]] = {n: [] for n in prompt_lens}
    extra: dict[float, dict[int, list[float]]] = {link.gbps: {n: [] for n in prompt_lens} for link in links}
    kv: dict[int, list[float]] = {n: [] for n in prompt_lens}
    async with _session() as session:
        models = {}
        for link in dict.fromkeys([baseline, *links]):
            link.select()
            models[link.url] = await served_model(session, link.url)
            await warm_up_and_calibrate(session, link.url, models[link.url], builder, prompt_lens[0], timeout_s)

        async def one(r: int, n: int, attempt: int) -> tuple[dict[float | None, float], list[float]]:
            """TTFT per link of one probe each, back to back, and the KV bytes the baseline moved."""
            order = [baseline, *links] if r % 2 == 0 else [*links, baseline]
            ttft, kv_bytes = {}, []
            for k, link in enumerate(order):
                link.select()
                before = transfer_totals(link.url) if link is baseline else None
                prompt = builder.prompt(f"{tag}-{n}-{k}", f"{r}-{attempt}", n)
                start, first = await probe_ttft(session, link.url, models[link.url], prompt, n, timeout_s)
                ttft[link.gbps] = first - start
                after = transfer_totals(link.url) if before is not None else None
                if before and after and after.since(before).bytes_per_transfer:
                    kv_bytes.append(after.since(before).bytes_per_transfer)
            return ttft, kv_bytes

        for r in range(repeats):
            for n in prompt_lens:
                (ttft, kv_bytes), _, _ = await guard.measure_async(lambda attempt, r=r, n=n: one(r, n, attempt))
                base[n].append(ttft[None])
                kv[n] += kv_bytes
                for link in links:
                    extra[link.gbps][n].append(ttft[link.gbps] - ttft[None])
    return ExtraTtft(
        {g: [statistics.median(per_len[n]) for n in prompt_lens] for g, per_len in extra.items()},
        [statistics.median(base[n]) for n in prompt_lens],
        [statistics.median(kv[n]) if kv[n] else None for n in prompt_lens],
    )
