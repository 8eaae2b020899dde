"""The colocated role (`both`): prefill and decode on one engine. It takes `Generate` (the
colocated way to serve a request) and, as either end of a disaggregated request, `Prefill`,
`Reserve` and `Decode`, served by the instance's prefill and decode handlers themselves, so
their state (transport peers, the refusal count) is one whichever role takes the work.
"""

from __future__ import annotations

from minipd.control.channel import Channel
from minipd.control.messages import Decode, Generate, Message, Prefill, Reserve
from minipd.control.role import Role
from minipd.disagg.decode_role import DecodeRole
from minipd.disagg.prefill_role import PrefillRole
from minipd.disagg.role_handler import RoleHandler


class ColocatedRole(RoleHandler):
    role = Role.BOTH
    accepts = (Generate, Prefill, Reserve, Decode)

    def __init__(self, prefill: PrefillRole, decode: DecodeRole):
        super().__init__(prefill.instance)
        self.prefill, self.decode = prefill, decode

    async def handle(self, channel: Channel, message: Message) -> None:
        if isinstance(message, Prefill):
            await self.prefill.prefill(channel, message)
        elif isinstance(message, Reserve):
            self.decode.reserve(channel, message)
        elif isinstance(message, Decode):
            await self.decode.decode(channel, message)
        else:
            await self.generate(channel, message)
