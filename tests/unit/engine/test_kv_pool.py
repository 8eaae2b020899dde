"""The host KV pool allocation: shape, dtype, zeroes, alignment, and that it is what the
engine uses."""

from __future__ import annotations

import pytest
import torch

from minipd.engine.kv_pool import HUGE_PAGE_BYTES, allocate_host_tensor, allocate_kv_pool, kv_pool_shape
from minipd.models.arch.model_config import preset_config


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_host_tensor_is_zeroed_aligned_contiguous_and_writable(dtype):
    shape = (4, 37, 2, 16, 2, 32)
    pool = allocate_host_tensor(shape, dtype)
    assert pool.shape == shape and pool.dtype == dtype and pool.is_contiguous()
    assert pool.data_ptr() % HUGE_PAGE_BYTES == 0
    assert not pool.view(-1).view(torch.uint8).any()
    pool[3, 36] = 1.5  # the last block belongs to the tensor, not to the alignment slack
    assert float(pool.sum()) == 1.5 * pool[3, 36].numel()


def test_tensor_outlives_every_other_reference():
    pool = allocate_host_tensor((1024, 1024), torch.float32)
    view = pool[512:]
    del pool
    view.fill_(2.0)  # would fault if the numpy backing had been freed with `pool`
    assert float(view[-1, -1]) == 2.0


def test_cpu_kv_pool_uses_the_host_allocation():
    config = preset_config("tiny")
    pool = allocate_kv_pool(config, 10, 16, torch.float32, torch.device("cpu"))
    assert pool.shape == kv_pool_shape(config, 10, 16)
    assert pool.data_ptr() % HUGE_PAGE_BYTES == 0
