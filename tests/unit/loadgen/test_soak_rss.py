"""The soak's memory check (benchmarks/soak/rss.py) on synthetic samples, and VmRSS read from /proc."""

from __future__ import annotations

import os

from benchmarks.soak import rss


def test_growth_past_the_bound_fails_the_run():
    result = rss.report(
        {"router": (10, 100.0), "decode-0": (11, 300.0)}, {"router": (10, 110.0), "decode-0": (11, 520.0)}, 150.0
    )
    assert result["rss_growth_mb"] == 220.0
    assert result["rss_processes_checked"] == 2
    assert len(result["checks_failed"]) == 1 and "220 MB" in result["checks_failed"][0]


def test_growth_within_the_bound_passes():
    result = rss.report({"router": (10, 100.0)}, {"router": (10, 240.0)}, 150.0)
    assert result["rss_growth_mb"] == 140.0 and result["checks_failed"] == []


def test_a_restarted_process_is_reported_but_not_counted():
    result = rss.report(
        {"router": (10, 100.0), "prefill-0": (11, 300.0)}, {"router": (10, 105.0), "prefill-0": (99, 900.0)}, 150.0
    )
    assert result["rss_mb"]["prefill-0"] == {"start_mb": 300.0, "end_mb": 900.0, "restarted": True}
    assert result["rss_processes_checked"] == 1 and result["rss_growth_mb"] == 5.0
    assert result["checks_failed"] == []


def test_vm_rss_of_this_process_and_of_none():
    mb = rss.vm_rss_mb(os.getpid())
    assert mb is not None and 10 < mb < 1 << 20
    assert rss.vm_rss_mb(2**22 + 1) is None  # above the kernel's largest pid
