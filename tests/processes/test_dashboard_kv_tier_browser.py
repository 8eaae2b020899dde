"""The dashboard's shared KV tier panel in a real browser (Debian's headless Chromium, driven by
Selenium), against a live process cluster on `tiny` (router, one prefill and one decode
process) whose instances share a tier on a real redis-server (`--kv-tier redis://...`).

After a two-turn conversation whose second turn is partly fetched from the tier
(tier_conversation.py), the panel shows, for each instance and in total, the figures the
router's /metrics has: local and tier hit tokens, hit rates, bytes fetched and stored, the
fetches and their P50/P90 (from the same histogram), fallbacks, verification failures,
skipped and failed stores and timeouts; the browser console has no error. The panel of a
cluster without a tier says "no KV tier" (tests/processes/test_dashboard_browser.py).
"""

from __future__ import annotations

import math

import pytest
from etcd_server import wait_until
from http_helpers import scrape, serving, start_cluster, wait_until_pools_full
from kvtier_stores import ALWAYS_FETCH, redis_missing
from selenium.webdriver.support.ui import WebDriverWait
from tier_conversation import TIER_HIT_TOKENS, reference_answer, turn_one, turn_two

from benchmarks.browser.chromium import browser_session, console_errors
from minipd.control.kv_tier_report import FETCH_BUCKETS_S
from minipd.ops.dashboard.kv_tier_view import histogram_quantile

pytestmark = pytest.mark.skipif(redis_missing() is not None, reason=redis_missing() or "")

PAGE_TIMEOUT_S = 60.0
COUNTERS = {  # the panel's field -> its counter on /metrics (and the label that picks it)
    "local_hit_tokens": ("minipd_kv_tier_hit_tokens_total", ("source", "local")),
    "tier_hit_tokens": ("minipd_kv_tier_hit_tokens_total", ("source", "tier")),
    "bytes_fetched": ("minipd_kv_tier_bytes_total", ("direction", "fetched")),
    "bytes_stored": ("minipd_kv_tier_bytes_total", ("direction", "stored")),
    "fetch_fallbacks": ("minipd_kv_tier_fetch_fallbacks_total", None),
    "verification_failures": ("minipd_kv_tier_verification_failures_total", None),
    "stores_skipped": ("minipd_kv_tier_stores_skipped_total", None),
    "stores_failed": ("minipd_kv_tier_stores_failed_total", None),
    "timeouts": ("minipd_kv_tier_timeouts_total", None),
}

# One script reads the whole panel: the page rebuilds its table at every snapshot.
PANEL_JS = """
const rows = {};
for (const tr of document.querySelectorAll('#kvtier-table tbody tr')) {
  const cells = {};
  for (const td of tr.querySelectorAll('td[data-field]')) {
    cells[td.dataset.field] = td.dataset.value === '' ? null : Number(td.dataset.value);
  }
  rows[tr.dataset.instance] = cells;
}
return {
  state: document.getElementById('kvtier-state').dataset.tier,
  text: document.getElementById('kvtier-state').textContent,
  hidden: document.getElementById('kvtier-table').hidden,
  rows,
};
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, redis_store):
    """The router's base URL."""
    flags = ("--model", "tiny", "--dtype", "float32", "--kv-tier", redis_store.url, *ALWAYS_FETCH)
    with serving(start_cluster(tmp_path_factory.mktemp("dashboard-tier"), *flags)) as base_url:
        yield base_url


@pytest.fixture
def browser():
    with browser_session() as driver:
        yield driver


def sample(samples: dict, instance: str, name: str, extra: tuple[str, str] | None = None, default=None):
    """One instance's sample `name` (with the `extra` label) on /metrics, `default` if absent."""
    labels = {("instance", instance), *([extra] if extra else [])}
    return samples.get((name, frozenset(labels)), default)


