"""`python bench.py kvtier --trace FILE --quick`: the Mooncake trace replay runs both arms (strict
JSON, a table, a PNG), its unbounded-cache bound is the one computed here from the trace file
by other means (a trie over the capped hash ids), and the tier arm hits more than the arm
without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bench_serving import ROOT, bench, finite

from benchmarks.kvtier.replay_bench import REPLAY_ARMS

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def trie_bound(path: Path, start: int, window: int, max_blocks: int) -> tuple[int, int]:
    """(prefix hash ids an unbounded cache holds, hash ids) over the window: a walk down a trie
    of every earlier prompt's capped ids, stopping at the first id not under the node reached."""
    rows = [json.loads(line) for line in path.read_text().splitlines()[start : start + window]]
    root: dict = {}
    hits = total = 0
    for row in rows:
        ids = row["hash_ids"][:max_blocks]
        total += len(ids)
        node, matching = root, True
        for hash_id in ids:
            matching = matching and hash_id in node
            hits += matching
            node = node.setdefault(hash_id, {})
    return hits, total


@pytest.mark.timeout(300)
@pytest.mark.skipif(not TRACE.exists(), reason=f"the trace is not at {TRACE}")
def test_the_replay_reports_the_bound_and_the_tier_hits_more(tmp_path):
    result, stdout = bench(tmp_path, "kvtier", "--trace", str(TRACE))
    assert result["checks_failed"] == [] and result["model"] == "tiny"
    assert set(result["arms"]) == set(REPLAY_ARMS)
    s = result["scaling"]
    for arm in result["arms"].values():
        assert arm["requests"] == s["window"] and arm["prompt_tokens"] == result["prompt_tokens"]
        assert arm["prefill_tokens_saved"] + arm["prefill_tokens_computed"] == arm["prompt_tokens"]
        assert finite(arm["ttft_p50_ms"], arm["ttft_p90_ms"], arm["hit_rate"], arm["hit_rate_local"])
        assert 0 < arm["ttft_p50_ms"] <= arm["ttft_p90_ms"]

    hits, total = trie_bound(TRACE, s["start"], s["window"], s["max_blocks"])
    assert hits > 0  # the window shares prefixes, else the comparison below says nothing
    assert result["bound_hit_tokens"] == hits * s["block_tokens"]
    assert result["prompt_tokens"] == total * s["block_tokens"] + s["window"] * s["tail_tokens"]
    assert result["hit_rate_bound"] == pytest.approx(result["bound_hit_tokens"] / result["prompt_tokens"])

    no_tier, tier = result["arms"]["no_tier"], result["arms"]["tier"]
    assert no_tier["hit_rate_tier"] == 0 and tier["hit_rate_tier"] > 0
    assert tier["hit_rate"] > no_tier["hit_rate"] and result["hit_rate"] == tier["hit_rate"]
    assert tier["hit_rate"] <= result["hit_rate_bound"]  # no cache reuses more than an unbounded one
    assert "unbounded-cache bound" in stdout
