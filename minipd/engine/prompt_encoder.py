"""Prompt tokenization off the event loop.

Tokenizing is CPU work proportional to the prompt: a few-megabyte prompt takes tens of
milliseconds with the byte tokenizer and seconds with a BPE one, during which an event loop
that did it itself would relay no token of any other stream. Servers therefore tokenize (and
render chat templates) on a small pool of worker threads. The Rust tokenizers release the GIL
while they encode (see `HFTokenizer.encode`), so the loop keeps running meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Callable, Sequence, TypeVar

from minipd.engine.checked_prompt import CheckedPrompt, check_prompt
from minipd.engine.sampling_params import SamplingParams
from minipd.models.tokenizers.tokenizer import Tokenizer

# Two, so one huge prompt does not hold up every other request's tokenization; more would
# only compete with the compute thread for cores.
NUM_TOKENIZER_THREADS = 2

T = TypeVar("T")


class PromptEncoder:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._executor = concurrent.futures.ThreadPoolExecutor(
            NUM_TOKENIZER_THREADS, thread_name_prefix="minipd-tokenize"
        )

    async def run(self, fn: Callable[..., T], *args) -> T:
        """`fn(*args)` on a tokenizer thread (for work that renders and encodes at once)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def check(
        self, prompt: str | Sequence[int], params: SamplingParams | None, vocab_size: int, max_model_len: int
    ) -> CheckedPrompt:
        """`checked_prompt.check_prompt` on a tokenizer thread: the prompt validated once, or
        InvalidRequestError naming the bad field."""
        return await self.run(check_prompt, self.tokenizer, prompt, params, vocab_size, max_model_len)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
