"""Instances without an engine, for measuring the router alone: each is a real control server
(the authenticated handshake of minipd/control/server.py, a Welcome with a fixed fingerprint)
that registers with the router as `--router` instances do (entrypoints/registration.py) and
answers the router's `GetStats` polls with constant figures. They serve nothing else: a
request routed to one would never finish, so the router they join takes no requests.

All of them run on one asyncio loop in a thread of the benchmark process (`FakeFleet`).
"""

from __future__ import annotations

import asyncio
import threading

from minipd.control.channel import Channel
from minipd.control.limits import max_frame_bytes
from minipd.control.messages import PROTOCOL_VERSION, Fingerprint, GetStats, Hello, Message, Stats, Welcome
from minipd.control.role import Role
from minipd.control.server import ControlServer
from minipd.entrypoints.registration import register
from minipd.models.arch.model_config import preset_config
from transports.shared_secret import SharedSecret

LOCALHOST = "127.0.0.1"
MAX_MODEL_LEN = 512
NUM_BLOCKS = 256
BLOCK_SIZE = 16
REGISTER_TIMEOUT_S = 60.0


def fake_fingerprint(model: str = "tiny") -> Fingerprint:
    return Fingerprint(
        protocol_version=PROTOCOL_VERSION,
        model=preset_config(model),
        weights_digest="fake-instance",
        dtype="float32",
        block_size=BLOCK_SIZE,
        kv_layout="fake",
    )


class FakeInstance(ControlServer):
    """A control port that welcomes routers and answers GetStats; every other message is ignored."""

    def __init__(self, index: int, role: Role, secret: SharedSecret, fingerprint: Fingerprint):
        self.instance_id = f"fake-{role.value}-{index}"
        super().__init__(self.instance_id, secret)
        self.index, self.role, self.fingerprint = index, role, fingerprint
        self.num_polls = 0

    def welcome(self, hello: Hello) -> Welcome:
        return Welcome(
            instance_id=self.instance_id,
            role=self.role,
            fingerprint=self.fingerprint,
            transport="tcp",
            model_name="tiny",
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=8,
            compute=f"fake/{self.instance_id}",
        )

    def refuses_role(self, role: Role) -> str | None:
        return None if role is Role.ROUTER else "only a router may connect to an instance"

    def max_frame_bytes(self) -> int:
        return max_frame_bytes(MAX_MODEL_LEN)

    async def handle(self, channel: Channel, message: Message) -> None:
        if isinstance(message, GetStats):
            self.num_polls += 1
            used = (7 * self.index + self.num_polls) % (NUM_BLOCKS // 2)  # figures that move
            channel.reply(
                message,
                Stats(
                    instance_id=self.instance_id,
                    role=self.role,
                    num_running=used % 4,
                    num_waiting=0,
                    num_free_blocks=NUM_BLOCKS - used,
                    num_used_blocks=used,
                    num_cached_blocks=0,
                    num_blocks=NUM_BLOCKS,
                    num_steps=self.num_polls,
                ),
            )

    async def abort_request(self, request_id: str) -> None:
        pass


class FakeFleet:
    """`num` fake instances (half prefill, half decode) registered with the router whose control
    port is `router`; `close()` ends them all."""

    def __init__(self, router: tuple[str, int], num: int, secret: SharedSecret):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-instances", daemon=True)
        self._thread.start()
        self.instances: list[FakeInstance] = []
        fingerprint = fake_fingerprint()

        async def start() -> None:
            for i in range(num):
                role = Role.PREFILL if i % 2 == 0 else Role.DECODE
                instance = FakeInstance(i, role, secret, fingerprint)
                await instance.serve(LOCALHOST, 0)
                self.instances.append(instance)
                await register(router, role, LOCALHOST, instance.port, secret, REGISTER_TIMEOUT_S)

        try:
            asyncio.run_coroutine_threadsafe(start(), self._loop).result(REGISTER_TIMEOUT_S * 2)
        except BaseException:
            self.close()
            raise

    @property
    def num_polls(self) -> int:
        return sum(i.num_polls for i in self.instances)

    def close(self) -> None:
        async def stop() -> None:
            for instance in self.instances:
                await instance.close_connections()

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
