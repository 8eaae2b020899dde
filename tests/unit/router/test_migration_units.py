"""router/migration.py: what a migrated request's next try asks for, when a failed try may
migrate, and the caller's text made across the move (the byte tokenizer of the presets: one
id per UTF-8 byte, so a character can be split across the move)."""

from __future__ import annotations

import pytest

from minipd.engine.sampling_params import SamplingParams
from minipd.models.tokenizers.tokenizer import ByteTokenizer
from minipd.router.continued_text import ContinuedText
from minipd.router.migration import continuation, may_migrate


def test_the_next_try_asks_for_the_tokens_left_after_the_prompt_and_the_tokens_relayed():
    params = SamplingParams(max_tokens=10, min_tokens=4, seed=7, temperature=0.5)
    prompt, params_next = continuation([1, 2, 3], [40, 41, 42], params)
    assert prompt == [1, 2, 3, 40, 41, 42]
    assert (params_next.max_tokens, params_next.min_tokens, params_next.seed) == (7, 1, 10)
    assert params_next.temperature == 0.5 and params.max_tokens == 10  # the caller's are untouched
    assert continuation([1], [5] * 6, params)[1].min_tokens == 0
    assert continuation([1], [5], SamplingParams(max_tokens=3))[1].seed is None  # unseeded stays so
    with pytest.raises(ValueError, match="none left"):
        continuation([1], [5, 5, 5], SamplingParams(max_tokens=3))


@pytest.mark.parametrize(
    ("lost", "relayed", "migrations", "limit", "expected"),
    [
        (True, 5, 0, 1, True),
        (True, 5, 1, 1, False),  # its migrations used up
        (True, 5, 0, 0, False),  # off
        (False, 5, 0, 1, False),  # the instance did not die: an error it reported
        (True, 0, 0, 1, False),  # nothing relayed yet: a plain retry's case
        (True, 10, 0, 1, False),  # every token relayed
    ],
)
def test_a_try_migrates_only_when_its_instance_was_lost_mid_stream(lost, relayed, migrations, limit, expected):
    assert may_migrate(lost, relayed, 10, migrations, limit) is expected


def test_a_character_split_across_the_move_comes_out_whole():
    tokenizer = ByteTokenizer()
    e_acute = list("é".encode())  # two bytes: the lost instance held the first one back
    text = ContinuedText(tokenizer, [*b"ab", e_acute[0]], num_text_sent=2, params=SamplingParams(max_tokens=20))
    assert text.take([e_acute[1]], finished=False) == ("é", False)
    assert text.take([*b"cd"], finished=True) == ("cd", False)


def test_a_stop_string_across_the_move_ends_the_request():
    tokenizer = ByteTokenizer()
    params = SamplingParams(max_tokens=20, stop=("STOP",))
    # "xyST" relayed as tokens; the caller has "xy" (the rest could start the stop string)
    text = ContinuedText(tokenizer, list(b"xyST"), num_text_sent=2, params=params)
    assert text.take(list(b"OPzz"), finished=False) == ("", True)
    unmatched = ContinuedText(tokenizer, list(b"xyST"), num_text_sent=2, params=params)
    assert unmatched.take(list(b"ay"), finished=True) == ("STay", False)


def test_stop_strings_wait_for_min_tokens_across_the_move():
    params = SamplingParams(max_tokens=20, stop=("S",), min_tokens=5)
    text = ContinuedText(ByteTokenizer(), list(b"ab"), num_text_sent=2, params=params)
    assert text.take(list(b"S"), finished=False) == ("S", False)  # the 3rd output token: too early to stop
    assert text.take(list(b"ccS"), finished=False) == ("cc", True)  # the 6th: it stops there
