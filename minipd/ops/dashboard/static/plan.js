// minipd dashboard, the planner's parts: the Plan view (POST /dashboard/plan) and the Live
// view's prediction next to measurement (POST /dashboard/prediction). Both are answered by the
// router's plan worker, which runs the simulator out of the router's process.
// Uses dashboard.js's helpers (api, postJSON, $, el, ms, bytes, pct, latest), loaded before it.
"use strict";

const PLAN_DEBOUNCE_MS = 120; // a slider dragged sends one request per pause, not one per pixel
const PREDICTION_EVERY_MS = 3000;
const NS_SVG = "http://www.w3.org/2000/svg";
const plan = {profileJson: null, profileFile: null, inFlight: false, again: false, timer: null, last: null, started: false};

// ---- inputs ------------------------------------------------------------------------------
function planLinkGbps() { return Math.pow(10, Number($("plan-link").value)); }
function roundGbps(g) { return g >= 100 ? Math.round(g) : g >= 10 ? +g.toFixed(1) : +g.toPrecision(2); }

function planBody() {
  const n = Number($("plan-instances").value);
  const body = {
    num_instances: n,
    mode: n === 1 ? "colocated" : $("plan-mode").value,
    num_prefill: Math.min(Math.max(1, Number($("plan-prefill").value)), Math.max(1, n - 1)),
    workload: $("plan-workload").value,
    rate_rps: Number($("plan-rate").value),
    ttft_ms: Number($("plan-ttft").value),
    itl_ms: Number($("plan-itl").value),
  };
  const prompt = $("plan-prompt-len").value.trim(), output = $("plan-output-len").value.trim();
  if (prompt) body.prompt_len = prompt;
  if (output) body.output_len = output;
  if (!$("plan-link-profile").checked) body.link_gbps = roundGbps(planLinkGbps());
  Object.assign(body, planProfile());
  return body;
}

/** The profile chosen: a file read on the page, the server's --plan-profile ("flag") or a built-in. */
function planProfile() {
  const choice = $("plan-profile").value;
  if (choice === "page-file" && plan.profileJson) return {profile_json: plan.profileJson};
  return {profile: choice || "llama3-8b-h100"};
}

function syncOutputs() {
  const n = Number($("plan-instances").value), split = $("plan-prefill");
  split.max = String(Math.max(1, n - 1));
  split.disabled = n === 1;
  if (Number(split.value) > n - 1) split.value = String(Math.max(1, n - 1));
  const p = Number(split.value);
  $("plan-instances-out").textContent = String(n);
  $("plan-prefill-out").textContent = n > 1 ? p + "P:" + (n - p) + "D" : "–";
  $("plan-rate-out").textContent = $("plan-rate").value;
  $("plan-ttft-out").textContent = $("plan-ttft").value;
  $("plan-itl-out").textContent = $("plan-itl").value;
  $("plan-link").disabled = $("plan-link-profile").checked;
  $("plan-link-out").textContent = $("plan-link-profile").checked ? "profile's" : String(roundGbps(planLinkGbps()));
}

// ---- the call: one in flight, the newest inputs sent once it returns --------------------------
function schedulePlan() {
  syncOutputs();
  clearTimeout(plan.timer);
  plan.timer = setTimeout(runPlan, PLAN_DEBOUNCE_MS);
}

function runPlan() {
  if (plan.inFlight) { plan.again = true; return; }
  plan.inFlight = true;
  const body = planBody(), sent = performance.now();
  $("plan-panel").dataset.state = "computing";
  // the bars first; then the link search, whose runs of the bars come from the worker's cache
  postJSON("/dashboard/plan", Object.assign({}, body, {link_search: false}))
    .then((answer) => {
      $("plan-error").textContent = "";
      drawPlan(answer, body, performance.now() - sent);
      if (body.num_instances < 2 || plan.again) return null;
      return postJSON("/dashboard/plan", body).then((full) => drawLink(full, performance.now() - sent));
    })
    .catch((err) => { $("plan-error").textContent = err.message; $("plan-panel").dataset.state = "error"; })
    .finally(() => {
      plan.inFlight = false;
      if (plan.again) { plan.again = false; runPlan(); }
    });
}

