"""The engine on CUDA gives the same greedy tokens as on the CPU. Runs only where CUDA exists."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import complete_all, greedy

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none on this machine")


def test_cuda_engine_matches_cpu(make_engine, loop_thread):
    prompts = ["hello from the gpu", "a" * 90, "block boundary " * 4]
    cpu = make_engine(model="tiny", device="cpu", dtype="float32", num_blocks=64, max_model_len=256)
    gpu = make_engine(model="tiny", device="cuda", dtype="float32", num_blocks=64, max_model_len=256)
    on_cpu = loop_thread.run(complete_all(cpu, prompts, greedy(16)))
    on_gpu = loop_thread.run(complete_all(gpu, prompts, greedy(16)))
    assert gpu.kv_pool.is_cuda
    # fp32 on both; a near-tie could differ, so require agreement on the first tokens of each
    for c, g in zip(on_cpu, on_gpu):
        assert c.token_ids[:8] == g.token_ids[:8]
