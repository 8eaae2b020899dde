"""The tcp KV link's handshake and caps, in one process: each way a secret can be missing or
differ is refused with a message saying which side lacks what; unauthenticated links give
way at the connection cap and may not announce more than a handshake-sized header."""

from __future__ import annotations

import asyncio
import struct

import pytest
import torch
import uvloop

from minipd.transports.backends import create_transport
from minipd.transports.block_run import BlockRun
from minipd.transports.shared_secret import SharedSecret
from minipd.transports.transfer_error import TransferError
from minipd.transports.wire import MAX_HANDSHAKE_HEADER_BYTES

BLOCK_SHAPE = (2, 16, 2, 32)
NUM_LAYERS, NUM_BLOCKS = 2, 16
SECRET = SharedSecret(b"the kv link tests' cluster secret")
OTHER = SharedSecret(b"some other cluster's secret value")
TIMEOUT_S = 10.0


def _transport(instance_id: str, secret: SharedSecret | None, **options):
    return create_transport(
        "tcp", torch.zeros((NUM_LAYERS, NUM_BLOCKS, *BLOCK_SHAPE)), instance_id=instance_id, secret=secret, **options
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "sender_secret, receiver_secret, words",
    [
        (None, SECRET, "refused the KV link: the sender has no cluster secret"),
        (OTHER, SECRET, "refused the KV link: the sender's proof of the cluster secret is wrong"),
        (SECRET, None, "has no cluster secret configured; refusing to send it KV"),
    ],
    ids=["sender-without", "different", "receiver-without"],
)
def test_a_link_without_a_shared_secret_is_refused(sender_secret, receiver_secret, words):
    async def scenario():
        receiver, sender = _transport("decode", receiver_secret), _transport("prefill", sender_secret)
        await receiver.start()
        await sender.start()
        try:
            with pytest.raises(TransferError) as refused:
                await sender.connect(receiver.describe())
            return refused.value
        finally:
            await sender.close()
            await receiver.close()

    error = uvloop.run(scenario())
    assert words in error.reason and error.peer_id == "decode"


@pytest.mark.timeout(60)
def test_with_a_shared_secret_the_link_carries_kv():
    async def scenario():
        receiver, sender = _transport("decode", SECRET), _transport("prefill", SECRET)
        await receiver.start()
        await sender.start()
        try:
            sender.pool.fill_(3.0)
            peer = await sender.connect(receiver.describe())
            receiver.expect("r", "prefill", [4, 5])
            for layer in range(NUM_LAYERS):
                sender.write_layer(peer, "r", layer, [BlockRun(0, 4, 2)])
            await sender.finish_request(peer, "r")
            landed = await receiver.wait_landed("r", TIMEOUT_S)
            return landed, receiver.pool.clone()
        finally:
            await sender.close()
            await receiver.close()

    landed, pool = uvloop.run(scenario())
    assert landed.peer_id == "prefill" and bool((pool[:, 4:6] == 3.0).all()) and not pool[:, :4].any()


async def _eof(reader: asyncio.StreamReader) -> bool:
    """True once the other side hangs up (a reset counts); raises TimeoutError if it does not."""
    try:
        while await asyncio.wait_for(reader.read(1 << 16), TIMEOUT_S):
            pass
    except ConnectionError:
        pass
    return True


@pytest.mark.timeout(60)
def test_at_the_cap_unauthenticated_links_give_way_then_new_ones_are_refused():
    async def scenario():
        receiver = _transport("decode", SECRET, max_connections=2)
        senders = [_transport(f"prefill-{i}", SECRET) for i in range(2)]
        await receiver.start()
        host, port = receiver._endpoint().decode().split(":")
        idle = [await asyncio.open_connection(host, int(port)) for _ in range(2)]
        for sender in senders:
            await sender.start()
            await sender.connect(receiver.describe())
        evicted = [await _eof(reader) for reader, _ in idle]
        late_reader, late_writer = await asyncio.open_connection(host, int(port))
        refused = await asyncio.wait_for(late_reader.read(), TIMEOUT_S)
        receiver.expect("r", "prefill-1", [0])
        senders[1].write_layer("decode", "r", 0, [BlockRun(0, 0, 1)])
        senders[1].write_layer("decode", "r", 1, [BlockRun(0, 0, 1)])
        await senders[1].finish_request("decode", "r")
        landed = await receiver.wait_landed("r", TIMEOUT_S)
        for _, writer in [*idle, (late_reader, late_writer)]:
            writer.close()
        for transport in (*senders, receiver):
            await transport.close()
        return evicted, refused, landed

    evicted, refused, landed = uvloop.run(scenario())
    assert evicted == [True, True]
    assert refused == b"", "with every slot authenticated, a new link is closed before its challenge"
    assert landed.peer_id == "prefill-1", "the authenticated links still carry KV"


@pytest.mark.timeout(60)
def test_before_the_handshake_a_header_may_not_exceed_the_handshake_cap():
    async def scenario():
        receiver = _transport("decode", SECRET)
        await receiver.start()
        host, port = receiver._endpoint().decode().split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(struct.pack("!I", MAX_HANDSHAKE_HEADER_BYTES + 1) + b"\0" * 64)
        await writer.drain()
        hung_up = await _eof(reader)
        writer.close()
        await receiver.close()
        return hung_up

    assert uvloop.run(scenario()), "the receiver must hang up on an oversized handshake header"