// ---- drawing ------------------------------------------------------------------------------
function drawPlan(a, body, roundTripMs) {
  plan.last = a;
  plan.barsMs = roundTripMs;
  plan.barsTiming = a.timing;
  const s = a.selected, slo = {ttft: body.ttft_ms / 1000, itl: body.itl_ms / 1000};
  $("plan-split-label").textContent = "· " + s.label;
  for (const kind of ["ttft", "itl"]) {
    const v = $("plan-" + kind + "-p90"), p90 = s[kind].p90;
    v.textContent = ms(p90);
    v.className = "value " + (p90 === null ? "" : p90 <= slo[kind] ? "good" : "bad");
    $("plan-" + kind + "-sub").textContent = "SLO " + ms(slo[kind]) + " · P50 " + ms(s[kind].p50) + " · P99 " + ms(s[kind].p99);
  }
  const verdict = $("plan-verdict");
  verdict.textContent = a.verdict === "met" ? "yes" : "no";
  verdict.className = "value " + (a.verdict === "met" ? "good" : "bad");
  verdict.dataset.verdict = a.verdict;
  $("plan-attain").textContent = "attainment " + pct(s.attainment) + " of requests (both SLOs) · TTFT " + pct(s.ttft_share) + " · ITL gaps " + pct(s.itl_share);
  $("plan-kv").textContent = bytes(a.kv.bytes_per_request) + " · " + ms(a.kv.transfer_s);
  $("plan-kv-sub").textContent = "mean prompt " + Math.round(a.kv.mean_prompt_tokens) + " tokens · exposed " + ms(a.kv.exposed_s) +
    " · link " + (a.inputs.link_gbps === null ? "unlimited" : a.inputs.link_gbps + " Gbit/s");
  drawBars(a, slo);
  const text = $("plan-link-text");
  text.dataset.state = body.num_instances < 2 ? "none" : "searching";
  text.textContent = body.num_instances < 2 ? "one instance: no KV link" : "finding where the link breaks TTFT…";
  text.dataset.breaksBelow = "";
  $("plan-note").textContent = planNote(a, roundTripMs, null);
  $("plan-panel").dataset.drawnFor = JSON.stringify(body); // which inputs the bars show
  $("plan-panel").dataset.state = "drawn";
}

function planNote(a, barsMs, linkMs) {
  const t = plan.barsTiming;
  return "Profile " + a.profile.name + " (" + a.profile.model + " on " + a.profile.device + ", " + a.profile.source +
    "). Each bar is one simulated run of " + a.inputs.num_requests + " requests (seed 0; colocated: chunked prefill at the profile's " +
    "token budget), cached by its inputs. The bars: " + t.simulations + " runs simulated, " + t.cached + " from the cache, " +
    Math.round(t.compute_s * 1000) + " ms in the plan worker, drawn " + Math.round(barsMs) + " ms after they were asked for (the page " +
    "asks once a slider pauses for " + PLAN_DEBOUNCE_MS + " ms)" +
    (linkMs === null ? "." : "; the link point (a bisection of " + a.link.probes + " runs of " + a.link.split + ") " +
      Math.round(linkMs) + " ms after it.");
}

