"""A control port that proves the cluster secret but is not the instance a registry record
names: it answers every router's handshake as `instance_id` with a start nonce of its own, and
counts the connections it accepted (how often routers dialed it). It serves nothing."""

from __future__ import annotations

from minipd.control.messages import Hello, Welcome
from minipd.control.role import Role
from minipd.control.server import ControlServer
from minipd.transports.shared_secret import SharedSecret, new_nonce


class ImpostorInstance(ControlServer):
    def __init__(self, instance_id: str, secret: str):
        super().__init__(f"impostor {instance_id}", SharedSecret.from_text(secret))
        self.instance_id = instance_id
        self.start_nonce = new_nonce()
        self.num_connections = 0

    def _on_channel(self, channel) -> None:
        self.num_connections += 1
        super()._on_channel(channel)

    def welcome(self, hello: Hello) -> Welcome:
        return Welcome(instance_id=self.instance_id, role=Role.DECODE, start_nonce=self.start_nonce)

    def refuses_role(self, role: Role) -> str | None:
        return None if role is Role.ROUTER else "routers only"

    def max_frame_bytes(self) -> int:
        return 1 << 20

    async def handle(self, channel, message) -> None:
        pass  # it never gets this far with a router that checks who it is

    async def abort_request(self, request_id: str) -> None:
        pass
