"""Figures read from a minipd server's Prometheus /metrics (absent on other servers: None)."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 10.0
KV_BYTES = "minipd_kv_transfer_bytes_total"
KV_TRANSFERS = "minipd_kv_transfer_seconds_count"
KV_EXPOSED_SUM = "minipd_kv_transfer_exposed_seconds_sum"
KV_EXPOSED_COUNT = "minipd_kv_transfer_exposed_seconds_count"


class TransferTotals(NamedTuple):
    num_bytes: float
    num_transfers: float
    exposed_s: float
    num_exposed: float

    def since(self, before: "TransferTotals") -> "TransferTotals":
        return TransferTotals(*(a - b for a, b in zip(self, before)))

    @property
    def bytes_per_transfer(self) -> float | None:
        return self.num_bytes / self.num_transfers if self.num_transfers else None

    @property
    def mean_exposed_s(self) -> float | None:
        return self.exposed_s / self.num_exposed if self.num_exposed else None


def transfer_totals(base_url: str) -> TransferTotals | None:
    """The KV transfer counters summed over every label set; None without minipd's metrics."""
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=SCRAPE_TIMEOUT_S) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    sums = dict.fromkeys((KV_BYTES, KV_TRANSFERS, KV_EXPOSED_SUM, KV_EXPOSED_COUNT), 0.0)
    found = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
                found = True
    return TransferTotals(*sums.values()) if found else None
