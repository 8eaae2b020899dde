"""SmolLM2-135M-Instruct from its GGUF, served by minipd, against transformers' load of the same
file: logits, greedy tokens, a chat answer through the engine, and bf16 drift against fp32."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import complete, complete_all, greedy
from gguf_helpers import PROSE, SMOLLM2, requires_smollm2, smollm2_dir

from minipd.api.chat_template import ChatTemplate
from minipd.api.protocol import ChatMessage
from minipd.engine.model_loader import load_model
from minipd.engine.sampling_params import SamplingParams

pytestmark = requires_smollm2

LOGITS_TOLERANCE = 1e-3
GREEDY_TOKENS = 32
QUESTION = "What is the capital of France? Answer in one sentence."
ANSWER_MAX_TOKENS = 32
TEACHER_FORCED_POSITIONS = 256
MIN_BF16_AGREEMENT = 0.95
PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea. The waves roll in, the gulls cry out, and the",
    (
        "Prefill is compute-bound; decode is bandwidth-bound. A serving engine that splits the two phases "
        "across machines must move the KV cache from one to the other, layer by layer, while the next layer "
        "computes. Explain, step by step, why this hides the transfer time, and when it does not: "
    )
    * 3,
]


@pytest.fixture(scope="module")
def theirs():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2.file, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine(model="smollm2", dtype="float32", num_blocks=128, max_model_len=1024, weights="dense")


def _their_greedy(model, ids: list[int], steps: int) -> list[int]:
    """transformers' `generate`, greedy, `steps` tokens whatever they are (no stop at EOS)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            do_sample=False,
            max_new_tokens=steps,
            min_new_tokens=0,
            eos_token_id=None,
            pad_token_id=model.config.eos_token_id,
        )
    return out[0, len(ids) :].tolist()


def test_logits_and_greedy_tokens_match_transformers(engine, theirs, loop_thread):
    prompt_ids = [engine.tokenizer.encode(p) for p in PROMPTS]
    assert len({len(ids) for ids in prompt_ids}) == 3 and max(map(len, prompt_ids)) > 100
    for ids in prompt_ids:
        ours = engine.run_on_compute_thread(engine.model.forward_reference, torch.tensor(ids))
        with torch.no_grad():
            expected = theirs(torch.tensor([ids])).logits[0]
        assert (ours - expected).abs().max().item() <= LOGITS_TOLERANCE
    results = loop_thread.run(complete_all(engine, prompt_ids, greedy(GREEDY_TOKENS)))
    for ids, result in zip(prompt_ids, results):
        assert result.token_ids == _their_greedy(theirs, ids, GREEDY_TOKENS)


def test_the_engine_answers_a_chat_question_like_transformers(engine, theirs, loop_thread):
    messages = [ChatMessage("user", QUESTION)]
    prompt = ChatTemplate.for_tokenizer(engine.tokenizer).render(messages, add_generation_prompt=True)
    answer = loop_thread.run(complete(engine, prompt, SamplingParams(max_tokens=ANSWER_MAX_TOKENS, temperature=0)))
    assert "Paris" in answer.text and answer.finish_reason == "stop"
    prompt_ids = engine.tokenizer.encode(prompt)
    with torch.no_grad():
        generated = theirs.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=ANSWER_MAX_TOKENS)
    assert answer.token_ids == generated[0, len(prompt_ids) :].tolist()


def test_bf16_greedy_next_token_agrees_with_fp32(engine):
    bf16, _ = load_model("smollm2", torch.device("cpu"), torch.bfloat16, weights="dense")
    assert bf16.model.embed_tokens.weight.dtype == torch.bfloat16
    ids = torch.tensor(engine.tokenizer.encode(PROSE)[:TEACHER_FORCED_POSITIONS])
    assert len(ids) == TEACHER_FORCED_POSITIONS
    fp32_next = engine.run_on_compute_thread(engine.model.forward_reference, ids).argmax(-1)
    bf16_next = engine.run_on_compute_thread(bf16.forward_reference, ids).argmax(-1)
    agreement = (fp32_next == bf16_next).float().mean().item()
    assert agreement >= MIN_BF16_AGREEMENT, f"bf16 agrees with fp32 on {agreement:.1%} of positions"
