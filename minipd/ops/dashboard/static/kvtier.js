// minipd dashboard: the shared KV tier panel. dashboard.js calls `renderKVTier(snapshot)` on every
// snapshot; the snapshot's `kv_tier` (ops/dashboard/kv_tier_view.py) is null when no instance has
// a tier: the panel then says "no KV tier" and its table is hidden. Otherwise one row per
// instance and a total row, each cell carrying its exact figure in `data-value` (what /metrics'
// minipd_kv_tier_* series say) next to the text shown.
"use strict";

(function () {
  // [field, how it is shown]; a field is a key of a kv_tier_view entry. ms, bytes and pct are
  // dashboard.js's formatters (loaded before this file).
  const COLUMNS = [
    ["local_hit_tokens", count],
    ["tier_hit_tokens", count],
    ["local_hit_rate", pct],
    ["tier_hit_rate", pct],
    ["bytes_fetched", bytes],
    ["bytes_stored", bytes],
    ["fetches", count],
    ["fetch_p50_s", ms],
    ["fetch_p90_s", ms],
    ["fetch_fallbacks", count],
    ["verification_failures", count],
    ["stores_skipped", count],
    ["stores_failed", count],
    ["timeouts", count],
  ];

  function count(v) { return String(v); }

  function row(entry) {
    const tr = document.createElement("tr");
    tr.dataset.instance = entry.instance;
    const name = document.createElement("td");
    name.textContent = entry.instance;
    tr.append(name);
    for (const [field, show] of COLUMNS) {
      const td = document.createElement("td");
      const value = entry[field];
      td.dataset.field = field;
      td.dataset.value = value === null || value === undefined ? "" : String(value);
      td.textContent = value === null || value === undefined ? "–" : show(value);
      tr.append(td);
    }
    return tr;
  }

  window.renderKVTier = function (s) {
    const tier = s.kv_tier;
    const state = document.getElementById("kvtier-state");
    const table = document.getElementById("kvtier-table");
    state.dataset.tier = tier ? "on" : "off";
    if (!tier) {
      state.textContent = "no KV tier";
      table.hidden = true;
      return;
    }
    const t = tier.total;
    state.textContent = tier.instances.length + " instance(s) · hit rate " + pct(t.local_hit_rate) + " local, " +
      pct(t.tier_hit_rate) + " tier";
    table.hidden = false;
    const body = table.querySelector("tbody");
    body.replaceChildren(...tier.instances.map(row));
    const total = row(t);
    total.className = "total";
    body.append(total);
  };
})();
