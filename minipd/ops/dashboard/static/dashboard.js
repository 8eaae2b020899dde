// minipd dashboard: reads /dashboard/events (server-sent events over fetch(), so that the API
// key travels as an Authorization header, never in a URL) and draws each snapshot.
// Every data and control call goes through `api()`, which adds the key (kept in sessionStorage).
"use strict";

const KEY_STORAGE = "minipd.apiKey";
const AUTH_REQUIRED = document.querySelector('meta[name="minipd-auth"]').content === "required";
const RECONNECT_MS = 1000;
const $ = (id) => document.getElementById(id);
let latest = null; // the newest snapshot
let streamAbort = null;

// ---- the key and the calls --------------------------------------------------------------
function apiKey() { return sessionStorage.getItem(KEY_STORAGE); }

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = apiKey();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function api(path, options) {
  const opts = Object.assign({cache: "no-store"}, options || {});
  opts.headers = headers(opts.headers);
  const response = await fetch(path, opts);
  if (response.status === 401) { askForKey("The server refused the key."); throw new Error("unauthorized"); }
  return response;
}

/** POST a JSON body (every control is one); resolves to the parsed answer, rejects with its error message. */
async function postJSON(path, body) {
  const response = await api(path, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error((answer.error && answer.error.message) || response.statusText);
  return answer;
}

function askForKey(why) {
  sessionStorage.removeItem(KEY_STORAGE);
  if (streamAbort) streamAbort.abort();
  $("key-error").textContent = why || "";
  $("key-dialog").hidden = false;
  $("key-input").focus();
  setStatus(false, "API key needed");
}

// ---- controls ---------------------------------------------------------------------------
// Each control is a POST with a JSON body, under the key. The snapshot's `controls` says which
// ones this server has; the hooks below are where the page's buttons call them.
const controls = {
  /** Switch one instance's role in place (POST /admin/switch_role, ops/admin/admin.py). */
  switchRole(instance, role) { return postJSON("/admin/switch_role", {instance, role}); },
  /** Set the SLO the page judges against (every viewer's), in milliseconds. */
  setSlo(ttftMs, itlMs) { return postJSON("/dashboard/slo", {ttft_ms: ttftMs, itl_ms: itlMs}); },
  // The router's other control calls (ops/admin/admin_controls.py), behind the Controls panel's buttons.
  /** The whole cluster colocated ("both" everywhere), or split into `prefill` prefill instances and the rest decode. */
  flipCluster(mode, prefill) { return ifAvailable("cluster_mode", "/admin/cluster_mode", mode === "split" ? {mode, prefill} : {mode}); },
  /** One instance's outgoing KV bandwidth cap in Gbit/s, from its next write on (null: uncapped): "starve the link". */
  setLinkCap(instance, gbps) { return ifAvailable("link_cap", "/admin/link_cap", {instance, gbps}); },
  /** Start the router's built-in load generator (a LoadRequest: workload, rate or concurrency, bounds), or stop it. */
  startLoad(spec) { return ifAvailable("load", "/admin/load", spec); },
  stopLoad() { return ifAvailable("load", "/admin/load/stop", {}); },
  /** The ratio controller on or off, with its SLO ({ttft_ms, itl_ms}) and target (each optional). */
  setController(on, slo, target) { return ifAvailable("controller", "/admin/controller", {on, slo, target}); },
};
window.minipdControls = controls;

/** A control the server may not have: call it only when the snapshot lists it. */
function ifAvailable(name, path, body) {
  if (!latest || !latest.controls || !latest.controls[name]) return Promise.reject(new Error(name + ": not available on this server"));
  return postJSON(path, body);
}

// ---- the stream ---------------------------------------------------------------------------
function setStatus(on, text) { const s = $("status"); s.textContent = text; s.className = "status " + (on ? "on" : "off"); }

async function stream() {
  if (AUTH_REQUIRED && !apiKey()) { askForKey(""); return; }
  streamAbort = new AbortController();
  try {
    const response = await api("/dashboard/events", {signal: streamAbort.signal});
    if (!response.ok) throw new Error("events: " + response.status);
    setStatus(true, "live");
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true}).replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        onEvent(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
  } catch (err) {
    if (err.message === "unauthorized" || err.name === "AbortError") return;
    showMessage("connection: " + err.message);
  }
  setStatus(false, "reconnecting");
  setTimeout(stream, RECONNECT_MS);
}

