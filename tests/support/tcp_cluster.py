"""An in-process disaggregated cluster (router, one prefill, one decode instance) whose control
plane and KV links are real tcp connections on 127.0.0.1, with or without a cluster secret:
the setup the security tests attack."""

from __future__ import annotations

from minipd.control.role import Role
from minipd.disagg.instance import Instance
from minipd.engine.engine import Engine, EngineConfig
from minipd.router.router import Router
from minipd.router.router_config import RouterConfig
from minipd.transports.shared_secret import SharedSecret

LOCALHOST = "127.0.0.1"
IDLE_TIMEOUT_S = 10.0
BLOCK_SIZE = 16
# float32: outputs are compared token for token
CONFIG = EngineConfig.of(model="tiny", dtype="float32", block_size=BLOCK_SIZE, num_blocks=64, max_model_len=256)
SECRET = SharedSecret(b"the security tests' cluster secret")
OTHER_SECRET = SharedSecret(b"a secret of another cluster entirely")


class TcpCluster:
    def __init__(self, router: Router, prefill: Instance, decode: Instance):
        self.router, self.prefill, self.decode = router, prefill, decode

    @classmethod
    async def start(
        cls,
        secret: SharedSecret | None,
        config: EngineConfig = CONFIG,
        router_config: RouterConfig | None = None,
        **instance_options,
    ) -> "TcpCluster":
        instances: list[Instance] = []
        try:
            for role in (Role.PREFILL, Role.DECODE):
                instance = await Instance.create(
                    Engine(config),
                    role,
                    f"{role.value}-0",
                    "tcp",
                    config.model,
                    {"host": LOCALHOST},
                    secret=secret,
                    **instance_options,
                )
                instances.append(instance)
                await instance.serve(LOCALHOST, 0)
            router = Router(
                instances[0].engine.tokenizer, router_config or RouterConfig(), model_name=config.model, secret=secret
            )
            for instance in instances:
                await router.add_instance(LOCALHOST, instance.port)
        except BaseException:
            for instance in instances:
                await instance.close()
            raise
        return cls(router, *instances)

    @property
    def instances(self) -> list[Instance]:
        return [self.prefill, self.decode]

    def instance(self, instance_id: str) -> Instance:
        return next(i for i in self.instances if i.instance_id == instance_id)

    def kv_address(self) -> tuple[str, int]:
        host, _, port = self.decode.transport._endpoint().decode().rpartition(":")
        return host, int(port)

    async def assert_pools_free(self) -> None:
        """No request, no reservation, no block in use on either instance."""
        for instance in self.instances:
            await instance.engine.wait_idle(IDLE_TIMEOUT_S)
            stats = instance.stats()
            assert stats.num_running == stats.num_waiting == stats.num_reservations == 0, stats
            assert stats.num_used_blocks == 0, stats

    async def close(self) -> None:
        await self.router.close()
        for instance in self.instances:
            await instance.close()
