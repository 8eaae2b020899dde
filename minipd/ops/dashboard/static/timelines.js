// minipd dashboard: request timelines. Each of the router's last requests (GET /dashboard/requests,
// fetched through dashboard.js's `api()`, so under the API key) drawn as a waterfall in SVG: one
// lane per phase kind, the KV per layer, and the request's events as vertical marks, in ms after
// the request reached the router. dashboard.js calls `renderTimelines(snapshot)` on every
// snapshot; the timelines are fetched again when the count of finished requests changed (and
// every few seconds), and drawn again only when their version changed.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const WIDTH = 960;        // the drawing's own units (it scales to the panel)
  const LABEL_W = 90;       // lane names on the left
  const RIGHT_PAD = 16;
  const LANE_H = 18;
  const LAYER_LANE_MAX_H = 64; // the layers share this height, however many there are
  const AXIS_H = 18;
  const EVENT_ROW_H = 12;   // event labels, in as many rows as they need not to overlap
  const MAX_EVENT_ROWS = 3;
  const CHAR_W = 6.2;       // for deciding whether a label fits in its bar
  // lanes, top-down: [lane name, the phases drawn in it]
  const LANES = [
    ["router", ["queued"]],
    ["reserve", ["reserve"]],
    ["prefill", ["prefill_queue", "prefill"]],
    ["chunks", ["chunk"]],
    ["KV", ["kv_transfer", "kv_exposed"]],
    ["layers", []],
    ["decode", ["adopt", "generate", "decode"]],
  ];
  const LABELS = {queued: "queued", reserve: "reserve", prefill_queue: "queue", prefill: "prefill", chunk: "",
    kv_transfer: "KV transfer", kv_exposed: "exposed", adopt: "adopt", generate: "to first token", decode: "decode"};

  let shownVersion = -1;
  let shownLength = -1;
  let fetchedFor = null;    // the finished-request count the last fetch was for
  let fetchedAt = 0;
  const REFETCH_MS = 5000;  // also fetched this often (a request that ended at the router only)
  let fetching = false;
  let lastDocument = null;

  const $id = (id) => document.getElementById(id);

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fmt(msValue) {
    if (msValue === null || msValue === undefined) return "–";
    const a = Math.abs(msValue);
    return (a >= 100 ? msValue.toFixed(0) : a >= 10 ? msValue.toFixed(1) : msValue.toFixed(2)) + " ms";
  }

  function niceStep(span) {
    const raw = span / 8;
    const p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }

  function layerLaneHeight(n) { return n ? Math.min(LAYER_LANE_MAX_H, Math.max(LANE_H, n * 3)) : LANE_H; }

  /** One request's waterfall as an SVG element. */
  function waterfall(t) {
    const end = Math.max(t.duration_ms, 0.001);
    const plotW = WIDTH - LABEL_W - RIGHT_PAD;
    const x = (msValue) => LABEL_W + Math.max(0, Math.min(msValue, end)) / end * plotW;
    const lanes = LANES.filter(([name, kinds]) => name === "layers" ? t.layers.length > 0
      : t.phases.some((p) => kinds.includes(p.name)));
    const heights = lanes.map(([name]) => name === "layers" ? layerLaneHeight(t.layers.length) : LANE_H);
    const eventRows = placeEventLabels(t.events, x);
    const TOP_H = EVENT_ROW_H * (1 + Math.max(0, ...eventRows.map((e) => e.row))) + 4;
    const height = TOP_H + heights.reduce((a, b) => a + b, 0) + AXIS_H;
    const root = svg("svg", {viewBox: `0 0 ${WIDTH} ${height}`, class: "tl-svg", role: "img",
      "aria-label": `timeline of ${t.request_id}`});
    let y = TOP_H;
    lanes.forEach(([name, kinds], i) => {
      const h = heights[i];
      root.appendChild(svg("rect", {x: 0, y, width: WIDTH, height: h, class: i % 2 ? "tl-lane odd" : "tl-lane"}));
      root.appendChild(svg("text", {x: 4, y: y + Math.min(h, LANE_H) / 2 + 4, class: "tl-lane-name"}, name));
      if (name === "layers") drawLayers(root, t, x, y, h);
      else {
        const inLane = t.phases.filter((p) => kinds.includes(p.name));
        // what a label outside its bar may not cover: the lane's bars, and the labels placed so far
        const taken = inLane.map((p) => [x(p.start_ms), Math.max(x(p.end_ms), x(p.start_ms) + 1)]);
        for (const p of inLane) drawPhase(root, p, x, y, taken);
      }
      y += h;
    });
    drawAxis(root, end, x, y);
    for (const e of eventRows) drawEvent(root, e, x, TOP_H, y);
    return root;
  }

  function drawPhase(root, p, x, y, taken) {
    const x0 = x(p.start_ms), x1 = Math.max(x(p.end_ms), x0 + 1);
    const g = svg("g", {class: `tl-phase ph-${p.name}`, "data-phase": p.name, "data-start-ms": p.start_ms, "data-end-ms": p.end_ms});
    const dur = p.end_ms - p.start_ms;
    const title = `${p.name}${p.detail ? " (" + p.detail + ")" : ""}: ${fmt(p.start_ms)} → ${fmt(p.end_ms)}, ${fmt(dur)}${p.where ? " on " + p.where : ""}${p.try > 1 ? ", try " + p.try : ""}`;
    g.appendChild(svg("title", {}, title));
    g.appendChild(svg("rect", {x: x0, y: y + 3, width: x1 - x0, height: LANE_H - 6, rx: 2}));
    const label = `${LABELS[p.name] !== undefined ? LABELS[p.name] : p.name}${LABELS[p.name] === "" ? "" : " "}${fmt(dur)}`;
    // inside its bar when it fits, else just after it when nothing is there (the title has it all)
    const fits = label.length * CHAR_W < x1 - x0 - 4;
    const span = [x1 + 2, x1 + 3 + label.length * CHAR_W];
    const free = (a, b) => b < span[0] || a > span[1] || (a === x0 && b === x1);
    const after = !fits && p.name !== "chunk" && span[1] <= WIDTH && taken.every(([a, b]) => free(a, b));
    if (after) taken.push(span);
    if (fits || after) {
      g.appendChild(svg("text", {x: fits ? x0 + 3 : x1 + 3, y: y + LANE_H / 2 + 4, class: fits ? "tl-label in" : "tl-label out"}, label));
    }
    root.appendChild(g);
  }

  function drawLayers(root, t, x, y, h) {
    const n = t.layers.length;
    const row = h / n;
    for (const [i, l] of t.layers.entries()) {
      const x0 = x(l.sent_ms), x1 = Math.max(x(l.landed_ms), x0 + 1);
      const r = svg("rect", {x: x0, y: y + i * row + (row > 3 ? 0.5 : 0), width: x1 - x0, height: Math.max(1, row - (row > 3 ? 1 : 0)),
        class: "tl-layer", "data-layer": l.layer});
      r.appendChild(svg("title", {}, `layer ${l.layer}: first write ${fmt(l.sent_ms)}, last completed ${fmt(l.landed_ms)} (${fmt(l.landed_ms - l.sent_ms)})`));
      root.appendChild(r);
    }
  }

  function drawAxis(root, end, x, y) {
    const step = niceStep(end);
    root.appendChild(svg("line", {x1: LABEL_W, x2: WIDTH - RIGHT_PAD, y1: y + 1, y2: y + 1, class: "tl-axis"}));
    for (let v = 0; v <= end + 1e-9; v += step) {
      root.appendChild(svg("line", {x1: x(v), x2: x(v), y1: y + 1, y2: y + 5, class: "tl-axis"}));
      root.appendChild(svg("text", {x: x(v), y: y + 15, class: "tl-tick", "text-anchor": "middle"}, fmt(v).replace(" ms", "")));
    }
    root.appendChild(svg("text", {x: WIDTH - 2, y: y + 15, class: "tl-tick", "text-anchor": "end"}, "ms"));
  }

  function eventLabel(e) { return `${e.name.replace("_", " ")} ${fmt(e.at_ms)}`; }

  /** The events with the row (and side) of their labels: the first row where a label does not overlap another. */
  function placeEventLabels(events, x) {
    const rows = [];  // per row, the [x0, x1] taken
    return events.map((e) => {
      const at = x(e.at_ms), w = eventLabel(e).length * CHAR_W + 4;
      const rightHalf = at > LABEL_W + (WIDTH - LABEL_W) / 2;
      const span = rightHalf ? [at - w, at] : [at, at + w];
      let row = rows.findIndex((taken) => taken.every(([a, b]) => span[1] < a || span[0] > b));
      if (row < 0) row = Math.min(rows.length, MAX_EVENT_ROWS - 1);
      (rows[row] = rows[row] || []).push(span);
      return Object.assign({row, rightHalf}, e);
    });
  }

  function drawEvent(root, e, x, top, bottom) {
    const at = x(e.at_ms);
    const labelY = EVENT_ROW_H * (e.row + 1) - 2;
    const g = svg("g", {class: `tl-event ev-${e.name}`, "data-event": e.name, "data-at-ms": e.at_ms});
    g.appendChild(svg("title", {}, `${e.name.replace("_", " ")} at ${fmt(e.at_ms)}${e.where ? " (" + e.where + ")" : ""}${e.detail ? ": " + e.detail : ""}`));
    g.appendChild(svg("line", {x1: at, x2: at, y1: labelY - 8, y2: bottom}));
    g.appendChild(svg("text", {x: e.rightHalf ? at - 2 : at + 2, y: labelY, "text-anchor": e.rightHalf ? "end" : "start"}, eventLabel(e)));
    root.appendChild(g);
  }

  function summary(t) {
    const parts = [
      t.prefill_instance ? `${t.prefill_instance} → ${t.decode_instance}` : (t.decode_instance ? `on ${t.decode_instance}` : "no instance"),
      `${t.prompt_tokens} prompt · ${t.output_tokens} out`,
      `TTFT ${fmt(t.ttft_ms)}`,
      `total ${fmt(t.duration_ms)}`,
    ];
    if (t.num_chunks) parts.push(t.num_chunks === 1 ? "1 chunk" : `${t.num_chunks} chunks`);
    if (t.layers.length) parts.push(`${t.layers.length} layers`);
    if (t.kv_bytes) parts.push(`KV ${typeof bytes === "function" ? bytes(t.kv_bytes) : t.kv_bytes + " B"}`);
    if (t.tries > 1) parts.push(`${t.tries} tries`);
    return parts.join(" · ");
  }

  function card(t) {
    const box = document.createElement("div");
    box.className = "tl";
    box.dataset.requestId = t.request_id;
    box.dataset.outcome = t.outcome;
    const head = document.createElement("div");
    head.className = "tl-head";
    const id = document.createElement("b");
    id.textContent = t.request_id;
    const outcome = document.createElement("span");
    outcome.className = `tl-outcome ${t.outcome}`;
    outcome.textContent = t.outcome === "finish" ? t.finish_reason : t.outcome;
    const sub = document.createElement("span");
    sub.className = "muted";
    sub.textContent = summary(t);
    head.append(id, outcome, sub);
    if (t.error) {
      const err = document.createElement("span");
      err.className = "error tl-error";
      err.textContent = t.error;
      head.append(err);
    }
    box.append(head, waterfall(t));
    return box;
  }

  function shownCount() { return Number($id("timelines-count").value) || 10; }

  function draw(doc) {
    lastDocument = doc;
    shownVersion = doc.version;
    shownLength = doc.timelines.length;
    const list = $id("timelines-list");
    const shown = doc.timelines.slice(0, shownCount());
    $id("timelines-summary").textContent = `newest first · the last ${shown.length} of ${doc.version} (${doc.capacity} kept)`;
    list.replaceChildren(...shown.map(card));
  }

  async function refresh(total) {
    if (fetching) return;
    fetching = true;
    fetchedFor = total;
    fetchedAt = Date.now();
    try {
      const response = await api("/dashboard/requests?limit=" + shownCount());
      if (!response.ok) throw new Error(response.statusText);
      const doc = await response.json();
      if (doc.version !== shownVersion || doc.timelines.length !== shownLength) draw(doc);
    } catch (err) {
      fetchedFor = null; // try again with the next snapshot
      if (err.message !== "unauthorized") $id("timelines-summary").textContent = "timelines: " + err.message;
    } finally {
      fetching = false;
    }
  }

  window.renderTimelines = function (snapshot) {
    if (!$id("timelines-list")) return;
    const total = snapshot.totals ? snapshot.totals.requests : 0;
    if (total !== fetchedFor || Date.now() - fetchedAt > REFETCH_MS) refresh(total);
  };

  document.addEventListener("DOMContentLoaded", () => {
    const count = $id("timelines-count");
    if (count) count.addEventListener("change", () => {
      if (lastDocument) draw(lastDocument);          // fewer at once; more once fetched
      if (!fetching) refresh(fetchedFor);
    });
  });
})();
