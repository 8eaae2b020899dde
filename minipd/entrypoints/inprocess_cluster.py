"""A whole disaggregated cluster inside one asyncio program: for embedding and tests.

Router, prefill and decode instances share the event loop; the control plane still runs
over real TCP on 127.0.0.1, and the KV moves through the loopback transport (one pool to
another by copy), so the request lifecycle is exactly the multi-process one. With `secret`,
the control plane authenticates as a multi-process cluster's does.
"""

from __future__ import annotations

from typing import Sequence

from minipd.control.role import Role
from minipd.disagg.instance import Instance
from minipd.engine.engine import Engine, EngineConfig
from minipd.engine.generator import GeneratesFromSubmit
from minipd.engine.request_stream import RequestStream
from minipd.engine.sampling_params import SamplingParams
from minipd.router.role_switch_driver import DEFAULT_DRAIN_TIMEOUT_S, SwitchReport
from minipd.router.router import Router
from minipd.router.router_config import RouterConfig
from minipd.transports.loopback_hub import LoopbackHub
from minipd.transports.shared_secret import SharedSecret

LOCALHOST = "127.0.0.1"


class InProcessCluster(GeneratesFromSubmit):
    def __init__(self, router: Router, instances: list[Instance]):
        self.router = router
        self.instances = instances

    @classmethod
    async def start(
        cls,
        config: EngineConfig = EngineConfig(),
        num_prefill: int = 1,
        num_decode: int = 1,
        router_config: RouterConfig = RouterConfig(),
        lease_s: float | None = None,
        secret: SharedSecret | None = None,
        transport_options: dict | None = None,
        kv_tier: str | None = None,
        kv_tier_fetch: str = "auto",
    ) -> "InProcessCluster":
        """`transport_options`: passed to every instance's loopback transport (e.g. `link_gbps`);
        `kv_tier`: the shared KV tier's URL every instance opens (docs/kv-tier.md), and
        `kv_tier_fetch` its fetch-or-recompute choice (`--kv-tier-fetch`)."""
        hub = LoopbackHub()
        instances: list[Instance] = []
        extra = {} if lease_s is None else {"lease_s": lease_s}
        try:
            for role, count in ((Role.PREFILL, num_prefill), (Role.DECODE, num_decode)):
                for i in range(count):
                    instance = await Instance.create(
                        Engine(config),
                        role,
                        f"{role.value}-{i}",
                        "loopback",
                        config.model,
                        {"hub": hub, **(transport_options or {})},
                        secret=secret,
                        kv_tier=kv_tier,
                        kv_tier_fetch=kv_tier_fetch,
                        **extra,
                    )
                    instances.append(instance)
                    await instance.serve(LOCALHOST, 0)
            router = Router(instances[0].engine.tokenizer, router_config, model_name=config.model, secret=secret)
            for instance in instances:
                await router.add_instance(LOCALHOST, instance.port)
        except BaseException:
            for instance in instances:
                await instance.close()
            raise
        return cls(router, instances)

    def submit(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        layerwise: bool | None = None,
    ) -> RequestStream:
        """`Router.submit` (the shape every runner of requests shares, engine/generator.py)."""
        return self.router.submit(prompt, params, request_id, layerwise=layerwise)

    async def switch_role(
        self, instance_id: str, role: Role | str, drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    ) -> SwitchReport:
        """Switch one instance's role in place, through the router (`Router.switch_role`)."""
        return await self.router.switch_role(instance_id, role, drain_timeout_s)

    def instance(self, instance_id: str) -> Instance:
        return next(i for i in self.instances if i.instance_id == instance_id)

    async def close(self) -> None:
        await self.router.close()
        for instance in self.instances:
            await instance.close()

    async def __aenter__(self) -> "InProcessCluster":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
