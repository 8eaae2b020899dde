"""A `ServingBackend` that serves no request: for tests of an HTTP front's routes and guards,
which need a ready backend but never generate (`submit` fails the test)."""

from __future__ import annotations

from minipd.models.tokenizers.tokenizer import ByteTokenizer


class NoRequests:
    model_name = "m"
    tokenizer = ByteTokenizer()
    max_model_len = 64
    vocab_size = 0

    def submit(self, prompt, request_id, *, traceparent=None):
        raise AssertionError("no request reaches the backend in these tests")

    async def ready(self) -> bool:
        return True

    def instance_stats(self) -> list:
        return []

    def num_waiting(self) -> int:
        return 0

    def on_transfer_failure(self, callback) -> None:
        pass
