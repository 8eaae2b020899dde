"""Turns a scheduled step into model inputs, runs the forward pass and samples.

`execute` runs on the engine's single compute thread. It only reads the requests it is given
(token ids, block ids, progress); the event loop does not mutate them while a step runs.

Weights served "mixed" (4-bit plus a dense copy, quantized_linear.py): the prompt rows of a
request whose prompt has at least `dense_min_prompt` tokens go through the dense copy, each
chunk in a matmul of its own; decode rows, recomputed output rows (after a preemption) and
short prompts read the 4-bit weights, as they did when first computed. The choice is per
request, not per chunk size: a colocated step's token budget is shared with its decodes, so
the same prompt is chunked differently there and on a prefill instance, and a short tail chunk
must not switch format. Nothing else that shares the step changes a row's result, so a
colocated step that mixes a prefill chunk with decodes computes each row as a prefill instance
(its chunks alone) and a decode instance (its decodes alone) would.

Decode rows (one new token of a request past its prompt) go through the fused decode step
(models/kernel_steps/fused_decode.py) where the model allows it and `fused_decode` is on: a float32 or
bfloat16 model whose projections and lm_head are all in GGUF's blocks. Its rows are close to, not bit-equal
to, the eager path's, so every decode row of such an engine takes it, in decode-only steps and
beside prefill chunks alike (those run eagerly, apart): a row is computed the same way on a
colocated instance as on a decode instance.

Eager steps (prefill chunks and the rows the fused step does not take) run their norms, SiLU and
prefill attention through minipd's float32 kernels (models/kernel_steps/prefill_kernels.py) where the model
allows it and `prefill_kernels` is on (float32 on the CPU, weights multiplied by minipd's int8
kernels); a row's result there does not depend on the chunks, so a prompt prefilled in other
chunks, or after a cached prefix, gets the same bits.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import torch

from minipd.engine.decode_groups import split_by_length
from minipd.engine.min_tokens import suppress_stop_tokens
from minipd.engine.sampler import SamplingFailed, sample
from minipd.engine.scheduler import ScheduledChunk
from minipd.engine.window_masks import chunk_window_mask, decode_window_mask
from minipd.models.arch.llama import LayerHook, LlamaForCausalLM
from minipd.models.arch.paged_attention import AttentionMetadata, DecodeGroup, GatherBuffers, PrefillSpan, slot_rows
from minipd.models.kernel_steps.fused_decode import FusedDecode
from minipd.models.kernel_steps.prefill_kernels import PrefillKernels
from minipd.models.weights.row_split import DENSE_MIN_ROWS, RowSplit

log = logging.getLogger(__name__)


class StepFailed(Exception):
    """The forward pass failed for a chunk, run alone too; returned (not raised) by `execute`."""


ChunkResult = int | None | SamplingFailed | StepFailed


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_pool: torch.Tensor,
        eos_token_ids: frozenset[int] = frozenset(),
        fused_decode: bool = True,
        prefill_kernels: bool = True,
    ):
        self.model = model
        # The fused decode step for this model, where it can run it (else every row runs eagerly).
        self.fused = FusedDecode.of(model) if fused_decode else None
        # minipd's float32 prefill kernels where they run this model (else torch's ops and SDPA).
        self.prefill = PrefillKernels.of(model, kv_pool.dtype) if prefill_kernels else None
        self.eos_token_ids = eos_token_ids  # masked while a request is below its min_tokens
        self.kv_pool = kv_pool
        self.device = kv_pool.device
        self.block_size = kv_pool.shape[3]
        self.buffers = GatherBuffers(tuple(kv_pool.shape[3:]), kv_pool.dtype, self.device)
        # Prompts from this many tokens on prefill through the dense copies (see the module
        # docstring). At most a block: every prompt that fills a block (and so can be found in
        # the prefix cache) goes dense, so a cached block was computed as it would be again.
        self.dense_min_prompt = min(DENSE_MIN_ROWS, self.block_size)

    def execute(self, chunks: Sequence[ScheduledChunk], layer_hook: LayerHook | None = None) -> list[ChunkResult]:
        """Run one step; one result per chunk, in order: the sampled token of a chunk that
        samples, None for one that does not, or the exception that failed it.

        One request never fails the others of its step. A row whose sampling fails is that
        row's `SamplingFailed`. If the forward pass fails, each chunk runs again alone, and only
        one that fails alone too gets a `StepFailed`; this is safe because a failed step advanced
        no request, and running a chunk again rewrites the same KV slots. A chunk whose KV
        streams out fails at once instead: its sink may have sent layers of the failed step.
        """
        try:
            return self._run(chunks, layer_hook)
        except Exception as exc:
            if len(chunks) == 1:
                return [StepFailed(f"engine step failed: {type(exc).__name__}: {exc}")]
            log.exception("engine step of %d chunks failed; running them one by one", len(chunks))
        results: list[ChunkResult] = []
        for chunk in chunks:
            if chunk.request.kv_sink is not None:
                results.append(StepFailed("engine step failed while its KV streamed out"))
                continue
            try:
                results += self._run([chunk], None)
            except Exception as alone:
                log.exception("request %s failed alone too", chunk.request.request_id)
                results.append(StepFailed(f"engine step failed: {type(alone).__name__}: {alone}"))
        return results

    def _run(self, chunks: Sequence[ScheduledChunk], layer_hook: LayerHook | None) -> list[ChunkResult]:
        fused = [i for i, c in enumerate(chunks) if self.fused is not None and _is_decode_row(c)]
        if not fused:
            return self._run_eager(chunks, layer_hook)
        results: list[ChunkResult] = [None] * len(chunks)
        fused_rows = set(fused)
        rest = [i for i in range(len(chunks)) if i not in fused_rows]
        if rest:  # prefill chunks (and their KV streams) first, as the eager order has them
            for i, result in zip(rest, self._run_eager([chunks[i] for i in rest], layer_hook)):
                results[i] = result
        for i, result in zip(fused, self._run_fused([chunks[i] for i in fused])):
            results[i] = result
        return results

    def _run_fused(self, chunks: Sequence[ScheduledChunk]) -> list[ChunkResult]:
        """Decode rows through the fused step: every chunk one new token past its prompt."""
        requests = [c.request for c in chunks]
        positions = [r.num_computed_tokens for r in requests]
        num_blocks = [p // self.block_size + 1 for p in positions]
        width = max(num_blocks)
        tables = [r.block_ids[:n] + [0] * (width - n) for r, n in zip(requests, num_blocks)]
        as_tensor = _long_tensor_factory(self.device)
        ids = as_tensor([r.token_ids[p] for r, p in zip(requests, positions)])
        logits = self.fused(
            ids, as_tensor(positions), as_tensor([b for t in tables for b in t]).view(-1, width), self.kv_pool
        )
        params, steps = [r.sampling for r in requests], [r.num_output_tokens for r in requests]
        return sample(suppress_stop_tokens(logits, params, steps, self.eos_token_ids), params, steps)

    def _run_eager(self, chunks: Sequence[ScheduledChunk], layer_hook: LayerHook | None) -> list[ChunkResult]:
        ordered = sorted(range(len(chunks)), key=lambda i: _step_order(chunks[i]))
        input_ids, positions, meta, logit_rows, rows = self._prepare([chunks[i] for i in ordered])
        logits_indices = [row for i, row in zip(ordered, logit_rows) if chunks[i].samples]
        sampled_order = [i for i in ordered if chunks[i].samples]
        index = torch.tensor(logits_indices, dtype=torch.long, device=self.device)
        logits = self.model(
            input_ids, positions, self.kv_pool, meta, index, self.buffers, layer_hook, rows, self.prefill
        )
        requests = [chunks[i].request for i in sampled_order]
        params, steps = [r.sampling for r in requests], [r.num_output_tokens for r in requests]
        tokens = sample(suppress_stop_tokens(logits, params, steps, self.eos_token_ids), params, steps)
        by_chunk = dict(zip(sampled_order, tokens))
        return [by_chunk.get(i) for i in range(len(chunks))]

    def _prepare(self, chunks: Sequence[ScheduledChunk]):
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slot_blocks: list[int] = []
        slot_offsets: list[int] = []
        logit_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefill_specs: list[tuple[int, int, int, list[int]]] = []
        dense_rows: list[tuple[int, int]] = []
        for request, num_new, _ in chunks:
            start = request.num_computed_tokens
            end = start + num_new
            query_start = len(input_ids)
            input_ids.extend(request.token_ids[start:end])
            positions.extend(range(start, end))
            blocks = request.block_ids
            slot_blocks.extend(blocks[p // bs] for p in range(start, end))
            slot_offsets.extend(p % bs for p in range(start, end))
            logit_rows.append(len(input_ids) - 1)
            num_prompt_rows = min(end, request.num_prompt_tokens) - start
            if num_prompt_rows > 0 and request.num_prompt_tokens >= self.dense_min_prompt:
                dense_rows.append((query_start, query_start + num_prompt_rows))
            num_ctx_blocks = -(-end // bs)
            if num_new == 1:
                decode_tables.append(blocks[:num_ctx_blocks])
                decode_lens.append(end)
            else:
                prefill_specs.append((query_start, num_new, end, blocks[:num_ctx_blocks]))
        meta = self._metadata(slot_blocks, slot_offsets, decode_tables, decode_lens, prefill_specs)
        as_tensor = _long_tensor_factory(self.device)
        return as_tensor(input_ids), as_tensor(positions), meta, logit_rows, RowSplit.of(dense_rows, len(input_ids))

    def _metadata(self, slot_blocks, slot_offsets, decode_tables, decode_lens, prefill_specs) -> AttentionMetadata:
        as_tensor = _long_tensor_factory(self.device)
        groups = tuple(
            self._decode_group(start, decode_tables[start:end], decode_lens[start:end])
            for start, end in split_by_length([len(t) for t in decode_tables])
        )
        prefills = tuple(
            PrefillSpan(
                q_start, q_len, ctx_len, as_tensor(blocks), _chunk_mask(q_len, ctx_len, self.block_size, self.device)
            )
            for q_start, q_len, ctx_len, blocks in prefill_specs
        )
        meta = AttentionMetadata(
            as_tensor(slot_rows(slot_blocks, slot_offsets, self.block_size)), len(decode_tables), groups, prefills
        )
        window = self.model.config.sliding_window
        return meta if window is None else self._sliding(meta, window, decode_lens, prefill_specs)

    def _sliding(self, meta: AttentionMetadata, window: int, decode_lens, prefill_specs) -> AttentionMetadata:
        """`meta` plus its sliding-window variant (window_masks.py) for a model's sliding layers."""
        bs, device = self.block_size, self.device
        groups = tuple(
            g._replace(
                mask=decode_window_mask(decode_lens[g.start : g.start + g.count], g.max_blocks, bs, window, device)
            )
            for g in meta.decode_groups
        )
        prefills = tuple(
            span._replace(mask=chunk_window_mask(q_len, ctx_len, bs, window, device))
            for span, (_, q_len, ctx_len, _) in zip(meta.prefills, prefill_specs)
        )
        return meta._replace(sliding=meta._replace(decode_groups=groups, prefills=prefills))

    def _decode_group(self, start: int, tables: list[list[int]], lens: list[int]) -> DecodeGroup:
        """Decodes [start, start + len(tables)), sorted by context length (the last is the longest)."""
        max_blocks = len(tables[-1])
        flat_table = [b for t in tables for b in t + [t[0]] * (max_blocks - len(t))]
        mask = None
        if any(n != max_blocks * self.block_size for n in lens):
            key_pos = torch.arange(max_blocks * self.block_size, device=self.device)
            lengths = _long_tensor_factory(self.device)(lens)
            mask = (key_pos[None, :] < lengths[:, None]).view(len(tables), 1, 1, -1)
        return DecodeGroup(start, len(tables), _long_tensor_factory(self.device)(flat_table), max_blocks, mask)


