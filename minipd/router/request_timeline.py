"""One request's timeline at the router: when each phase of each try happened, on the router's clock.

Made from the events the router kept of the request while it keeps timelines
(`Router.timelines`, the dashboard's; request_log.py, replayed by timeline_store.py), at the
points its spans use (request_spans.py, instance_spans.py, kv_trace.py), without tracing: the router
stamps what it does and receives with `time.monotonic()` (arrival, each call sent and
answered, the first token relayed, the end), and the instances report their own times as
offsets on their own monotonic clocks (`Prefilled.times`, `KVLanded.landed_after_s`), never
as wall-clock instants, so hosts whose clocks disagree still give one consistent picture.

Placing an instance's offsets on the router's clock: the router knows when it sent a call
(`sent`) and when the answer came (`received`); the instance says how long it held the call
(`handled`, 0 where it answers at once). Assuming the way there takes as long as the way back
(as NTP does), the instant the instance took the call is `sent + (received - sent - handled) / 2`,
wrong by at most half the round trip's network part, `(received - sent - handled) / 2`, which
each timeline reports per instance as `clock_error_ms`. The prefill instance's offsets count
from its Prefill call's arrival; the decode instance's from its answer to the (last) Reserve.

`as_dict` turns it into what the dashboard shows: milliseconds after the request's arrival,
phases (`queued`, `reserve`, `prefill_queue`, `prefill`, `chunk`, `kv_transfer`,
`kv_exposed`, `adopt`, `generate`, `decode`), the KV per layer (`layers`: when the layer's first
write left and its last one completed, as the prefill instance saw it), and point events
(`kv_landed`, `first_token`, `try_failed`, `recompute`, and the end: `finish`, `error` or `abort`).
"""

from __future__ import annotations

import time
from typing import Callable

from minipd.control.messages import PrefillTimes
from minipd.engine.request import FinishReason, RequestOutput, TransferInfo

MAX_TRIES = 16  # tries timed per request (stale and busy refusals are tries too); later ones are counted
MAX_DETAIL_CHARS = 300  # an error's text as a timeline keeps it


def _clip(text: str | None) -> str | None:
    return None if text is None else text[:MAX_DETAIL_CHARS]


class TryTimes:
    """One try's stamps (router monotonic seconds) and what the instances reported."""

    __slots__ = (
        "number",
        "started",
        "decode",
        "prefill",
        "local",
        "reserve_sent",
        "reserve_call_sent",
        "reserve_received",
        "busy_waits",
        "prefill_sent",
        "prefill_received",
        "prefill_times",
        "stream_sent",
        "landed_after_s",
        "ordered_after_s",
        "adopt_s",
        "recompute",
        "failed_at",
        "failure",
    )

    def __init__(self, number: int, started: float):
        self.number, self.started = number, started
        self.decode: str | None = None
        self.prefill: str | None = None  # None: prefilled on its decode instance
        self.local = False
        self.reserve_sent: float | None = None  # the first Reserve call (busy waits follow it)
        self.reserve_call_sent: float | None = None  # the call that was answered
        self.reserve_received: float | None = None
        self.busy_waits = 0
        self.prefill_sent: float | None = None
        self.prefill_received: float | None = None
        self.prefill_times: PrefillTimes | None = None
        self.stream_sent: float | None = None  # the Decode (or Generate) message
        self.landed_after_s: float | None = None
        self.ordered_after_s: float | None = None
        self.adopt_s: float | None = None
        self.recompute: tuple[float, str] | None = None  # (when, why): the KV did not load
        self.failed_at: float | None = None
        self.failure: str | None = None

    # ---- alignment ------------------------------------------------------------------------
    def prefill_origin(self) -> tuple[float, float] | None:
        """(the prefill instance's reference on the router's clock, its error bound)."""
        if self.prefill_times is None or self.prefill_sent is None or self.prefill_received is None:
            return None
        network = max(0.0, self.prefill_received - self.prefill_sent - self.prefill_times.handled_s)
        return self.prefill_sent + network / 2, network / 2

    def decode_origin(self) -> tuple[float, float] | None:
        """(the decode instance's reference, its answer to the Reserve, on the router's clock; its error bound)."""
        if self.reserve_call_sent is None or self.reserve_received is None:
            return None
        network = self.reserve_received - self.reserve_call_sent
        return self.reserve_call_sent + network / 2, network / 2