def metrics_figures(samples: dict) -> dict[str, dict[str, float | None]]:
    """Each instance's figures as the panel shows them, from /metrics' samples."""
    instances = {dict(labels)["instance"] for name, labels in samples if name == "minipd_kv_tier_lookup_tokens_total"}
    figures = {}
    for instance in instances:
        shown = {field: sample(samples, instance, name, extra) for field, (name, extra) in COUNTERS.items()}
        lookup = sample(samples, instance, "minipd_kv_tier_lookup_tokens_total")
        shown["local_hit_rate"] = shown["local_hit_tokens"] / lookup if lookup else None
        shown["tier_hit_rate"] = shown["tier_hit_tokens"] / lookup if lookup else None
        shown["fetches"] = sample(samples, instance, "minipd_kv_tier_fetch_seconds_count", default=0.0)
        bucket = "minipd_kv_tier_fetch_seconds_bucket"
        cumulative = [sample(samples, instance, bucket, ("le", str(b)), 0.0) for b in FETCH_BUCKETS_S]
        cumulative.append(sample(samples, instance, bucket, ("le", "+Inf"), 0.0))
        buckets = [b - a for a, b in zip([0.0, *cumulative], cumulative)]
        shown["fetch_p50_s"] = histogram_quantile(0.5, buckets)
        shown["fetch_p90_s"] = histogram_quantile(0.9, buckets)
        figures[instance] = shown
    return figures


def same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def test_the_tier_panel_shows_what_metrics_says_after_a_tier_hit(
    cluster, redis_store, browser, make_engine, loop_thread
):
    reference = reference_answer(make_engine, loop_thread)
    browser.get(f"{cluster}/dashboard")
    WebDriverWait(browser, PAGE_TIMEOUT_S, poll_frequency=0.2).until(
        lambda d: d.execute_script(PANEL_JS)["state"] == "on", message="the panel never saw the tier"
    )
    first, _ = turn_one(cluster, redis_store, seed=0)
    turn_two(cluster, first, reference, seed=0)
    wait_until_pools_full(cluster, timeout=PAGE_TIMEOUT_S)
    # the router's view of the instances (what /metrics and the page show) comes with its stats
    # polls: it can still be that of before the turns
    wait_until(
        lambda: metrics_figures(scrape(cluster)).get("prefill-0", {}).get("tier_hit_tokens") == TIER_HIT_TOKENS,
        PAGE_TIMEOUT_S,
        "/metrics shows turn 2's tier hit",
    )

    def agrees(driver) -> dict | None:
        # the page's snapshot and /metrics read the instances' stats at different moments (the
        # second turn's stores end after its answer): both are read until they meet
        expected, page = metrics_figures(scrape(cluster)), driver.execute_script(PANEL_JS)
        rows = page["rows"]
        if set(rows) != {*expected, "total"}:
            return None
        for instance, figures in expected.items():
            if not all(same(rows[instance][field], v) for field, v in figures.items()):
                return None
        return page

    page = WebDriverWait(browser, PAGE_TIMEOUT_S, poll_frequency=0.2).until(
        agrees, message="the panel never showed /metrics' figures"
    )
    rows = page["rows"]
    assert not page["hidden"] and "hit rate" in page["text"]
    assert set(rows) == {"prefill-0", "decode-0", "total"}
    assert rows["prefill-0"]["tier_hit_tokens"] == TIER_HIT_TOKENS  # turn 2's sixth block, fetched
    assert rows["prefill-0"]["fetches"] >= 1 and rows["prefill-0"]["bytes_fetched"] > 0
    assert 0 < rows["prefill-0"]["fetch_p50_s"] <= rows["prefill-0"]["fetch_p90_s"]
    assert rows["prefill-0"]["local_hit_tokens"] > 0  # turn 1's prompt blocks, still in its cache
    assert rows["decode-0"]["bytes_stored"] > 0  # the generated tail is stored by the decode instance
    for field in (*COUNTERS, "fetches"):
        assert rows["total"][field] == rows["prefill-0"][field] + rows["decode-0"][field], field
    for field in ("fetch_fallbacks", "verification_failures", "stores_skipped", "stores_failed", "timeouts"):
        assert rows["total"][field] == 0, field
    assert console_errors(browser) == []
