"""The control plane's handshake with the cluster secret: a wrong or missing secret is refused
on either side with a message saying which, an impersonating server is caught by its proof,
and a process without the secret can neither reserve blocks, nor write KV, nor register, nor
send requests; roles are enforced after the handshake too."""

from __future__ import annotations

import asyncio
import struct

import msgspec
import pytest
import torch
from tcp_cluster import CONFIG, LOCALHOST, OTHER_SECRET, SECRET, TcpCluster

from minipd.control.channel import RemoteError
from minipd.control.handshake import AuthenticationError, open_channel
from minipd.control.limits import max_frame_bytes
from minipd.control.messages import PROTOCOL_VERSION, ClientGenerate, GetStats, Hello, Prove, Register, Reserve, Welcome
from minipd.control.role import Role
from minipd.control.server import ControlServer
from minipd.disagg.instance import Instance
from minipd.engine.engine import Engine
from minipd.router.cluster_client import ClusterClient
from minipd.router.control_port import RouterControlPort
from minipd.router.router import Router
from minipd.transports import wire as kv
from minipd.transports.shared_secret import NONCE_BYTES, new_nonce

TIMEOUT_S = 10.0
START_TIMEOUT_S = 180.0
HEADER = struct.Struct(">I")


@pytest.fixture(scope="module")
def cluster(loop_thread):
    cluster = loop_thread.run(TcpCluster.start(SECRET), timeout=START_TIMEOUT_S)
    yield cluster
    loop_thread.run(cluster.close())


@pytest.fixture(scope="module")
def router_port(cluster, loop_thread):
    server = RouterControlPort(cluster.router)
    loop_thread.run(server.serve(LOCALHOST, 0))
    yield server.port
    loop_thread.run(server.close())


@pytest.fixture(autouse=True)
def nothing_left_behind(cluster, loop_thread):
    yield
    loop_thread.run(cluster.assert_pools_free())
    assert sorted(cluster.router.registry.instances) == ["decode-0", "prefill-0"]


def _frame(message) -> bytes:
    payload = msgspec.msgpack.encode(message)
    return HEADER.pack(len(payload)) + payload


async def _raw_exchange(port: int, *messages) -> tuple[bytes, bool]:
    """Send `messages` on a raw connection; returns everything the server sent and whether it
    then hung up."""
    reader, writer = await asyncio.open_connection(LOCALHOST, port)
    for message in messages:
        writer.write(message if isinstance(message, bytes) else _frame(message))
    await writer.drain()
    try:
        received = await asyncio.wait_for(reader.read(), TIMEOUT_S)
        closed = True
    except asyncio.TimeoutError:
        received, closed = b"", False
    writer.close()
    return received, closed


def _messages(data: bytes) -> list[str]:
    """The control messages in `data`, as `type: message` strings."""
    out = []
    while len(data) >= HEADER.size:
        (length,) = HEADER.unpack_from(data)
        body = msgspec.msgpack.decode(data[HEADER.size : HEADER.size + length])
        out.append(f"{body['type']}: {body.get('message', '')}")
        data = data[HEADER.size + length :]
    return out


@pytest.mark.parametrize(
    "router_secret, words",
    [
        (None, "requires the cluster secret and this process has none"),
        (OTHER_SECRET, "secrets of decode-0 and the peer differ"),
    ],
    ids=["missing", "wrong"],
)
def test_a_router_without_the_secret_is_refused(cluster, loop_thread, router_secret, words):
    async def connect():
        router = Router(cluster.decode.engine.tokenizer, secret=router_secret)
        try:
            with pytest.raises(AuthenticationError) as refused:
                await router.add_instance(LOCALHOST, cluster.decode.port, TIMEOUT_S)
            return str(refused.value), router.registry.instances
        finally:
            await router.close()

    message, registered = loop_thread.run(connect())
    assert words in message and f"{LOCALHOST}:{cluster.decode.port}" in message
    assert registered == {}


def test_a_router_with_a_secret_refuses_an_instance_without_one(loop_thread):
    async def connect():
        instance = await Instance.create(Engine(CONFIG), Role.DECODE, "open-decode", "tcp", "tiny", {"host": LOCALHOST})
        await instance.serve(LOCALHOST, 0)
        router = Router(instance.engine.tokenizer, secret=SECRET)
        try:
            with pytest.raises(AuthenticationError) as refused:
                await router.add_instance(LOCALHOST, instance.port, TIMEOUT_S)
            return str(refused.value)
        finally:
            await router.close()
            await instance.close()

    assert "has no cluster secret configured and this process has one" in loop_thread.run(connect())


