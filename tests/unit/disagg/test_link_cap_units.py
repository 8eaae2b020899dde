"""An instance's runtime KV link cap (`SetLinkCap`): the transport's token bucket takes the new
rate, null or 0 lifts it, and a bad rate (negative, not finite, outside the runtime range
0.001 to 10,000 Gbit/s) is refused naming `gbps` with the cap unchanged."""

from __future__ import annotations

import math

import pytest
import torch

from minipd.control.messages import CallError, LinkCapSet
from minipd.disagg.link_cap import set_link_cap
from minipd.transports.loopback import LoopbackTransport


def transport(link_gbps: float | None = None) -> LoopbackTransport:
    return LoopbackTransport(torch.zeros((2, 4, 16)), instance_id="prefill-0", link_gbps=link_gbps)


def test_a_cap_is_set_changed_and_lifted():
    t = transport(link_gbps=2.0)
    assert t.link_gbps == 2.0
    assert set_link_cap(t, 0.5) == LinkCapSet(gbps=0.5, previous_gbps=2.0)
    assert t._limiter.bytes_per_second == pytest.approx(0.5e9 / 8)  # the bucket paces at the new rate
    assert set_link_cap(t, None) == LinkCapSet(gbps=None, previous_gbps=0.5)
    assert t._limiter is None
    assert set_link_cap(t, 0) == LinkCapSet(gbps=None, previous_gbps=None)  # 0 is uncapped, as --link-gbps


@pytest.mark.parametrize("gbps", [-1.0, math.inf, math.nan, 1e-300, 0.0009, 10_001.0, 1e308, True])
def test_a_bad_rate_is_refused_and_the_cap_stays(gbps):
    t = transport(link_gbps=3.0)
    answer = set_link_cap(t, gbps)
    assert isinstance(answer, CallError) and answer.kind == "invalid" and answer.message.startswith("gbps:")
    assert t.link_gbps == 3.0
