"""Incremental detokenization with stop strings.

The whole output is decoded again after each token (cheap at this scale, and exact for
tokenizers whose pieces merge across tokens). Streamed text holds back a possible partial
stop string and an unfinished UTF-8 sequence (a trailing U+FFFD), so nothing sent is ever
taken back.
"""

from __future__ import annotations

from minipd.engine.request import FinishReason, Request
from minipd.models.tokenizers.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def update(
        self, request: Request, token: int, is_stop_token: bool, stops_active: bool = True
    ) -> FinishReason | None:
        """Account for `token` (already appended); returns STOP when a stop condition is met.
        Stop strings are looked for only when `stops_active` (min_tokens reached)."""
        if is_stop_token:
            return FinishReason.STOP
        previous_len = len(request.output_text)
        request.output_text = self.tokenizer.decode(request.output_token_ids)
        stops = request.sampling.stop
        if not stops or not stops_active:
            return None
        search_from = max(0, previous_len - max(map(len, stops)) + 1)
        hits = [i for i in (request.output_text.find(s, search_from) for s in stops) if i >= 0]
        if hits:
            request.output_text = request.output_text[: min(hits)]
            return FinishReason.STOP
        return None

    @staticmethod
    def take_text(request: Request, finished: bool) -> str:
        """Text not yet streamed that can no longer change."""
        text = request.output_text
        limit = len(text)
        if not finished:
            if request.sampling.stop:
                limit -= max(map(len, request.sampling.stop)) - 1
            while limit > request.num_text_sent and text[limit - 1] == REPLACEMENT_CHAR:
                limit -= 1
        if limit <= request.num_text_sent:
            return ""
        out = text[request.num_text_sent : limit]
        request.num_text_sent = limit
        return out
