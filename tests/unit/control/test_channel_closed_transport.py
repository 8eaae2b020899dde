"""A channel whose transport is already closed, while its read loop has not yet seen the end,
drops what is sent on it instead of raising (uvloop's write on a closed handle raises
RuntimeError). The router tells every peer of a loss with `send`; had that raised, the task
handling the loss died before redialing the lost instance, which then never came back."""

from __future__ import annotations

import asyncio

import uvloop

from minipd.control.channel import Channel
from minipd.control.messages import Heartbeat


async def _closed_transport_send() -> bool:
    accepted: asyncio.Queue = asyncio.Queue()

    async def on_connect(reader, writer):
        await accepted.put(writer)

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    peer = await asyncio.wait_for(accepted.get(), 5)
    channel = Channel(reader, writer, None, "test")  # not started: no read loop sees the close
    writer.transport.abort()  # the transport is gone; channel.closed is not set yet
    await asyncio.sleep(0)  # let the loop finish closing the handle (one iteration, not a wait)
    try:
        channel.send(Heartbeat())
        return not channel.closed.is_set()
    finally:
        peer.close()
        server.close()
        await server.wait_closed()


def test_send_on_a_closed_transport_is_dropped_not_raised():
    assert uvloop.run(_closed_transport_send()) is True