class RequestTimeline:
    """Stamps of one request; `as_dict` once it ended (`ended` set)."""

    __slots__ = (
        "request_id",
        "arrival",
        "arrival_wall",
        "prompt_tokens",
        "tries",
        "num_tries",
        "first_token",
        "ended",
        "output",
        "outcome",
        "error",
        "on_end",
    )

    def __init__(
        self,
        request_id: str,
        arrival: float,
        prompt_tokens: int,
        on_end: Callable[[RequestTimeline], None] | None = None,
    ):
        self.request_id, self.arrival, self.prompt_tokens = request_id, arrival, prompt_tokens
        self.on_end = on_end  # told once it ended (the store keeps it)
        self.arrival_wall = time.time() - (time.monotonic() - arrival)
        self.tries: list[TryTimes] = []
        self.num_tries = 0
        self.first_token: float | None = None
        self.ended: float | None = None
        self.output: RequestOutput | None = None
        self.outcome = ""  # "finish", "error" or "abort" once ended
        self.error: str | None = None

    # ---- recorded by the router -----------------------------------------------------------
    def begin_try(self, at: float | None = None) -> TryTimes | None:
        """A new try, begun `at` (now when not said); None (nothing recorded for it) past MAX_TRIES."""
        self.num_tries += 1
        if len(self.tries) >= MAX_TRIES:
            return None
        times = TryTimes(self.num_tries, time.monotonic() if at is None else at)
        self.tries.append(times)
        return times

    @property
    def current(self) -> TryTimes | None:
        """The try under way (None past MAX_TRIES, or before the first)."""
        return self.tries[-1] if self.tries and len(self.tries) == self.num_tries else None

    def try_failed(self, error: str, at: float | None = None) -> None:
        """The try under way failed `at` (now when not said) with `error`."""
        current = self.current
        if current is not None:
            current.failed_at, current.failure = time.monotonic() if at is None else at, _clip(error)

    def token_relayed(self) -> None:
        if self.first_token is None:
            self.first_token = time.monotonic()

    def kv_landed(self, landed_after_s: float | None, ordered_after_s: float | None, adopt_s: float | None) -> None:
        current = self.current
        if current is not None:
            current.landed_after_s, current.ordered_after_s, current.adopt_s = landed_after_s, ordered_after_s, adopt_s

    def end(self, last: RequestOutput, at: float | None = None) -> None:
        """Ended `at` (now when not said) with `last`, its final output: an `error` when it says
        one, an `abort` when it was aborted without one (the client left), else a `finish`; then
        `on_end` is told."""
        self.ended, self.output = time.monotonic() if at is None else at, last
        if last.error is not None:
            self.outcome = "error"
        else:
            self.outcome = "abort" if last.finish_reason == FinishReason.ABORT.value else "finish"
        self.error = _clip(last.error)
        if self.on_end is not None:
            self.on_end(self)

    # ---- what the dashboard shows ------------------------------------------------------------
    def as_dict(self) -> dict:
        """The timeline in milliseconds after the arrival (the module's docstring says what is in it)."""
        arrival = self.arrival

        def ms(at: float) -> float:
            return round((at - arrival) * 1000.0, 3)

        phases: list[dict] = []
        events: list[dict] = []
        layers: list[dict] = []
        clock_error_ms: dict[str, float] = {}
        transfer: TransferInfo | None = self.output.transfer if self.output is not None else None
        ended = self.ended if self.ended is not None else time.monotonic()

        def phase(name: str, start: float, end: float, where: str, number: int, detail: str = "") -> None:
            phases.append(
                {
                    "name": name,
                    "start_ms": ms(start),
                    "end_ms": ms(max(start, end)),
                    "where": where,
                    "try": number,
                    "detail": detail,
                }
            )

        def event(name: str, at: float, where: str, detail: str = "") -> None:
            events.append({"name": name, "at_ms": ms(at), "where": where, "detail": detail})

        for n, t in enumerate(self.tries):
            if n == 0:
                first_call = t.reserve_sent or t.stream_sent or t.failed_at or ended
                phase("queued", arrival, first_call, "router", t.number)
            try_end = t.failed_at if t.failed_at is not None else ended
            if t.reserve_sent is not None:
                end = t.reserve_received if t.reserve_received is not None else try_end
                detail = f"{t.busy_waits} busy waits" if t.busy_waits else ""
                phase("reserve", t.reserve_sent, end, t.decode or "", t.number, detail)
            prefill_origin = t.prefill_origin()
            if prefill_origin is not None and t.prefill_times is not None:
                origin, error = prefill_origin
                clock_error_ms[t.prefill or ""] = round(error * 1000.0, 3)
                p = t.prefill_times
                where = t.prefill or ""
                phase("prefill_queue", origin, origin + p.compute_start_s, where, t.number)
                phase(
                    "prefill",
                    origin + p.compute_start_s,
                    origin + p.compute_end_s,
                    where,
                    t.number,
                    f"{p.num_chunks} chunks",
                )
                for i, (start, end) in enumerate(p.chunks):
                    phase("chunk", origin + start, origin + end, where, t.number, f"chunk {i + 1}")
                layers = [
                    {"layer": i, "sent_ms": ms(origin + a), "landed_ms": ms(origin + b)}
                    for i, (a, b) in enumerate(p.layers)
                    if a >= 0
                ]
                decode_origin = t.decode_origin()
                if decode_origin is not None and t.landed_after_s is not None:
                    d_origin, d_error = decode_origin
                    clock_error_ms[t.decode or ""] = round(d_error * 1000.0, 3)
                    landed = d_origin + t.landed_after_s
                    first_write = min((origin + a for a, _ in p.layers if a >= 0), default=origin + p.compute_end_s)
                    phase("kv_transfer", first_write, landed, f"{where}→{t.decode}", t.number)
                    phase("kv_exposed", origin + p.compute_end_s, landed, f"{where}→{t.decode}", t.number)
                    event("kv_landed", landed, t.decode or "")
                    if t.ordered_after_s is not None and t.adopt_s is not None:
                        adopt_start = d_origin + max(t.landed_after_s, t.ordered_after_s)
                        phase("adopt", adopt_start, adopt_start + t.adopt_s, t.decode or "", t.number)
            if t.recompute is not None:
                event("recompute", t.recompute[0], t.decode or "", t.recompute[1])
            if t.stream_sent is not None and (t.local or t.recompute is not None):
                end = self.first_token if self.first_token is not None else try_end
                phase("generate", t.stream_sent, end, t.decode or "", t.number, "prefill on the decode instance")
            if t.failed_at is not None:
                event("try_failed", t.failed_at, "router", t.failure or "")
        if self.first_token is not None:
            event("first_token", self.first_token, "router")
            number = self.tries[-1].number if self.tries else 1
            phase("decode", self.first_token, ended, self.decode_instance or "", number)
        event(self.outcome or "finish", ended, "router", self.error or "")
        phases.sort(key=lambda p: (p["start_ms"], p["end_ms"]))
        events.sort(key=lambda e: e["at_ms"])
        output = self.output
        return {
            "request_id": self.request_id,
            "started_at": self.arrival_wall,
            "duration_ms": ms(ended),
            "outcome": self.outcome,
            "finish_reason": output.finish_reason if output is not None else None,
            "error": self.error,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": output.num_output_tokens if output is not None else 0,
            "ttft_ms": None if self.first_token is None else ms(self.first_token),
            "prefill_instance": self.tries[-1].prefill if self.tries else None,
            "decode_instance": self.decode_instance,
            "tries": self.num_tries,
            "kv_bytes": transfer.num_bytes if transfer is not None else 0,
            "num_chunks": self.tries[-1].prefill_times.num_chunks if self.tries and self.tries[-1].prefill_times else 0,
            "clock_error_ms": clock_error_ms,
            "phases": phases,
            "layers": layers,
            "events": events,
        }

    @property
    def decode_instance(self) -> str | None:
        return self.tries[-1].decode if self.tries else None
