"""The packed weights' huge-page arena (models/weights/huge_pages.py): copies equal to the inputs, laid
in one 2 MiB-aligned arena that Linux backs with huge pages where THP allows it; the inputs
themselves where it does not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minipd.models.weights import huge_pages


def _anon_huge_kib() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def test_copies_are_equal_aligned_and_on_huge_pages_where_thp_allows() -> None:
    tensors = [torch.randint(0, 255, (n,), dtype=torch.uint8) for n in (3 << 20, 1000, 5 << 20)]
    tensors.append(torch.randn(7, 9))
    before = _anon_huge_kib()
    views = huge_pages.to_huge_pages(tensors)
    assert all(torch.equal(v, t) for v, t in zip(views, tensors))
    if not huge_pages.available():
        assert all(v is t for v, t in zip(views, tensors))
        pytest.skip(f"transparent huge pages are off here ({huge_pages.THP_SETTING}): the inputs are returned")
    assert views[0].data_ptr() % huge_pages.HUGE_PAGE == 0 and all(v.data_ptr() % 64 == 0 for v in views)
    assert len({v.untyped_storage().data_ptr() for v in views}) == 1  # one arena
    # at least one whole 2 MiB page of the 9 MB arena is a huge page (the kernel may split others)
    assert _anon_huge_kib() - before >= 2048, "no huge page backs the arena"
    original = int(tensors[1][0])
    views[1][0] = (original + 1) % 256  # writable, and a copy: the input keeps its value
    assert int(tensors[1][0]) == original and int(views[1][0]) != original


def test_nothing_or_a_non_cpu_tensor_is_returned_as_is() -> None:
    assert huge_pages.to_huge_pages([]) == []
    meta = torch.empty(4, device="meta")
    assert huge_pages.to_huge_pages([meta])[0] is meta
