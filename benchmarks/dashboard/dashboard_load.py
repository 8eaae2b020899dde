"""The load `bench.py dashboard` drives through a cluster, so that every panel has something to show.

For `duration_s`, Poisson arrivals at `request_rate`: streamed completions, long prompts
(prefilled on the prefill instance) and short ones (prefilled locally by size) alternating,
each answer `min_tokens`..`max_tokens` tokens. Meanwhile:
- at a third of the run the prefill instance is switched to decode through the admin API, and
  back at two thirds (the roles and role-switch panels);
- every `overload_every_s`, once a regular request is streaming (so its KV claim is live) and
  while the cluster has its one decode instance (a second one doubles the admission limit),
  one request claims more KV than `--kv-admission-ratio` leaves beside it and is answered 503
  (the overloads panel).
Every request goes once (no client retry); the outcome counts come back in `LoadReport`.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import msgspec
import openai

from benchmarks.dashboard.prometheus_server import api_post

LONG_PROMPT = "disaggregated prefill and decode " * 8
MAX_CLIENTS = 16
REQUEST_TIMEOUT_S = 120.0


class LoadOptions(NamedTuple):
    duration_s: float
    request_rate: float
    min_tokens: int
    max_tokens: int
    overload_max_tokens: int  # claims more KV than the admission ratio leaves beside the others
    overload_every_s: float
    switched: str  # the instance switched prefill -> decode -> prefill
    seed: int = 0


class LoadReport(msgspec.Struct):
    sent: int = 0
    completed: int = 0
    failed: int = 0  # any other end (an error, an overload of a regular request)
    overloads_sent: int = 0
    overloads_refused: int = 0  # of those, answered 503
    switches: list[dict] = []  # {"at_s", "role", "status", "total_s"}


class _Streaming:
    """How many regular requests have had their first token and not ended (their claims are live)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0

    def add(self, n: int) -> None:
        with self.lock:
            self.count += n


def _one(client: openai.OpenAI, i: int, options: LoadOptions, rng: random.Random, streaming: _Streaming) -> bool:
    prompt = f"Request {i}: {LONG_PROMPT}" if i % 2 == 0 else f"s{i}"
    counted = False
    try:
        stream = client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=rng.randint(options.min_tokens, options.max_tokens),
            stream=True,
            extra_body={"ignore_eos": True},
        )
        for _ in stream:
            if not counted:
                streaming.add(1)
                counted = True
        return True
    except openai.APIError:
        return False
    finally:
        if counted:
            streaming.add(-1)


def _switch(base_url: str, api_key: str, instance: str, role: str, started: float) -> dict:
    status, body = api_post(base_url, "/admin/switch_role", {"instance": instance, "role": role}, api_key)
    return {"at_s": time.monotonic() - started, "role": role, "status": status, "total_s": body.get("total_s")}


def drive(base_url: str, api_key: str, options: LoadOptions) -> LoadReport:
    """Run the load for `options.duration_s`; returns once every request has ended."""
    rng = random.Random(options.seed)
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, timeout=REQUEST_TIMEOUT_S, max_retries=0)
    report, lock, streaming = LoadReport(), threading.Lock(), _Streaming()
    started = time.monotonic()
    events = [
        (options.duration_s / 3, "decode"),
        (2 * options.duration_s / 3, "prefill"),
    ]
    next_overload = options.overload_every_s / 2

    def regular(i: int, seed: int) -> None:
        ok = _one(client, i, options, random.Random(seed), streaming)
        with lock:
            report.completed += ok
            report.failed += not ok

    one_decode = threading.Event()  # set while the switched instance is a prefill one
    one_decode.set()

    def switch(role: str) -> None:
        outcome = _switch(base_url, api_key, options.switched, role, started)
        with lock:
            report.switches.append(outcome)
        if role == "prefill" and outcome["status"] == 200:
            one_decode.set()

    def oversized() -> None:
        body = {"model": "tiny", "prompt": "x", "max_tokens": options.overload_max_tokens}
        status, _ = api_post(base_url, "/v1/completions", body, api_key, REQUEST_TIMEOUT_S)
        with lock:
            report.overloads_refused += status == 503

    with ThreadPoolExecutor(MAX_CLIENTS) as pool:
        i, next_arrival = 0, 0.0
        while (now := time.monotonic() - started) < options.duration_s:
            if events and now >= events[0][0]:
                _, role = events.pop(0)
                if role == "decode":
                    one_decode.clear()  # before the switch starts: no overload is sent meanwhile
                pool.submit(switch, role)
            if now >= next_overload and streaming.count > 0 and one_decode.is_set():
                next_overload += options.overload_every_s
                report.overloads_sent += 1
                pool.submit(oversized)
            if now >= next_arrival:
                pool.submit(regular, i, rng.getrandbits(32))
                report.sent += 1
                i += 1
                next_arrival += rng.expovariate(options.request_rate)
            time.sleep(0.01)  # the arrival clock's tick, not a synchronisation
    return report
