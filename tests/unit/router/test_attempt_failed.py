"""A try that fails because its instance was lost says which instance, whatever the lower layer's
words were: the router ends the request with that message, and the HTTP API shows it."""

from __future__ import annotations

import types

import pytest

from minipd.control.channel import ChannelClosed
from minipd.router.attempt import AttemptFailed, blame
from minipd.router.outcome import Outcome


def _handle(instance_id: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(instance_id=instance_id, is_alive=False)


@pytest.mark.parametrize(
    "exc",
    [
        ChannelClosed("127.0.0.1:40123: closed (connection lost)"),  # a channel named by its address
        TimeoutError("no reply to Reserve within 10 s"),
        ChannelClosed("decode-0 died: connection lost"),  # named already: not twice
    ],
)
def test_a_lost_instance_is_named_in_the_failure(exc):
    with pytest.raises(AttemptFailed) as caught:
        with blame(_handle("decode-0")):
            raise exc
    failure = caught.value
    assert failure.outcome is Outcome.LOST and failure.blamed == "decode-0"
    assert str(failure).count("decode-0") == 1 and str(exc) in str(failure)


def test_a_refusal_is_not_a_lost_instance():
    failure = AttemptFailed(RuntimeError("busy"), Outcome.BUSY, "decode-0")
    assert failure.outcome is not Outcome.LOST and str(failure) == "busy"