/** One event-stream block: `event:` and `data:` lines (comments, starting with ":", are keep-alives). */
function onEvent(block) {
  let name = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") name = value; else if (field === "data") data.push(value);
  }
  if (name === "snapshot" && data.length) render(JSON.parse(data.join("\n")));
}

// ---- formatting ---------------------------------------------------------------------------
function ms(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const v = seconds * 1000;
  return (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)) + " ms";
}
function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return (i ? n.toFixed(1) : String(Math.round(n))) + " " + units[i];
}
function pct(share) { return share === null || share === undefined ? "–" : (share * 100).toFixed(1) + "%"; }
function el(tag, className, text) { const e = document.createElement(tag); if (className) e.className = className; if (text !== undefined) e.textContent = text; return e; }
function showMessage(text) { $("message").textContent = text; }

// ---- drawing --------------------------------------------------------------------------------
function render(s) {
  latest = s;
  window.minipdLatest = s;  // the latest snapshot, for scripts driving the page
  $("key-change").hidden = !AUTH_REQUIRED;
  renderHeadline(s);
  renderPools(s);
  renderLinks(s);
  renderLatency(s);
  renderController(s);
  renderRequests(s);
  renderControls(s);
  if (window.renderTimelines) window.renderTimelines(s); // timelines.js
  if (window.renderKVTier) window.renderKVTier(s); // kvtier.js
}

function renderHeadline(s) {
  const lat = s.latency, slo = s.slo, att = s.attainment;
  const ttft = $("h-ttft"), itl = $("h-itl");
  ttft.textContent = ms(lat.ttft.p90);
  ttft.className = "value " + (lat.ttft.p90 === null ? "" : lat.ttft.p90 <= slo.ttft_s ? "good" : "bad");
  itl.textContent = ms(lat.itl.p90);
  itl.className = "value " + (lat.itl.p90 === null ? "" : lat.itl.p90 <= slo.itl_s ? "good" : "bad");
  $("h-ttft-slo").textContent = "SLO " + ms(slo.ttft_s);
  $("h-itl-slo").textContent = "SLO " + ms(slo.itl_s);
  const v = $("verdict");
  v.textContent = att.verdict === "met" ? "yes" : att.verdict === "violated" ? "no: an SLO is violated" : "no data";
  v.className = "value " + (att.verdict === "met" ? "good" : att.verdict === "violated" ? "bad" : "");
  v.dataset.verdict = att.verdict;
  $("h-attain").textContent = "attainment TTFT " + pct(att.ttft) + " · ITL " + pct(att.itl) + " (target " + pct(att.target) + ")";
  const moved = s.requests.filter((r) => r.kv_bytes > 0);
  if (moved.length) {
    const mean = (f) => moved.reduce((a, r) => a + f(r), 0) / moved.length;
    $("h-kv").textContent = bytes(mean((r) => r.kv_bytes)) + " · " + ms(mean((r) => r.transfer_s));
    $("h-kv-sub").textContent = "exposed " + ms(mean((r) => r.exposed_s)) + " (mean of the last " + moved.length + ")";
  } else {
    $("h-kv").textContent = "–";
    $("h-kv-sub").textContent = "no KV moved lately";
  }
}

const ROLES = ["prefill", "decode", "both"];

function instanceCard(row, canSwitch) {
  const card = el("div", "inst");
  card.dataset.instance = row.instance;
  const top = el("div", "top");
  const name = el("span", "name");
  name.append(el("span", "live"), el("span", "id"));
  top.append(name, el("span", "badge role"));
  card.append(top, el("div", "compute muted"));
  const bar = el("div", "kvbar");
  bar.append(el("span", "used"), el("span", "cached"), el("span", "fencing"));
  card.append(bar);
  for (const [label, field] of [["epoch", "epoch"], ["KV used/cach/free", "blocks"], ["fencing", "fencing"],
    ["running/waiting", "load"], ["steps/s", "steps"]]) {
    const r = el("div", "row");
    r.append(el("span", "", label), el("b"));
    r.lastChild.dataset.field = field;
    card.append(r);
  }
  if (canSwitch) {
    const sw = el("div", "switch-row");
    const select = el("select", "switch-to");
    for (const role of ROLES) { const o = el("option", "", role); o.value = role; select.append(o); }
    const button = el("button", "switch", "switch role");
    button.addEventListener("click", () => {
      button.disabled = true;
      showMessage("switching " + row.instance + " to " + select.value + "…");
      controls.switchRole(row.instance, select.value)
        .then((r) => showMessage(row.instance + " is " + r.to_role + " now, epoch " + r.epoch + " (" + r.total_s.toFixed(2) + " s)"))
        .catch((err) => showMessage("switch " + row.instance + ": " + err.message))
        .finally(() => { button.disabled = false; });
    });
    sw.append(select, button);
    card.append(sw);
  }
  return card;
}