/** Where the link becomes the bottleneck, from the second answer (the same inputs, with the link search). */
function drawLink(a, linkMs) {
  if (!a.link) return;
  plan.last = a;
  const link = a.link, text = $("plan-link-text"), now = a.inputs.link_gbps;
  if (link.state === "found") {
    text.textContent = "The link becomes the bottleneck of " + link.split + " below " + roundGbps(link.breaks_below_gbps) +
      " Gbit/s: P90 TTFT misses its SLO there (" + roundGbps(link.fails_at_gbps) + " Gbit/s fails)" +
      (now !== null && now < link.breaks_below_gbps ? ". The link set here is below it: it is the bottleneck now." : ".");
  } else text.textContent = link.split + ": " + link.state + ".";
  text.dataset.breaksBelow = link.breaks_below_gbps !== null ? String(link.breaks_below_gbps) : "";
  text.dataset.state = link.state;
  $("plan-note").textContent = planNote(a, plan.barsMs, linkMs);
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(NS_SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function drawBars(a, slo) {
  const box = $("plan-bars"), w = Number(box.getAttribute("width")), h = Number(box.getAttribute("height"));
  const pad = {l: 40, r: 10, t: 16, b: 40}, n = a.bars.length, slot = (w - pad.l - pad.r) / n;
  const top = 3; // bars are drawn as a multiple of their SLO, clipped at 3x
  const y = (ratio) => h - pad.b - (Math.min(ratio, top) / top) * (h - pad.t - pad.b);
  box.replaceChildren();
  a.bars.forEach((b, i) => {
    const x = pad.l + i * slot, g = svg("g", {class: "plan-bar", "data-label": b.label, "data-green": String(b.green),
      "data-ttft-p90": String(b.ttft.p90), "data-itl-p90": String(b.itl.p90), "data-attainment": String(b.attainment)});
    if (b.green) g.append(svg("rect", {x: x + 1, y: pad.t, width: slot - 2, height: h - pad.t - pad.b, fill: "rgba(47,191,113,.16)", class: "green-zone"}));
    if (b.label === a.selected.label) g.append(svg("rect", {x: x + 1, y: pad.t, width: slot - 2, height: h - pad.t - pad.b, fill: "none", stroke: "#8b95a3", "stroke-dasharray": "3 3"}));
    const bw = Math.max(3, slot * 0.3);
    for (const [k, kind, color] of [[0, "ttft", "#e0af68"], [1, "itl", "#7aa2f7"]]) {
      const v = b[kind].p90, ratio = v === null ? 0 : v / slo[kind];
      const bx = x + slot * 0.18 + k * (bw + 2);
      g.append(svg("rect", {x: bx, y: y(ratio), width: bw, height: h - pad.b - y(ratio), fill: ratio <= 1 ? color : "#e5484d", class: "bar-" + kind}));
    }
    g.append(svg("text", {x: x + slot / 2, y: h - pad.b + 14, "text-anchor": "middle", class: b.green ? "good" : ""}, b.label.replace("colocated x", "coloc ")));
    g.append(svg("text", {x: x + slot / 2, y: h - pad.b + 28, "text-anchor": "middle", class: "muted"}, pct(b.attainment)));
    box.append(g);
  });
  box.append(svg("line", {x1: pad.l, x2: w - pad.r, y1: y(1), y2: y(1), stroke: "#e5484d", "stroke-dasharray": "6 4"}));
  box.append(svg("text", {x: 2, y: y(1) + 3, class: "muted"}, "SLO"));
  box.append(svg("text", {x: 2, y: pad.t + 3, class: "muted"}, "3×"));
  box.append(svg("text", {x: w - pad.r - 230, y: 11, class: "muted"}, "■ TTFT P90  ■ ITL P90 (÷ SLO; red: over it)"));
}

// ---- the profile choice --------------------------------------------------------------------
function fillProfiles(p) {
  const select = $("plan-profile");
  select.replaceChildren();
  if (p.flag) { const o = el("option", "", "--plan-profile: " + p.flag.name + " (" + p.flag.model + ", " + p.flag.device + ")"); o.value = "flag"; select.append(o); }
  for (const name of p.builtin) { const o = el("option", "", name); o.value = name; select.append(o); }
  const file = el("option", "", "a file chosen here"); file.value = "page-file"; file.disabled = true; file.id = "plan-profile-page";
  select.append(file);
  select.value = p.flag ? "flag" : "llama3-8b-h100";
}

function readProfileFile(input) {
  const f = input.files && input.files[0];
  if (!f) return;
  f.text().then((text) => {
    plan.profileJson = text; plan.profileFile = f.name;
    const o = $("plan-profile-page");
    o.disabled = false; o.textContent = "file: " + f.name;
    $("plan-profile").value = "page-file";
    schedulePlan();
  }).catch((err) => { $("plan-error").textContent = "profile file: " + err.message; });
}

function startPlan() {
  if (latest && latest.controls && !latest.controls.plan) {
    $("plan-error").textContent = "This server has no planner: the Plan view is the router's (minipd --role router or cluster with --http-port).";
    return;
  }
  if (plan.started) { schedulePlan(); return; }
  plan.started = true;
  api("/dashboard/plan/profiles").then((r) => r.ok ? r.json() : Promise.reject(new Error("profiles: " + r.status)))
    .then((p) => { fillProfiles(p); schedulePlan(); })
    .catch((err) => { plan.started = false; $("plan-error").textContent = err.message; });
}

// ---- the Live view's prediction --------------------------------------------------------------
function predictionRows(p) {
  const rows = [];
  for (const kind of ["ttft", "itl"]) for (const q of ["p50", "p90", "p99"]) {
    const m = p.measured[kind][q], s = p.predicted ? p.predicted[kind][q] : null, e = p.error ? p.error[kind][q] : null;
    rows.push([kind.toUpperCase() + " " + q.toUpperCase(), ms(m), ms(s), e === null ? "–" : (e >= 0 ? "+" : "−") + ms(Math.abs(e)) +
      (m ? " (" + (e >= 0 ? "+" : "") + (100 * e / m).toFixed(0) + "%)" : ""), kind + "_" + q]);
  }
  for (const kind of ["ttft", "itl"]) {
    const m = p.measured[kind + "_share"], s = p.predicted ? p.predicted[kind + "_share"] : null, e = p.error ? p.error[kind + "_share"] : null;
    rows.push([(kind === "ttft" ? "TTFT" : "ITL") + " attainment", pct(m), pct(s), e === null ? "–" : (e >= 0 ? "+" : "") + (100 * e).toFixed(1) + " pts", kind + "_share"]);
  }
  return rows;
}

function drawPrediction(p) {
  const panel = $("prediction-panel"), state = $("prediction-state"), body = $("prediction-table").querySelector("tbody");
  panel.dataset.state = p.state;
  const prof = p.profile;
  $("prediction-profile").textContent = prof ? "profile " + prof.name + " (" + prof.model + ", " + prof.device + ", " + prof.source +
    "; " + ($("plan-profile").value === "flag" || !plan.started ? "--plan-profile" : "chosen in the Plan view") + ")" : "";
  body.replaceChildren();
  if (p.state !== "ok") {
    state.textContent = p.state === "no fit" ? "No prediction: " + p.reason + ". Give a profile of this cluster (--plan-profile, or a file in the Plan view)."
      : p.state === "no profile" ? "No prediction: " + p.reason + "." : "No prediction yet: " + p.reason + ".";
    return;
  }
  const m = p.measured, c = m.cluster;
  state.textContent = "The simulator's " + p.predicted.split + " at the measured " + m.rate_rps.toFixed(2) + " req/s, prompts of " +
    Math.round(m.mean_prompt_tokens) + " and outputs of " + Math.round(m.mean_output_tokens) + " tokens on average (the last " +
    m.lengths.length + " requests' lengths), " + p.predicted.num_requests + " simulated requests; measured over " + m.requests +
    " requests of the window (" + c.prefill + "P:" + c.decode + "D" + (c.colocated ? " + " + c.colocated + " colocated" : "") + ").";
  for (const [label, measured, predicted, error, key] of predictionRows(p)) {
    const tr = el("tr");
    tr.dataset.row = key;
    tr.append(el("th", "", label), el("td", "measured", measured), el("td", "predicted", predicted), el("td", "error", error));
    body.append(tr);
  }
}

function pollPrediction() {
  const live = !$("view-live").hidden;
  if (live && latest && latest.controls && latest.controls.plan) {
    $("prediction-panel").hidden = false;
    const choice = $("plan-profile").value;
    const body = !plan.started || !choice ? {} : choice === "page-file" ? {profile_json: plan.profileJson} : {profile: choice};
    postJSON("/dashboard/prediction", body).then(drawPrediction)
      .catch((err) => { $("prediction-state").textContent = "prediction: " + err.message; })
      .finally(() => setTimeout(pollPrediction, PREDICTION_EVERY_MS));
    return;
  }
  setTimeout(pollPrediction, PREDICTION_EVERY_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  $("tab-plan").addEventListener("click", startPlan);
  for (const id of ["plan-instances", "plan-prefill", "plan-rate", "plan-ttft", "plan-itl", "plan-link"]) $(id).addEventListener("input", schedulePlan);
  for (const id of ["plan-mode", "plan-workload", "plan-prompt-len", "plan-output-len", "plan-link-profile", "plan-profile"]) $(id).addEventListener("change", schedulePlan);
  $("plan-profile-file").addEventListener("change", (event) => readProfileFile(event.target));
  $("plan-form").addEventListener("submit", (event) => { event.preventDefault(); schedulePlan(); });
  syncOutputs();
  setTimeout(pollPrediction, 1000);
});
