"""A migrated request's text, made by the router (router/migration.py): the engine's own
detokenizer run over the caller's whole output, the tokens relayed before the move and then
each new try's, so that text held back on the lost instance (a character's first bytes, the
start of a possible stop string) comes out once whole, and a stop string that spans the move
ends the request as it would have."""

from __future__ import annotations

from minipd.engine.detokenizer import Detokenizer
from minipd.engine.min_tokens import stops_active
from minipd.engine.request import Request
from minipd.engine.sampling_params import SamplingParams
from minipd.models.tokenizers.tokenizer import Tokenizer


class ContinuedText:
    """The caller's text from here on: what comes after the `num_text_sent` characters it has,
    of the whole output decoded (`generated`, then every token `take` is given)."""

    def __init__(self, tokenizer: Tokenizer, generated: list[int], num_text_sent: int, params: SamplingParams):
        self.detokenizer = Detokenizer(tokenizer)
        self.output = Request("migrated", [], params)  # its output: every token of the caller's request
        self.output.token_ids = list(generated)
        self.output.output_text = tokenizer.decode(self.output.token_ids)
        self.output.num_text_sent = num_text_sent

    def take(self, token_ids: list[int], finished: bool) -> tuple[str, bool]:
        """The text to relay for the new `token_ids` (`finished`: the try's last output), and
        whether a stop string ended the request on them."""
        stopped = False
        for token in token_ids:
            self.output.token_ids.append(token)
            active = stops_active(self.output.sampling, len(self.output.token_ids))
            if self.detokenizer.update(self.output, token, is_stop_token=False, stops_active=active) is not None:
                stopped = True
                break
        return Detokenizer.take_text(self.output, finished or stopped), stopped