function updateCard(card, row) {
  card.dataset.role = row.role;
  card.dataset.liveness = row.liveness;
  card.querySelector(".live").className = "live " + row.liveness;
  card.querySelector(".live").title = row.liveness;
  card.querySelector(".id").textContent = row.instance;
  const badge = card.querySelector(".role");
  badge.textContent = row.role; badge.className = "badge role " + row.role;
  card.querySelector(".compute").textContent = row.compute || "compute not reported";
  const b = row.blocks, total = Math.max(1, b.total);
  const uncachedUsed = Math.max(0, b.used);
  const cachedFree = Math.max(0, Math.min(b.cached, b.free));
  card.querySelector(".kvbar .used").style.width = (100 * uncachedUsed / total) + "%";
  card.querySelector(".kvbar .cached").style.width = (100 * cachedFree / total) + "%";
  card.querySelector(".kvbar .fencing").style.width = (100 * b.fencing / total) + "%";
  const set = (field, text) => { card.querySelector('[data-field="' + field + '"]').textContent = text; };
  set("epoch", String(row.epoch));
  set("blocks", b.used + " / " + b.cached + " / " + b.free);
  set("fencing", String(b.fencing));
  set("load", row.running + " / " + row.waiting);
  set("steps", row.step_rate === null ? "–" : row.step_rate.toFixed(1));
  const select = card.querySelector(".switch-to");
  if (select && document.activeElement !== select && select.dataset.role !== row.role) {
    select.dataset.role = row.role;
    select.value = row.role === "prefill" ? "decode" : "prefill";
  }
}

function renderPools(s) {
  const canSwitch = !!(s.controls && s.controls.role_switch);
  const placed = new Set();
  for (const pool of ["prefill", "decode", "colocated"]) {
    const box = $("pool-" + pool), members = box.querySelector(".members"), rows = s.pools[pool] || [];
    box.querySelector(".count").textContent = String(rows.length);
    box.hidden = pool === "colocated" && !rows.length && s.mode === "router";
    for (const row of rows) {
      let card = document.querySelector('.inst[data-instance="' + CSS.escape(row.instance) + '"]');
      if (!card) card = instanceCard(row, canSwitch);
      if (card.parentElement !== members) members.append(card);
      updateCard(card, row);
      placed.add(row.instance);
    }
  }
  for (const card of document.querySelectorAll(".inst")) if (!placed.has(card.dataset.instance)) card.remove();
  $("pool-summary").textContent = s.num_instances + " instances · " + s.pools.prefill.length + "P:" + s.pools.decode.length + "D" +
    (s.pools.colocated.length ? " + " + s.pools.colocated.length + " colocated" : "");
}

function renderLinks(s) {
  const body = $("links-table").querySelector("tbody");
  body.replaceChildren();
  for (const link of s.links) {
    const tr = el("tr");
    tr.dataset.pair = link.prefill + "->" + link.decode;
    tr.append(el("td", "", link.prefill + " → " + link.decode), el("td", "", bytes(link.bytes_per_s) + "/s"), el("td", "", String(link.requests)));
    body.append(tr);
  }
  if (!s.links.length) { const tr = el("tr"); tr.append(el("td", "muted", "no KV moved in the window")); body.append(tr); }
  // one arrow, as thick as the busiest pair's rate
  const svg = $("links-svg"), total = s.links.reduce((a, l) => a + l.bytes_per_s, 0);
  const NS = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  const line = document.createElementNS(NS, "line");
  const width = total > 0 ? Math.min(14, 2 + Math.log10(1 + total) * 1.5) : 1;
  for (const [k, v] of [["x1", 10], ["y1", 30], ["x2", 200], ["y2", 30], ["stroke", total > 0 ? "#4fb6c9" : "#2a3039"], ["stroke-width", width]]) line.setAttribute(k, v);
  const head = document.createElementNS(NS, "polygon");
  head.setAttribute("points", "200,20 215,30 200,40");
  head.setAttribute("fill", total > 0 ? "#4fb6c9" : "#2a3039");
  const label = document.createElementNS(NS, "text");
  label.setAttribute("x", 10); label.setAttribute("y", 55);
  label.textContent = "KV " + bytes(total) + "/s over the last " + s.window_s + " s";
  svg.append(line, head, label);
}