class _Impostor(ControlServer):
    """Answers the challenge like a real instance but cannot prove the secret: it accepts any
    client proof and answers with a made-up one."""

    def __init__(self, welcome: Welcome):
        super().__init__("impostor", SECRET)
        self._welcome = welcome

    def welcome(self, hello) -> Welcome:
        return msgspec.structs.replace(self._welcome)

    def refuses_role(self, role: Role) -> str | None:
        return None

    def max_frame_bytes(self) -> int:
        return 1 << 20

    def _on_prove(self, channel, prove, pending) -> None:
        del self._pending[channel]
        self._establish(channel, pending.hello, prove, pending.nonce)

    def prove(self, welcome, hello, server_nonce) -> bytes:
        return new_nonce()  # not a proof of anything

    async def handle(self, channel, message) -> None:
        pass

    async def abort_request(self, request_id: str) -> None:
        pass


def test_a_server_that_cannot_prove_the_secret_is_not_trusted(cluster, loop_thread):
    async def connect():
        impostor = _Impostor(cluster.decode.welcome(Hello(protocol_version=PROTOCOL_VERSION, role=Role.ROUTER)))
        await impostor.serve(LOCALHOST, 0)
        router = Router(cluster.decode.engine.tokenizer, secret=SECRET)
        try:
            with pytest.raises(AuthenticationError) as refused:
                await router.add_instance(LOCALHOST, impostor.port, TIMEOUT_S)
            return str(refused.value), router.registry.instances
        finally:
            await router.close()
            await impostor.close_connections()

    message, registered = loop_thread.run(connect())
    assert "does not know the cluster secret" in message and registered == {}


def test_an_unauthenticated_process_cannot_reserve_blocks(cluster, loop_thread):
    reserve = Reserve(request_id="grab", token_ids=list(range(60)), prefill_instance="nobody", call_id=2)

    async def attempts():
        no_handshake = await _raw_exchange(cluster.decode.port, reserve)
        no_nonce = await _raw_exchange(
            cluster.decode.port, Hello(protocol_version=PROTOCOL_VERSION, role=Role.ROUTER, call_id=1), reserve
        )
        bad_proof = await _raw_exchange(
            cluster.decode.port,
            Hello(protocol_version=PROTOCOL_VERSION, role=Role.ROUTER, nonce=new_nonce(), call_id=1),
            Prove(proof=b"\0" * 32, call_id=2),
            reserve,
        )
        return no_handshake, no_nonce, bad_proof, cluster.decode.stats()

    no_handshake, no_nonce, bad_proof, stats = loop_thread.run(attempts())
    assert no_handshake[1] and "before the handshake completed" in _messages(no_handshake[0])[0]
    assert no_nonce[1] and "requires the cluster secret" in _messages(no_nonce[0])[0]
    assert bad_proof[1] and [m.split(":")[0] for m in _messages(bad_proof[0])] == ["challenge", "error"]
    assert "wrong proof of the cluster secret" in _messages(bad_proof[0])[1]
    assert stats.num_reservations == 0 and stats.num_used_blocks == 0


def test_an_unauthenticated_process_cannot_write_kv(cluster, loop_thread):
    """Even naming the real prefill instance, on the real KV port, while a real reservation for
    it exists: the link is refused before any header is read."""
    pool = cluster.decode.engine.kv_pool
    block_bytes = pool[0, 0].numel() * pool.element_size()

    async def attempt():
        router_side = cluster.router.registry.instances["decode-0"].channel
        reserved = await router_side.call(
            Reserve(request_id="held", token_ids=list(range(40)), prefill_instance="prefill-0")
        )
        before = pool.clone()
        reader, writer = await asyncio.open_connection(*cluster.kv_address())
        hello = kv.Hello("prefill-0", pool.shape[0], block_bytes, new_nonce(), b"\0" * 32)
        header = kv.LayerHeader(
            "held", 0, [(b, 1) for b in reserved.dst_block_ids], len(reserved.dst_block_ids) * block_bytes
        )
        for message in (hello, header):
            encoded = msgspec.msgpack.encode(message)
            writer.write(struct.pack("!I", len(encoded)) + encoded)
        await writer.drain()  # the payload is not sent: the refusal must not need it
        answer = await asyncio.wait_for(reader.read(), TIMEOUT_S)
        writer.close()
        written = not torch.equal(pool.view(torch.uint8), before.view(torch.uint8))
        await cluster.decode.abort_request("held")
        return answer, written

    answer, written = loop_thread.run(attempt())
    assert b"refused" in answer and b"proof of the cluster secret is wrong" in answer
    assert not written


