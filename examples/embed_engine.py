"""Embed a minipd engine in your own asyncio program."""

import asyncio

from minipd import Engine, EngineConfig, SamplingParams


async def main() -> None:
    config = EngineConfig.of(model="tiny", num_blocks=256, max_model_len=512)
    async with Engine(config) as engine:  # loads the model, starts the engine loop
        params = SamplingParams(max_tokens=16, temperature=0.8, seed=7)

        # Stream one request: each increment carries new token ids and text.
        async for out in engine.generate("Hello, minipd!", params):
            print(out.token_ids, repr(out.text), out.finish_reason or "")

        # Requests submitted together are batched together.
        async def complete(prompt: str) -> str:
            return "".join([out.text async for out in engine.generate(prompt, params)])

        texts = await asyncio.gather(*(complete(p) for p in ["one", "two", "three"]))
        print(texts)
        print(engine.stats())  # every block is free again


if __name__ == "__main__":
    asyncio.run(main())
