"""Shared pieces of the role-switch tests: a record of the role each instance had whenever it
took work, the prompts and reference outputs of a load, and a bare control connection."""

from __future__ import annotations

import asyncio
import random
from typing import NamedTuple

from engine_helpers import Completion

from minipd.control.channel import Channel
from minipd.control.messages import PROTOCOL_VERSION, Hello
from minipd.control.role import Role
from minipd.disagg.instance import Instance
from minipd.engine.sampling_params import SamplingParams


class WorkTaken(NamedTuple):
    instance_id: str
    what: str  # "prefill" (a prompt whose KV leaves), "reserve", "generate", "adopt"
    role: str
    switching: bool


def record_roles(instances: list[Instance]) -> list[WorkTaken]:
    """Wrap each engine's entry points so that every piece of work records the role its
    instance had when it started; returns the (growing) record."""
    taken: list[WorkTaken] = []
    for instance in instances:
        engine = instance.engine
        for what, name in (
            ("prefill", "submit_prefill"),
            ("reserve", "reserve"),
            ("generate", "submit"),
            ("adopt", "adopt"),
        ):
            original = getattr(engine, name)

            def wrapped(*args, _original=original, _what=what, _instance=instance, **kwargs):
                taken.append(WorkTaken(_instance.instance_id, _what, _instance.role.value, _instance.guard.switching))
                return _original(*args, **kwargs)

            setattr(engine, name, wrapped)
    return taken


def wrong_role(taken: list[WorkTaken]) -> list[WorkTaken]:
    """Work started in a role that does not serve it, or started while the instance switched
    (a decode of a reservation held from before the switch is the one exception)."""
    serves = {
        "prefill": ("prefill", "both"),
        "reserve": ("decode", "both"),
        "generate": ("decode", "both"),
        "adopt": ("decode", "both"),
    }
    return [t for t in taken if t.role not in serves[t.what] or (t.switching and t.what != "adopt")]


def load_prompts(seed: int, num: int, min_len: int = 40, max_len: int = 200) -> list[list[int]]:
    """Prompts long enough to be disaggregated (above the local-prefill threshold)."""
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randint(min_len, max_len))] for _ in range(num)]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def complete(server, prompt: list[int], max_tokens: int) -> Completion:
    return Completion([out async for out in server.generate(prompt, greedy(max_tokens))])


async def complete_all(server, prompts: list[list[int]], max_tokens: list[int]) -> list[Completion]:
    return list(await asyncio.gather(*(complete(server, p, n) for p, n in zip(prompts, max_tokens, strict=True))))


def assert_all_served(expected: list[Completion], actual: list[Completion], max_tokens: list[int]) -> None:
    """Every request finished with all its tokens, equal to the colocated reference."""
    for i, (e, a, n) in enumerate(zip(expected, actual, max_tokens, strict=True)):
        last = a.outputs[-1]
        assert last.error is None and last.finish_reason == "length", f"request {i}: {last}"
        assert len(a.token_ids) == n and a.token_ids == e.token_ids, f"request {i}"


class RawRouter:
    """A control connection to one instance, as a router would hold it, collecting the
    messages that are not replies (token outputs, refused streams)."""

    def __init__(self, channel: Channel):
        self.channel, self.received = channel, asyncio.Queue()

    @classmethod
    async def connect(cls, port: int) -> "RawRouter":
        raw = cls.__new__(cls)
        raw.received = asyncio.Queue()
        raw.channel = await Channel.connect("127.0.0.1", port, lambda ch, m: raw.received.put_nowait(m), "test")
        raw.welcome = await raw.channel.call(Hello(protocol_version=PROTOCOL_VERSION, role=Role.ROUTER))
        return raw