def test_an_unauthenticated_process_cannot_register_or_send_requests(cluster, router_port, loop_thread):
    register = Register(host=LOCALHOST, port=cluster.prefill.port, call_id=2)
    generate = ClientGenerate(request_id="x", token_ids=list(range(30)))

    async def attempts():
        raw_register = await _raw_exchange(router_port, register)
        raw_generate = await _raw_exchange(router_port, generate)
        without = []
        for secret in (None, OTHER_SECRET):
            with pytest.raises(AuthenticationError) as refused:
                await open_channel(LOCALHOST, router_port, None, "intruder", Role.PREFILL, secret, TIMEOUT_S)
            without.append(str(refused.value))
            with pytest.raises(AuthenticationError):
                await ClusterClient.connect(LOCALHOST, router_port, TIMEOUT_S, secret=secret)
        return raw_register, raw_generate, without

    raw_register, raw_generate, without = loop_thread.run(attempts())
    assert raw_register[1] and "before the handshake completed" in _messages(raw_register[0])[0]
    assert raw_generate[1] and _messages(raw_generate[0]) == [], "nothing is generated for an unauthenticated peer"
    assert "requires the cluster secret" in without[0] and "differ" in without[1]


def test_roles_are_enforced_after_the_handshake(cluster, router_port, loop_thread):
    async def attempts():
        client = await ClusterClient.connect(LOCALHOST, router_port, TIMEOUT_S, secret=SECRET)
        try:
            with pytest.raises(RemoteError) as client_registers:
                await client.channel.call(Register(host=LOCALHOST, port=cluster.prefill.port), TIMEOUT_S)
            served = [o async for o in client.generate(list(range(30)))]
        finally:
            await client.close()
        instance, _ = await open_channel(LOCALHOST, router_port, None, "instance", Role.DECODE, SECRET, TIMEOUT_S)
        try:
            with pytest.raises(RemoteError) as instance_asks:
                await instance.call(GetStats(), TIMEOUT_S)
        finally:
            await instance.close()
        with pytest.raises(AuthenticationError) as client_to_instance:
            await open_channel(LOCALHOST, cluster.decode.port, None, "client", Role.CLIENT, SECRET, TIMEOUT_S)
        return client_registers.value, served, instance_asks.value, str(client_to_instance.value)

    client_registers, served, instance_asks, client_to_instance = loop_thread.run(attempts())
    assert client_registers.kind == "auth" and "may not register" in str(client_registers)
    assert served[-1].finished and served[-1].error is None, "an authenticated client is served"
    assert instance_asks.kind == "auth" and "only clients may" in str(instance_asks)
    assert "only a router may connect" in client_to_instance


def test_the_handshake_messages_have_fixed_sized_secrets(cluster, loop_thread):
    """A short nonce is refused (a proof over it would be weaker), and every nonce is fresh."""

    async def attempt():
        short = await _raw_exchange(
            cluster.decode.port,
            Hello(protocol_version=PROTOCOL_VERSION, role=Role.ROUTER, nonce=b"\1" * (NONCE_BYTES - 1), call_id=1),
        )
        channel, welcome = await open_channel(
            LOCALHOST, cluster.decode.port, None, "ok", Role.ROUTER, SECRET, TIMEOUT_S
        )
        await channel.close()
        return short, welcome

    short, welcome = loop_thread.run(attempt())
    assert short[1] and "sent no challenge nonce" in _messages(short[0])[0]
    assert welcome.instance_id == "decode-0" and len(welcome.proof) == 32
    assert new_nonce() != new_nonce()


def test_handshake_helper_sets_the_peer_role_and_frame_caps(cluster, loop_thread):
    async def attempt():
        channel, welcome = await open_channel(
            LOCALHOST, cluster.decode.port, None, "ok", Role.ROUTER, SECRET, TIMEOUT_S
        )
        await channel.close()
        return channel, welcome

    channel, welcome = loop_thread.run(attempt())
    assert channel.peer_role is Role.DECODE
    assert channel.max_frame_bytes == channel.max_send_bytes == max_frame_bytes(welcome.max_model_len)