function renderLatency(s) {
  $("window").textContent = "sliding window " + s.window_s + " s";
  const src = $("slo-source");
  src.textContent = "judged against the " + (s.slo.source === "page" ? "SLO set here" : s.slo.source === "controller" ? "controller's SLO" : "default SLO");
  for (const [id, value] of [["slo-ttft", s.slo.ttft_s], ["slo-itl", s.slo.itl_s]]) {
    const input = $(id);
    if (document.activeElement !== input && input.dataset.dirty !== "1") input.value = +(value * 1000).toPrecision(6);
  }
  for (const kind of ["ttft", "itl"]) {
    const cells = $("lat-" + kind).querySelectorAll("td"), l = s.latency[kind];
    cells[0].textContent = ms(l.p50); cells[1].textContent = ms(l.p90); cells[2].textContent = ms(l.p99);
    cells[3].textContent = String(l.count); cells[4].textContent = pct(s.attainment[kind]);
    drawChart($("chart-" + kind), s.series, kind, kind === "ttft" ? s.slo.ttft_s : s.slo.itl_s);
  }
}

function drawChart(canvas, series, kind, slo) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || canvas.width, h = canvas.clientHeight || canvas.height;
  if (canvas.width !== Math.round(w * ratio)) { canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio); }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const t = series.t, n = t.length, pad = {l: 52, r: 8, t: 8, b: 18};
  const keys = [["p50", "#7aa2f7"], ["p90", "#e0af68"], ["p99", "#bb9af7"]];
  let top = slo * 1.5;
  for (const [p] of keys) for (const v of series[kind + "_" + p]) if (v !== null && v > top) top = v;
  top *= 1.05;
  const x = (i) => pad.l + (n > 1 ? (i / (n - 1)) * (w - pad.l - pad.r) : 0);
  const y = (v) => h - pad.b - (v / top) * (h - pad.t - pad.b);
  // verdict per tick, as a strip along the bottom
  for (let i = 0; i < n; i++) {
    const v = series.verdict[i];
    if (v === "no data") continue;
    ctx.fillStyle = v === "met" ? "rgba(47,191,113,.35)" : "rgba(229,72,77,.35)";
    ctx.fillRect(x(i), h - pad.b + 2, Math.max(1, (w - pad.l - pad.r) / Math.max(1, n - 1)), 4);
  }
  ctx.strokeStyle = "#2a3039"; ctx.fillStyle = "#8b95a3"; ctx.font = "10px system-ui"; ctx.lineWidth = 1;
  for (let k = 0; k <= 4; k++) {
    const v = (top * k) / 4;
    ctx.beginPath(); ctx.moveTo(pad.l, y(v)); ctx.lineTo(w - pad.r, y(v)); ctx.stroke();
    ctx.fillText(ms(v), 2, y(v) + 3);
  }
  for (const [p, color] of keys) {
    const values = series[kind + "_" + p];
    ctx.strokeStyle = color; ctx.lineWidth = p === "p90" ? 2 : 1.2;
    ctx.beginPath();
    let pen = false;
    for (let i = 0; i < n; i++) {
      if (values[i] === null) { pen = false; continue; }
      if (pen) ctx.lineTo(x(i), y(values[i])); else ctx.moveTo(x(i), y(values[i]));
      pen = true;
    }
    ctx.stroke();
  }
  ctx.strokeStyle = "#e5484d"; ctx.setLineDash([6, 4]); ctx.lineWidth = 1.5;
  ctx.beginPath(); ctx.moveTo(pad.l, y(slo)); ctx.lineTo(w - pad.r, y(slo)); ctx.stroke();
  ctx.setLineDash([]);
  ctx.fillStyle = "#e5484d"; ctx.fillText("SLO " + ms(slo), w - pad.r - 80, y(slo) - 4);
}

