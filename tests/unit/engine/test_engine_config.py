"""`EngineConfig` holds the batching limits in one `SchedulerConfig`: the flat constructor and
`replace` route their names there, and one `validate` names the first bad field."""

from __future__ import annotations

import pytest

from minipd.engine.config import EngineConfig
from minipd.engine.scheduler import SchedulerConfig


def test_flat_names_set_the_scheduler_and_the_engine():
    config = EngineConfig.of(max_num_seqs=3, max_model_len=64, block_size=8)
    assert config.scheduler == SchedulerConfig(max_num_seqs=3, max_model_len=64)
    assert config.block_size == 8 and not hasattr(config, "max_num_seqs")
    changed = config.replace(max_num_batched_tokens=32, num_blocks=10)
    assert changed.scheduler == SchedulerConfig(max_num_seqs=3, max_model_len=64, max_num_batched_tokens=32)
    assert changed.num_blocks == 10 and config.num_blocks == EngineConfig().num_blocks


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"max_num_seqs": 0}, "max_num_seqs: must be positive"),
        ({"max_num_batched_tokens": -1}, "max_num_batched_tokens: must be positive"),
        ({"max_model_len": 1}, "max_model_len: must be > 1"),
        (
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 64, "max_model_len": 128},
            "max_num_batched_tokens:",
        ),
        ({"num_blocks": 0}, "num_blocks: must be positive"),
        ({"num_blocks": 2, "block_size": 16, "max_model_len": 64}, "must hold max_model_len"),
    ],
)
def test_validate_names_the_bad_field(fields, named):
    with pytest.raises(ValueError, match=named):
        EngineConfig.of(**fields).validate()


def test_the_scheduler_limits_are_checked_once_for_engine_and_scheduler():
    limits = SchedulerConfig(max_num_seqs=0)
    with pytest.raises(ValueError) as by_scheduler:
        limits.validate()
    with pytest.raises(ValueError) as by_engine:
        EngineConfig(scheduler=limits).validate()
    assert str(by_scheduler.value) == str(by_engine.value)
