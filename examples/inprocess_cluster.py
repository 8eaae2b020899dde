"""A whole disaggregated cluster inside one asyncio program."""

import asyncio

from minipd import EngineConfig, InProcessCluster, SamplingParams


async def main() -> None:
    config = EngineConfig.of(model="tiny", num_blocks=256, max_model_len=512)
    # One prefill and one decode engine in this process; the control plane runs over TCP on
    # 127.0.0.1 and the KV moves through the loopback transport.
    async with await InProcessCluster.start(config, num_prefill=1, num_decode=1) as cluster:
        prompt = "Prefill is compute-bound; decode is bandwidth-bound. " * 2
        async for out in cluster.generate(prompt, SamplingParams(max_tokens=8, temperature=0)):
            if out.finished:
                t = out.transfer
                print(
                    f"{out.num_output_tokens} tokens; KV {t.prefill_instance} -> {t.decode_instance}: "
                    f"{t.num_bytes} bytes, exposed {t.exposed_s * 1e3:.2f} ms"
                )
        for instance in cluster.instances:
            print(instance.instance_id, instance.stats().num_used_blocks, "blocks in use")


if __name__ == "__main__":
    asyncio.run(main())
