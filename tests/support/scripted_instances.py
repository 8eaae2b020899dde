"""Instances the router's unit tests script: a registered handle on any channel-shaped object
(it must have `name`, `closed` (an asyncio.Event), `close_reason`, `call` and `send`), with
stats that make it pickable; the one prompt they serve, and the answers a script gives: a
reservation, a prefill's reply, and the three outputs of a stream."""

from __future__ import annotations

import time

from minipd.control.messages import PROTOCOL_VERSION, Fingerprint, Prefilled, Reserved, Stats, TokenOutput, Welcome
from minipd.control.role import Role
from minipd.engine.request import RequestOutput
from minipd.engine.sampling_params import SamplingParams
from minipd.models.arch.model_config import PRESETS
from minipd.router.registry import InstanceHandle
from minipd.router.router import Router

BS = 16
FINGERPRINT = Fingerprint(PROTOCOL_VERSION, PRESETS["tiny"], "digest", "float32", BS, "layout")
PROMPT = list(range(3, 3 + 4 * BS))
PARAMS = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)  # a stream of three outputs


def add_scripted(router: Router, instance_id: str, role: Role, channel, free: int = 50) -> InstanceHandle:
    """Register `channel` as instance `instance_id` of `role` with `free` of its 100 blocks free."""
    welcome = Welcome(instance_id=instance_id, role=role, fingerprint=FINGERPRINT, max_model_len=512, max_num_seqs=8)
    handle = InstanceHandle(welcome, channel, ("127.0.0.1", 0))
    handle.stats = Stats(
        instance_id=instance_id,
        role=role,
        num_running=0,
        num_waiting=0,
        num_free_blocks=free,
        num_used_blocks=100 - free,
        num_cached_blocks=0,
        num_blocks=100,
    )
    router.registry.add(handle)
    return handle


def reserved() -> Reserved:
    return Reserved(num_cached_tokens=0, dst_block_ids=list(range(4)), lease_s=10.0)


def prefilled() -> Prefilled:
    now = time.time()
    return Prefilled(
        first_token=7,
        num_cached_tokens=0,
        num_bytes=4096,
        compute_s=0.001,
        transfer_s=0.001,
        exposed_s=0.0,
        compute_end_at=now,
        first_write_at=now,
    )


def token_output(wire_id: str, n: int) -> TokenOutput:
    """Output `n` (1 to 3) of a stream of PARAMS.max_tokens: token 10 + n, the last one finished."""
    last = n == PARAMS.max_tokens
    output = RequestOutput(
        request_id=wire_id,
        token_ids=[10 + n],
        text="x",
        finished=last,
        finish_reason="length" if last else None,
        num_prompt_tokens=len(PROMPT),
        num_output_tokens=n,
    )
    return TokenOutput(request_id=wire_id, output=output)