function renderController(s) {
  const c = s.controller, body = $("controller-body");
  $("controller-state").textContent = c ? "on" : "off";
  body.replaceChildren();
  if (!c) { body.append(el("p", "muted", "Off: start the router with --ratio-controller, or turn it on with POST /admin/controller.")); return; }
  const slo = Object.entries(c.slo).map(([k, v]) => k.replace("_ms", "") + " " + v + " ms").join(", ");
  body.append(el("p", "", "SLO " + slo + " · target " + pct(c.target) + " · window " + c.window_s + " s · cool-down " + c.cooldown_s + " s"));
  const d = c.last_decision;
  body.append(el("p", "", d ? "last decision: " + d.move + " (" + d.reason + "); TTFT attainment " + pct(d.ttft_attainment) +
    ", decode " + pct(d.decode_attainment) : "no decision yet"));
  if (c.moves.length) {
    const table = el("table"), head = el("tr");
    for (const h of ["when", "instance", "move", "why", "outcome"]) head.append(el("th", "", h));
    table.append(head);
    for (const m of c.moves.slice().reverse()) {
      const tr = el("tr");
      tr.append(el("td", "", new Date(m.decided_at * 1000).toLocaleTimeString()), el("td", "", m.instance_id),
        el("td", "", m.from_role + " → " + m.to_role), el("td", "", m.reason), el("td", "", m.outcome));
      table.append(tr);
    }
    body.append(table);
  }
}

function renderRequests(s) {
  $("total-requests").textContent = String(s.totals.requests);
  const kv = $("total-kv-bytes");
  kv.textContent = bytes(s.totals.kv_bytes); kv.dataset.bytes = String(s.totals.kv_bytes);
  const body = $("requests-table").querySelector("tbody");
  body.replaceChildren();
  for (const r of s.requests) {
    const tr = el("tr");
    tr.dataset.request = r.request_id;
    const pair = r.prefill_instance ? r.prefill_instance + " → " + r.decode_instance : "local";
    for (const text of [r.request_id, String(r.prompt_tokens), String(r.output_tokens), ms(r.ttft_s), ms(r.mean_itl_s), pair,
      r.kv_bytes ? bytes(r.kv_bytes) : "–", r.kv_bytes ? ms(r.transfer_s) : "–", r.kv_bytes ? ms(r.exposed_s) : "–",
      r.error ? "error" : r.finish_reason]) tr.append(el("td", "", text));
    if (r.error) tr.title = r.error;
    body.append(tr);
  }
}

// ---- the Controls panel -----------------------------------------------------------------------
// A server's answer to a control (a 4xx's message too) is written next to that control, so a
// refused call is a line on the page, never an uncaught rejection.
function runControl(button, errorId, call, onDone) {
  button.disabled = true;
  $(errorId).textContent = "";
  return call()
    .then((answer) => { if (onDone) onDone(answer); })
    .catch((err) => { $(errorId).textContent = err.message; })
    .finally(() => { button.disabled = false; });
}

function linkCapRow(instance) {
  const row = el("div", "cap-row");
  row.dataset.instance = instance;
  const input = el("input", "cap-gbps");
  Object.assign(input, {type: "number", min: "0", step: "any", placeholder: "Gbit/s"});
  const set = el("button", "cap-set", "set cap"), lift = el("button", "cap-lift", "lift");
  const state = el("span", "muted cap-state", "uncapped"), error = el("span", "error");
  error.id = "cap-error-" + instance;
  const done = (a) => { state.textContent = a.gbps === null ? "uncapped" : "capped at " + a.gbps + " Gbit/s"; row.dataset.gbps = String(a.gbps); };
  // an empty box would be sent as null, which lifts the cap: say so here instead
  const gbps = () => (input.value === "" || !Number.isFinite(Number(input.value)) ? Promise.reject(new Error("gbps: give a number of Gbit/s"))
    : controls.setLinkCap(instance, Number(input.value)));
  set.addEventListener("click", () => runControl(set, error.id, gbps, done));
  lift.addEventListener("click", () => runControl(lift, error.id, () => controls.setLinkCap(instance, null), done));
  row.append(el("span", "", instance + " →"), input, set, lift, state, error);
  return row;
}

