"""Request migration: a request whose decode instance is lost after some of its tokens reached
the caller goes on from where it stopped, on another instance, within the same stream.

Off by default (`--migration-limit 0`): such a request fails with an error naming the lost
instance, as before any token it may be tried again. With `--migration-limit N` (Dynamo's name
for the same setting) up to N times per request, when the decode instance died, was declared
dead or went silent (the inter-token timeout) mid-stream, the router sends a new try whose
prompt is the original prompt followed by every token relayed so far, for the tokens left:
- `max_tokens` and `min_tokens` shrink by the tokens relayed; the caller's usage still counts
  the original prompt and every output token (the relay adds the offset, attempt.py);
- greedy requests continue exactly as an uninterrupted run would (the prompt's KV is
  recomputed, which may round differently from the decode steps that made it: an argmax that
  is a near tie can then flip; `tests/processes/test_request_migration.py` checks the tiny model
  token for token);
- a seeded sampled request continues from the seed advanced by the tokens relayed, so it stays
  reproducible for a given failure point but is not the uninterrupted run's stream;
- the caller's text is made by the router from every token (continued_text.py: the instances'
  own detokenizer, over the tokens before and after the move), not taken from the new try,
  whose instance sees the earlier tokens as prompt: text the lost instance held back (the bytes
  of a character not yet whole, the start of a possible stop string) comes out once whole, and
  a stop string that spans the move ends the request as it would have.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import msgspec

from minipd.engine.sampling_params import MAX_SEED, SamplingParams
from minipd.models.tokenizers.tokenizer import Tokenizer
from minipd.router.continued_text import ContinuedText
from minipd.router.outcome import Outcome

if TYPE_CHECKING:
    from minipd.router.attempt import AttemptFailed
    from minipd.router.routed_request import RoutedRequest
    from minipd.router.router_counters import RouterCounters

log = logging.getLogger(__name__)


def continuation(prompt: list[int], generated: list[int], params: SamplingParams) -> tuple[list[int], SamplingParams]:
    """The prompt and parameters of the try that goes on after `generated` (the tokens relayed
    so far of a request for `prompt` under `params`). ValueError when no token is left."""
    left = params.max_tokens - len(generated)
    if left <= 0:
        raise ValueError(f"generated: {len(generated)} tokens, none left of max_tokens={params.max_tokens}")
    seed = None if params.seed is None else (params.seed + len(generated)) % MAX_SEED
    moved = msgspec.structs.replace(
        params, max_tokens=left, min_tokens=max(0, params.min_tokens - len(generated)), seed=seed
    )
    return [*prompt, *generated], moved


def may_migrate(lost: bool, tokens_relayed: int, max_tokens: int, migrations: int, limit: int) -> bool:
    """Whether a failed try goes on elsewhere: its decode instance was lost (`lost`) after some
    tokens reached the caller, tokens are left, and the request has migrations left."""
    return lost and 0 < tokens_relayed < max_tokens and migrations < limit


def due(routed: RoutedRequest, failure: AttemptFailed, limit: int) -> bool:
    """`may_migrate` for `routed`, whose try ended in `failure` (one another try may fix)."""
    relayed, max_tokens = len(routed.generated), routed.original_params.max_tokens
    lost = failure.outcome is Outcome.LOST  # the only failure of a try that another try may fix mid-stream
    return may_migrate(lost, relayed, max_tokens, routed.num_migrations, limit)


def move(routed: RoutedRequest, tokenizer: Tokenizer, counters: RouterCounters) -> None:
    """Set `routed` up so that its next try goes on after the tokens relayed so far."""
    routed.token_ids, routed.params = continuation(routed.prompt_ids, routed.generated, routed.original_params)
    routed.output_offset = len(routed.generated)
    routed.num_migrations += 1
    counters.num_migrations += 1
    routed.continued_text = ContinuedText(tokenizer, routed.generated, routed.num_text_sent, routed.original_params)
    log.warning("%s: migration %d: after %d tokens", routed.request_id, routed.num_migrations, routed.output_offset)
