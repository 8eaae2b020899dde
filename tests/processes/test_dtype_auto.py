"""`--dtype auto`: the rule (pure, with fake CPU flags and CUDA capabilities), what it resolves to
on this machine, that the engine and the fingerprint carry the resolved name, and the start-up line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from minipd.disagg.fingerprint import engine_fingerprint
from minipd.engine.dtype_choice import choose_auto_dtype, read_cpu_flags, resolve_dtype
from minipd.engine.engine import EngineConfig

# Real flag lines (trimmed): an AVX512-BF16 EPYC, an AMX Xeon, and a Skylake without bf16.
EPYC_FLAGS = "fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni"
AMX_FLAGS = "fpu sse2 avx2 avx512f amx_bf16 amx_tile amx_int8"
SKYLAKE_FLAGS = "fpu sse2 avx2 avx512f avx512bw avx512_vnni"
CLI_TIMEOUT_S = 120


@pytest.mark.parametrize(
    "flags, expected", [(EPYC_FLAGS, "bfloat16"), (AMX_FLAGS, "bfloat16"), (SKYLAKE_FLAGS, "float32"), ("", "float32")]
)
def test_cpu_rule(flags, expected):
    choice = choose_auto_dtype("cpu", flags.split())
    assert choice.name == expected and choice.reason.startswith("auto:")


def test_cpu_rule_without_readable_flags_is_float32():
    assert choose_auto_dtype("cpu", None).name == "float32"


@pytest.mark.parametrize("capability, expected", [((7, 5), "float32"), ((8, 0), "bfloat16"), ((9, 0), "bfloat16")])
def test_cuda_rule(capability, expected):
    assert choose_auto_dtype("cuda", None, capability).name == expected


def test_flags_are_read_from_cpuinfo(tmp_path: Path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: {EPYC_FLAGS}\n\nprocessor\t: 1\n")
    assert read_cpu_flags(cpuinfo) == frozenset(EPYC_FLAGS.split())
    assert read_cpu_flags(tmp_path / "absent") is None


def _has_bf16_flags() -> bool:
    flags = read_cpu_flags()
    return flags is not None and bool({"avx512_bf16", "amx_bf16"} & flags)


@pytest.mark.skipif(not _has_bf16_flags(), reason="this CPU has neither avx512_bf16 nor amx_bf16")
def test_auto_is_bfloat16_on_this_bf16_cpu():
    assert resolve_dtype("auto", "cpu").name == "bfloat16"


def test_explicit_names_pass_through_and_unknown_ones_are_named():
    assert resolve_dtype("float16", "cpu").name == "float16"
    with pytest.raises(ValueError, match="dtype: unknown 'int3'"):
        resolve_dtype("int3", "cpu")


def test_auto_is_the_default_and_the_engine_and_fingerprint_carry_the_resolved_name(make_engine, loop_thread):
    assert EngineConfig().dtype == "auto"
    expected = resolve_dtype("auto", "cpu").name
    first = make_engine(model="tiny", num_blocks=16, max_model_len=128)
    second = make_engine(model="tiny", num_blocks=16, max_model_len=128)
    assert first.config.dtype == expected == first.dtype_choice.name
    assert first.kv_pool.dtype == first.model.model.embed_tokens.weight.dtype == first.dtype
    assert str(first.dtype) == f"torch.{expected}"
    a, b = engine_fingerprint(first), engine_fingerprint(second)
    assert a == b and a.dtype == expected


def test_the_colocated_role_prints_its_dtype_choice_at_start_up():
    # (prefill and decode print the same line: tests/processes/test_cli_cluster.py)
    proc = subprocess.run(
        [sys.executable, "-m", "minipd", "--role", "both", "--prompt", "hi", "--max-tokens", "2"],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    choice = resolve_dtype("auto", "cpu")
    assert "minipd both: model tiny loaded in " in proc.stderr
    assert choice.describe() in proc.stderr