function renderControls(s) {
  const c = s.controls || {};
  $("controls-panel").hidden = !(c.cluster_mode || c.link_cap || c.load || c.controller);
  $("flip-form").hidden = !c.cluster_mode;
  $("link-caps").hidden = !c.link_cap;
  $("load-form").hidden = !c.load;
  $("ctl-form").hidden = !c.controller;
  const rows = $("link-cap-rows"), prefill = new Set(s.pools.prefill.map((r) => r.instance));
  for (const row of Array.from(rows.children)) if (!prefill.has(row.dataset.instance)) row.remove();
  for (const instance of prefill) {
    if (!rows.querySelector('.cap-row[data-instance="' + CSS.escape(instance) + '"]')) rows.append(linkCapRow(instance));
  }
  if (!prefill.size && !rows.children.length) rows.append(el("div", "muted", "no prefill instance"));
  const on = $("ctl-on");
  if (document.activeElement !== on && on.dataset.dirty !== "1") on.checked = !!s.controller;
  if (c.load && !loadPolled) { loadPolled = true; pollLoad(); }
}

let loadPolled = false, loadTimer = null;
/** GET /admin/load once, show it, and again a second later while the run goes on. */
function pollLoad() {
  clearTimeout(loadTimer);
  api("/admin/load").then((r) => r.json()).then((p) => {
    showLoad(p);
    if (p.state === "running") loadTimer = setTimeout(pollLoad, 1000);
  }).catch((err) => { $("load-error").textContent = err.message; });
}

function showLoad(p) {
  const out = $("load-progress");
  out.dataset.state = p.state;
  out.dataset.run = p.run;  // a new tag per run: a run that ended before a reader looked is still told apart
  out.dataset.completed = String(p.completed);
  if (p.state === "idle") { out.textContent = "no load run yet"; return; }
  out.textContent = p.state + (p.reason ? " (" + p.reason + ")" : "") + " · " + p.workload + " · sent " + p.sent +
    " / " + p.num_requests + ", completed " + p.completed + ", failed " + p.failed + " · " + p.elapsed_s.toFixed(1) +
    " of " + p.duration_s + " s · TTFT P90 " + ms(p.ttft_s.p90) + " · ITL P90 " + ms(p.itl_s.p90);
}

function wireControls() {
  $("flip-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const mode = $("flip-colocated").checked ? "colocated" : "split";
    $("flip-result").textContent = "switching…";
    runControl($("flip-apply"), "flip-error", () => controls.flipCluster(mode, Number($("flip-prefill").value)),
      (r) => { $("flip-result").textContent = r.prefill + "P:" + r.decode + "D + " + r.both + " colocated, " + r.switches.length + " switches (" + r.total_s.toFixed(2) + " s)"; })
      .then(() => { if ($("flip-error").textContent) $("flip-result").textContent = ""; });
  });
  $("load-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const spec = {workload: $("load-workload").value, num_requests: Number($("load-count").value), duration_s: Number($("load-duration").value)};
    spec[$("load-arrivals").value] = Number($("load-value").value);
    runControl($("load-start"), "load-error", () => controls.startLoad(spec), (p) => { showLoad(p); pollLoad(); });
  });
  $("load-stop").addEventListener("click", () => runControl($("load-stop"), "load-error", () => controls.stopLoad(), (p) => { showLoad(p); pollLoad(); }));
  $("ctl-on").addEventListener("change", () => { $("ctl-on").dataset.dirty = "1"; });
  $("ctl-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const slo = {ttft_ms: Number($("ctl-ttft").value), itl_ms: Number($("ctl-itl").value)};
    runControl($("ctl-apply"), "ctl-error", () => controls.setController($("ctl-on").checked, slo),
      () => { $("ctl-on").dataset.dirty = ""; });
  });
}

// ---- wiring -------------------------------------------------------------------------------
function showView(view) {
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.view === view);
  $("view-live").hidden = view !== "live";
  $("view-plan").hidden = view !== "plan";
}

document.addEventListener("DOMContentLoaded", () => {
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => showView(tab.dataset.view));
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORAGE, $("key-input").value);
    $("key-input").value = "";
    $("key-dialog").hidden = true;
    stream();
  });
  $("key-change").addEventListener("click", () => askForKey(""));
  for (const id of ["slo-ttft", "slo-itl"]) $(id).addEventListener("input", () => { $(id).dataset.dirty = "1"; });
  $("slo-form").addEventListener("submit", (event) => {
    event.preventDefault();
    controls.setSlo(Number($("slo-ttft").value), Number($("slo-itl").value))
      .then(() => { $("slo-ttft").dataset.dirty = ""; $("slo-itl").dataset.dirty = ""; showMessage("SLO set"); })
      .catch((err) => showMessage("SLO: " + err.message));
  });
  wireControls();
  stream();
});