def _is_decode_row(chunk: ScheduledChunk) -> bool:
    """One new token past the prompt, sampled: a decode step's row (not a prompt's last token,
    nor output tokens recomputed as a chunk after a preemption)."""
    request = chunk.request
    return chunk.num_new_tokens == 1 and chunk.samples and request.num_computed_tokens >= request.num_prompt_tokens


def _step_order(chunk: ScheduledChunk) -> tuple[bool, int]:
    """Decodes first, shortest context first (so similar lengths can attend together, see
    decode_groups.py); prefill chunks after them, in their order (the sort is stable)."""
    is_decode = chunk.num_new_tokens == 1
    return not is_decode, chunk.request.num_computed_tokens if is_decode else 0


def _chunk_mask(query_len: int, context_len: int, block_size: int, device: torch.device) -> torch.Tensor | None:
    """Causal mask for a chunk that follows `context_len - query_len` cached tokens, over the
    chunk's queries and its keys each padded to whole blocks (`paged_attention` pads them so:
    see there why); None for a chunk with no cached tokens before it (plain causal)."""
    if query_len == context_len:
        return None
    offset = context_len - query_len
    q = torch.arange(_whole_blocks(query_len, block_size), device=device)[:, None]
    k = torch.arange(_whole_blocks(context_len, block_size), device=device)[None, :]
    return k <= q + offset  # a real query sees no padded key; a padded one sees key 0 at least


def _whole_blocks(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size) * block_size


def _long_tensor_factory(device: torch.device) -> Callable[[list[int]], torch.Tensor]:
    def as_tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)

    return as_tensor
