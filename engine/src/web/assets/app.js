// Caudal web UI: plain JavaScript over the REST API (/api/v1, see /api/v1/openapi.json).
// Pages: "/" lists the jobs; "/jobs/<name>" shows one job. Both refresh every second.
"use strict";

const POLL_MS = 1000;
const HISTORY_SECS = 120;
const PALETTE = ["#2563eb", "#0d9488", "#d97706", "#7c3aed", "#db2777", "#059669", "#dc2626", "#0891b2", "#65a30d", "#9333ea"];

// ---------- helpers ----------

const $ = (sel, root) => (root || document).querySelector(sel);

function esc(v) {
  return String(v).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function fmtInt(n) {
  return n == null ? "—" : Number(n).toLocaleString("en-US");
}

function fmtRate(r) {
  if (r == null) return "—";
  if (r >= 1e6) return (r / 1e6).toFixed(r >= 1e7 ? 0 : 1) + "M";
  if (r >= 1e4) return (r / 1e3).toFixed(r >= 1e5 ? 0 : 1) + "k";
  if (r >= 100) return Math.round(r).toLocaleString("en-US");
  if (r >= 10) return r.toFixed(1);
  return r === 0 ? "0" : r.toFixed(2);
}

function fmtPct(x) {
  if (x == null) return "—";
  return x > 0 && x < 0.005 ? "<1%" : Math.round(x * 100) + "%";
}

function fmtDuration(ms) {
  if (ms == null) return "—";
  let s = Math.max(0, Math.floor(ms / 1000));
  const d = Math.floor(s / 86400); s %= 86400;
  const h = Math.floor(s / 3600); s %= 3600;
  const m = Math.floor(s / 60); s %= 60;
  if (d) return `${d}d ${h}h ${m}m`;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m ${String(s).padStart(2, "0")}s`;
  if (m) return `${m}m ${String(s).padStart(2, "0")}s`;
  return `${s}s`;
}

function pad2(n) { return String(n).padStart(2, "0"); }

function fmtClock(ms, withMs) {
  const d = new Date(ms);
  const t = `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
  return withMs ? `${t}.${String(d.getMilliseconds()).padStart(3, "0")}` : t;
}

function fmtDateTime(ms) {
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${fmtClock(ms)}`;
}

function fmtWatermark(wm, state) {
  if (state === "ENDED") return "end of input";
  if (wm == null) return "no watermark yet";
  const now = Date.now();
  return Math.abs(now - wm) < 86400000 ? fmtClock(wm, true) : `${fmtDateTime(wm)}`;
}

function fmtLag(ms) {
  if (ms == null) return "—";
  const a = Math.abs(ms);
  if (a < 1000) return `${ms} ms`;
  if (a < 120000) return `${(ms / 1000).toFixed(1)} s`;
  return fmtDuration(ms);
}

function fmtBytes(b) {
  if (b == null) return "—";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0, v = b;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(i ? 1 : 0)} ${u[i]}`;
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, init) {
  let r;
  try {
    r = await fetch("/api/v1" + path, Object.assign({ cache: "no-store" }, init || {}));
  } catch (e) {
    throw new ApiError(0, "cannot reach the server");
  }
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new ApiError(r.status, body.error || r.statusText);
  return body;
}

function jobUrl(name) { return "/jobs/" + encodeURIComponent(name); }

function badge(status) { return `<span class="badge ${esc(status)}">${esc(status)}</span>`; }

function kindTag(kind) { return `<span class="kind ${esc(kind)}">${esc(kind)}</span>`; }

function setLive(ok, text) {
  const el = $("#live");
  el.className = "live " + (ok ? "ok" : "bad");
  $(".live-text", el).textContent = text;
}

function setCrumbs(html) { $("#crumbs").innerHTML = html; }

let toastTimer = null;
function toast(msg) {
  const t = $("#toast");
  t.textContent = msg;
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.hidden = true; }, 3500);
}

function empty(title, text) {
  return `<div class="empty"><strong>${esc(title)}</strong>${esc(text)}</div>`;
}

// Busy ratio 0..1 → fill colour: light blue (idle) → amber → red (busy).
function busyColour(x) {
  const stops = [[0, [232, 241, 253]], [0.5, [253, 230, 186]], [1, [248, 170, 170]]];
  const v = Math.max(0, Math.min(1, x || 0));
  let i = 0;
  while (i < stops.length - 2 && v > stops[i + 1][0]) i++;
  const [a, ca] = stops[i], [b, cb] = stops[i + 1];
  const t = (v - a) / (b - a);
  const c = ca.map((x0, k) => Math.round(x0 + (cb[k] - x0) * t));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function kindColour(kind) {
  return kind === "source" ? "#0d9488" : kind === "sink" ? "#7c3aed" : "#2563eb";
}

// The rate that best describes an operator: what it emits (sinks: what they take in).
function opRate(m) {
  if (!m) return null;
  return m.kind === "sink" ? m.records_in_per_sec : m.records_out_per_sec;
}

// ---------- polling ----------

let pollTimer = null;
let pageToken = 0;

function startPolling(tick) {
  const token = ++pageToken;
  clearTimeout(pollTimer);
  const loop = async () => {
    if (token !== pageToken) return;
    let delay = POLL_MS;
    try {
      await tick();
      setLive(true, "live · updated " + fmtClock(Date.now()));
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) throw e;
      setLive(false, e.status === 0 ? "disconnected · retrying" : "error · " + e.message);
      delay = 2 * POLL_MS;
    }
    if (token === pageToken) pollTimer = setTimeout(loop, delay);
  };
  loop().catch((e) => showNotFound(e));
}

function showNotFound(e) {
  setLive(true, "live");
  $("#app").innerHTML = `<section class="card">${empty("Not found", " " + e.message + ".")}<p class="empty"><a href="/">All jobs</a></p></section>`;
}

// ---------- overview ----------

function overviewPage() {
  document.title = "Jobs · Caudal";
  setCrumbs(`<span class="here">Jobs</span>`);
  $("#app").innerHTML = `
    <div class="page-head"><div><div class="eyebrow">Overview</div><h1>Jobs</h1>
      <div class="meta">Every job this server shows. Click one for its graph, rates, watermarks and checkpoints.</div></div></div>
    <section class="card" id="jobs-card"><div id="jobs-table"><p class="empty">Loading…</p></div></section>
    <section class="card" id="tms-card" hidden><div class="card-head"><h2>Task managers</h2><span class="hint" id="tms-meta"></span></div><div id="tms-table"></div></section>
    <p class="footnote">REST API: <a href="/api/v1/jobs">/api/v1/jobs</a> · described by <a href="/api/v1/openapi.json">/api/v1/openapi.json</a>
      · Prometheus: <a href="/metrics">/metrics</a></p>`;
  startPolling(async () => {
    const list = await api("/jobs");
    const metrics = await Promise.all(list.jobs.map((j) => api(jobUrl(j.name) + "/metrics").catch(() => null)));
    renderJobList(list.jobs, metrics);
    // A job manager answers /cluster; an embedded job does not (asked once, then never).
    if (clusterMode !== false) {
      try {
        renderTaskManagers(await api("/cluster"));
        clusterMode = true;
      } catch (e) {
        if (e instanceof ApiError && e.status === 404) clusterMode = false; else throw e;
      }
    }
  });
}

let clusterMode;

function renderTaskManagers(c) {
  $("#tms-card").hidden = false;
  const used = c.slots_total - c.slots_free;
  const rows = c.task_managers.map((t) => {
    const late = t.last_heartbeat_ms_ago > 2000;
    return `<tr>
      <td><strong>${esc(t.name)}</strong></td>
      <td>${esc(t.location)}</td>
      <td class="num">${t.slots - t.free_slots} / ${t.slots}</td>
      <td>${t.executors.length ? t.executors.map(esc).join("<br>") : '<span class="muted">idle</span>'}</td>
      <td class="num${late ? " warn" : ""}">${fmtInt(t.last_heartbeat_ms_ago)} ms ago</td>
      <td>${fmtDateTime(t.registered_ms)}</td></tr>`;
  }).join("");
  $("#tms-meta").textContent = `${c.task_managers.length} task manager(s) · ${used} of ${c.slots_total} slots in use`
    + ` · control port ${c.rpc_addr} · checkpoints in ${c.checkpoint_url}`;
  $("#tms-table").innerHTML = (c.task_managers.length ? `<table id="task-managers"><thead><tr><th>Name</th><th>Location</th><th class="num">Slots used</th>
      <th>Executors</th><th class="num">Last heartbeat</th><th>Registered</th></tr></thead><tbody>${rows}</tbody></table>`
      : empty("No task manager", " Start one with caudal taskmanager --jobmanager URL."));
}

function renderJobList(jobs, metrics) {
  if (!jobs.length) {
    $("#jobs-table").innerHTML = empty("No jobs", " This server shows no job yet.");
    return;
  }
  const rows = jobs.map((j, i) => {
    const m = metrics[i];
    const sum = (kind, f) => m ? m.operators.filter((o) => o.kind === kind).reduce((s, o) => s + (o[f] || 0), 0) : null;
    return `<tr>
      <td><a href="${jobUrl(j.name)}"><strong>${esc(j.name)}</strong></a></td>
      <td>${badge(j.status)}</td>
      <td>${fmtDateTime(j.start_ms)}</td>
      <td class="num">${fmtDuration(j.duration_ms)}</td>
      <td class="num">${j.operators} / ${j.tasks}</td>
      <td class="num">${fmtRate(sum("source", "records_out_per_sec"))}</td>
      <td class="num">${fmtRate(sum("sink", "records_in_per_sec"))}</td>
      <td class="num">${j.failures}</td></tr>`;
  }).join("");
  $("#jobs-table").innerHTML = `<table id="jobs"><thead><tr><th>Job</th><th>Status</th><th>Started</th><th class="num">Duration</th>
    <th class="num">Operators / tasks</th><th class="num">In rec/s</th><th class="num">Out rec/s</th><th class="num">Failures</th></tr></thead>
    <tbody>${rows}</tbody></table>`;
}

// ---------- job page ----------

function jobPage(name) {
  document.title = name + " · Caudal";
  setCrumbs(`<a href="/">Jobs</a><span class="sep">/</span><span class="here">${esc(name)}</span>`);
  $("#app").innerHTML = `
    <div class="page-head">
      <div><div class="eyebrow">Job</div><h1 id="job-name">${esc(name)}</h1><div class="meta" id="job-meta"></div></div>
      <div class="actions"><span id="job-status"></span><button id="cancel-btn" class="btn danger" type="button">Cancel job</button></div>
    </div>
    <div id="banner"></div>
    <div class="tiles" id="tiles"></div>
    <section class="card" id="graph-card">
      <div class="card-head"><h2>Job graph</h2>
        <div class="legend">idle<span class="grad" style="background:linear-gradient(90deg,${busyColour(0)},${busyColour(0.5)},${busyColour(1)})"></span>busy
          <span><span class="sw" style="background:#1e1b4b"></span>BP: backpressured</span>
          <span><svg width="26" height="8" aria-hidden="true"><path d="M1,4 H25" stroke="#94a3b8" stroke-width="1.6" stroke-dasharray="5 4"/></svg> chained</span>
          <span><svg width="26" height="8" aria-hidden="true"><path d="M1,4 H25" stroke="#64748b" stroke-width="2"/></svg> network</span></div></div>
      <div class="graph-wrap"><svg id="job-graph" role="img" aria-label="Operator graph"></svg></div>
    </section>
    <section class="card" id="rates-card">
      <div class="card-head"><h2>Throughput</h2><span class="hint">records per second out of each operator (sinks: in), last ${HISTORY_SECS / 60} minutes</span></div>
      <div class="chart-wrap"><svg id="rates-chart" role="img" aria-label="Records per second over time"></svg></div>
      <div id="rates-legend" class="series-legend"></div>
    </section>
    ${kafkaCardHtml()}
    ${transactionsCardHtml()}
    ${stateCardHtml()}
    <section class="card" id="operators-card">
      <div class="card-head"><h2>Operators</h2><span class="hint">rates and ratios over the last second · ▸ shows subtasks</span></div>
      <div id="operators-table"></div>
    </section>
    <section class="card" id="watermarks-card">
      <div class="card-head"><h2>Watermarks</h2><span class="hint">input watermark per operator and subtask; highlighted: the subtask holding the minimum</span></div>
      <div id="watermarks-table"></div>
    </section>
    <div class="grid-2">
      <section class="card" id="checkpoints-card"><div class="card-head"><h2>Checkpoints</h2><span class="hint" id="checkpoint-counts"></span></div><svg id="checkpoint-chart" role="img" aria-label="Checkpoint durations"></svg><div id="checkpoints-table"></div></section>
      <section class="card" id="failures-card"><div class="card-head"><h2>Failures</h2></div><div id="failures"></div></section>
    </div>`;

  const state = { name, layout: null, planKey: "", expanded: new Set(), status: null };
  initStatePanel(name); // state.js
  $("#cancel-btn").addEventListener("click", async () => {
    if (!window.confirm(`Cancel job "${name}"? Sources stop and sinks flush.`)) return;
    try {
      await api(jobUrl(name) + "/cancel", {
        method: "POST", headers: { "Content-Type": "application/json" }, body: "{}",
      });
      toast("Cancellation requested");
    } catch (e) {
      toast("Cancel failed: " + e.message);
    }
  });
  $("#operators-table").addEventListener("click", (ev) => {
    const b = ev.target.closest("[data-toggle]");
    if (!b) return;
    const id = Number(b.dataset.toggle);
    if (state.expanded.has(id)) state.expanded.delete(id); else state.expanded.add(id);
    if (state.last) renderOperators(state, state.last.detail, state.last.metrics);
  });

  const base = jobUrl(name);
  startPolling(async () => {
    const [detail, metrics, watermarks, checkpoints, kafka, keyed, txns] = await Promise.all([
      api(base), api(base + "/metrics?history=" + HISTORY_SECS), api(base + "/watermarks"), api(base + "/checkpoints"),
      api(base + "/kafka?history=" + HISTORY_SECS), api(base + "/state"), api(base + "/transactions"),
    ]);
    state.last = { detail, metrics };
    renderJob(state, detail, metrics, watermarks, checkpoints);
    renderKafka(kafka); // kafka.js
    renderTransactions(txns); // kafka.js
    renderStateOverview(keyed); // state.js
  });
}

function renderJob(state, detail, metrics, watermarks, checkpoints) {
  $("#job-status").innerHTML = badge(detail.status);
  const finished = ["FINISHED", "CANCELED", "FAILED"].includes(detail.status);
  $("#cancel-btn").disabled = finished;
  $("#job-meta").innerHTML = `<span>started ${fmtDateTime(detail.start_ms)}</span><span>running for ${fmtDuration(detail.duration_ms)}</span>
    <span>${detail.operators.length} operators in ${detail.tasks.length} tasks</span><span>max parallelism ${detail.max_parallelism}</span>`;
  renderTiles(detail, metrics, watermarks, checkpoints);
  const planKey = JSON.stringify([detail.operators, detail.edges]);
  if (planKey !== state.planKey) {
    state.planKey = planKey;
    state.layout = layoutGraph(detail.operators, detail.edges);
  }
  renderGraph(state.layout, detail, metrics);
  renderChart(metrics);
  renderOperators(state, detail, metrics);
  renderWatermarks(watermarks);
  renderCheckpoints(checkpoints);
  renderFailures(detail.failures);
}

function renderTiles(detail, metrics, watermarks, checkpoints) {
  const ops = metrics.operators;
  const sum = (kind, f) => ops.filter((o) => o.kind === kind).reduce((s, o) => s + (o[f] || 0), 0);
  const hasRates = ops.some((o) => o.records_out_per_sec != null);
  const active = watermarks.operators.filter((o) => o.state === "ACTIVE" && o.lag_ms != null);
  const slowest = active.reduce((a, o) => (a == null || o.lag_ms > a.lag_ms ? o : a), null);
  const busiest = ops.reduce((a, o) => (o.busy_ratio != null && (a == null || o.busy_ratio > a.busy_ratio) ? o : a), null);
  const maxP = Math.max(...detail.operators.map((o) => o.parallelism));
  const tiles = [
    ["Input", hasRates ? fmtRate(sum("source", "records_out_per_sec")) + " /s" : "—", fmtInt(sum("source", "records_out")) + " records read"],
    ["Output", hasRates ? fmtRate(sum("sink", "records_in_per_sec")) + " /s" : "—", fmtInt(sum("sink", "records_in")) + " records written"],
    ["Busiest", busiest ? fmtPct(busiest.busy_ratio) : "—", busiest ? busiest.name : "no sample yet"],
    ["Watermark lag", slowest ? fmtLag(slowest.lag_ms) : "—", slowest ? "at " + slowest.name : "no event time yet"],
    ["Checkpoints", fmtInt(checkpoints.counts.completed), checkpoints.counts.failed ? checkpoints.counts.failed + " failed" : "completed"],
    ["Parallelism", String(maxP), `${detail.tasks.length} tasks · ${detail.failures.length} failures`],
  ];
  $("#tiles").innerHTML = tiles.map(([l, v, s]) =>
    `<div class="tile"><div class="label">${esc(l)}</div><div class="value">${esc(v)}</div><div class="sub" title="${esc(s)}">${esc(s)}</div></div>`).join("");
}

// ---------- the graph: layered layout, left to right ----------

const NODE_W = 158, NODE_H = 68, GAP_X = 54, GAP_Y = 24, PAD = 14;

function layoutGraph(ops, edges) {
  const ids = ops.map((o) => o.id);
  const preds = new Map(ids.map((i) => [i, []]));
  const succs = new Map(ids.map((i) => [i, []]));
  for (const e of edges) {
    if (preds.has(e.to) && succs.has(e.from)) { preds.get(e.to).push(e.from); succs.get(e.from).push(e.to); }
  }
  // Longest-path layering over a topological order (Kahn).
  const indeg = new Map(ids.map((i) => [i, preds.get(i).length]));
  const queue = ids.filter((i) => indeg.get(i) === 0);
  const layer = new Map(ids.map((i) => [i, 0]));
  const order = [];
  while (queue.length) {
    const v = queue.shift();
    order.push(v);
    for (const w of succs.get(v)) {
      layer.set(w, Math.max(layer.get(w), layer.get(v) + 1));
      indeg.set(w, indeg.get(w) - 1);
      if (indeg.get(w) === 0) queue.push(w);
    }
  }
  for (const i of ids) if (!order.includes(i)) order.push(i); // a cycle would be a bug; still draw it
  const nLayers = Math.max(0, ...layer.values()) + 1;
  const layers = Array.from({ length: nLayers }, () => []);
  for (const v of order) layers[layer.get(v)].push(v);
  // Reduce crossings: a few barycentre sweeps, down then up.
  const pos = new Map();
  const index = () => layers.forEach((l) => l.forEach((v, k) => pos.set(v, k)));
  index();
  const bary = (v, nbrs) => {
    const n = nbrs.get(v);
    return n.length ? n.reduce((s, u) => s + pos.get(u), 0) / n.length : pos.get(v);
  };
  for (let sweep = 0; sweep < 4; sweep++) {
    const down = sweep % 2 === 0;
    const range = down ? layers.slice(1) : layers.slice(0, -1).reverse();
    for (const l of range) {
      const key = new Map(l.map((v) => [v, bary(v, down ? preds : succs)]));
      l.sort((a, b) => key.get(a) - key.get(b) || a - b);
      l.forEach((v, k) => pos.set(v, k));
    }
  }
  const tallest = Math.max(1, ...layers.map((l) => l.length));
  const height = PAD * 2 + tallest * NODE_H + (tallest - 1) * GAP_Y;
  const width = PAD * 2 + nLayers * NODE_W + (nLayers - 1) * GAP_X;
  const xy = new Map();
  layers.forEach((l, li) => {
    const used = l.length * NODE_H + (l.length - 1) * GAP_Y;
    const top = (height - used) / 2;
    l.forEach((v, k) => xy.set(v, { x: PAD + li * (NODE_W + GAP_X), y: top + k * (NODE_H + GAP_Y) }));
  });
  return { xy, width, height };
}

function truncate(s, n) { return s.length > n ? s.slice(0, n - 1) + "…" : s; }

function renderGraph(layout, detail, metrics) {
  const svg = $("#job-graph");
  const byId = new Map(metrics.operators.map((m) => [m.id, m]));
  const taskName = new Map(detail.tasks.map((t, i) => [t.id, i]));
  let edges = "", nodes = "";
  for (const e of detail.edges) {
    const a = layout.xy.get(e.from), b = layout.xy.get(e.to);
    if (!a || !b) continue;
    const x1 = a.x + NODE_W, y1 = a.y + NODE_H / 2, x2 = b.x - 2, y2 = b.y + NODE_H / 2;
    const dx = Math.max(30, (x2 - x1) / 2);
    const cls = e.chained ? "edge" : "edge net";
    const dash = e.chained ? ` stroke-dasharray="5 4"` : "";
    edges += `<path class="${cls}"${dash} d="M${x1},${y1} C${x1 + dx},${y1} ${x2 - dx},${y2} ${x2},${y2}" marker-end="url(#arrow)"/>`;
    const mx = (x1 + x2) / 2, my = (y1 + y2) / 2;
    const how = e.chained ? "chained: same task, no channel" : "network channel between tasks";
    edges += `<g class="edge-label${e.chained ? " chained" : ""}" data-from="${e.from}" data-to="${e.to}">
      <title>${esc(e.partitioning)} (${how})</title>
      <text x="${mx}" y="${my - 6}" text-anchor="middle">${esc(e.partitioning)}</text></g>`;
  }
  for (const op of detail.operators) {
    const p = layout.xy.get(op.id);
    if (!p) continue;
    const m = byId.get(op.id);
    const busy = m && op.kind !== "source" ? m.busy_ratio : null;
    const bp = m ? m.backpressured_ratio : null;
    const fill = busyColour(busy || 0);
    const stroke = bp != null && bp >= 0.5 ? "#1e1b4b" : "#cbd5e1";
    const sw = bp != null && bp >= 0.5 ? 2.5 : 1;
    const rate = opRate(m);
    const task = taskName.has(op.task) ? `task ${taskName.get(op.task)}` : "";
    nodes += `<g class="op-node" data-operator="${esc(op.name)}" transform="translate(${p.x},${p.y})">
      <title>${esc(op.name)} (${esc(op.kind)}, parallelism ${op.parallelism}, ${esc(task)})
records in ${fmtInt(m && m.records_in)}, out ${fmtInt(m && m.records_out)}
busy ${fmtPct(busy)}, backpressured ${fmtPct(bp)}</title>
      <rect width="${NODE_W}" height="${NODE_H}" rx="9" fill="${fill}" stroke="${stroke}" stroke-width="${sw}"/>
      <rect width="5" height="${NODE_H - 16}" x="0" y="8" rx="2.5" fill="${kindColour(op.kind)}"/>
      <text class="op-name" x="14" y="21">${esc(truncate(op.name, 19))}</text>
      <text class="op-sub" x="14" y="38">${esc(op.kind)} · ×${op.parallelism} · ${esc(task)}</text>
      <text class="op-rate" x="14" y="58">${esc(fmtRate(rate))} rec/s</text>
      <text class="op-busy" x="${NODE_W - 10}" y="58" text-anchor="end">${op.kind === "source" ? "" : "busy " + esc(fmtPct(busy))}</text>
      ${bp != null && bp >= 0.05 ? `<g class="bp-tag" transform="translate(${NODE_W - 62},8)"><rect width="54" height="16" rx="8"/><text x="27" y="11.5" text-anchor="middle">BP ${esc(fmtPct(bp))}</text></g>` : ""}
    </g>`;
  }
  // Fit the card's width, shrinking to 60 % at most (wider graphs scroll).
  const avail = Math.max(320, svg.parentNode.clientWidth - 24);
  const w = Math.round(Math.min(layout.width, Math.max(avail, layout.width * 0.6)));
  svg.setAttribute("viewBox", `0 0 ${layout.width} ${layout.height}`);
  svg.setAttribute("width", w);
  svg.setAttribute("height", Math.round((layout.height * w) / layout.width));
  svg.innerHTML = `<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">
    <path d="M0,0 L10,5 L0,10 z" fill="#64748b"/></marker></defs>${edges}${nodes}`;
}

// ---------- the rates chart ----------

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function renderChart(metrics) {
  const svg = $("#rates-chart");
  const W = Math.max(480, Math.round(svg.clientWidth || svg.parentNode.clientWidth || 960));
  const H = 240, L = 58, R = 14, T = 12, B = 28;
  const h = metrics.history || { at_ms: [], operators: [] };
  const now = metrics.now_ms;
  // The time axis spans the data there is: 30 s at least, HISTORY_SECS at most.
  const first = h.at_ms.length ? h.at_ms[0] : now;
  const spanS = Math.min(HISTORY_SECS, Math.max(30, Math.ceil((now - first) / 10000) * 10));
  const x0 = now - spanS * 1000;
  const sx = (t) => L + ((t - x0) / (spanS * 1000)) * (W - L - R);
  const kinds = new Map(metrics.operators.map((o) => [o.id, o.kind]));
  const series = h.operators.map((s, i) => ({
    name: s.name,
    colour: PALETTE[i % PALETTE.length],
    values: kinds.get(s.id) === "sink" ? s.records_in_per_sec : s.records_out_per_sec,
  }));
  const max = niceMax(Math.max(0, ...series.flatMap((s) => s.values)));
  const sy = (v) => T + (1 - v / max) * (H - T - B);
  let out = "";
  for (let k = 0; k <= 4; k++) {
    const v = (max * k) / 4, y = sy(v);
    out += `<line class="grid" x1="${L}" x2="${W - R}" y1="${y}" y2="${y}"/><g class="axis"><text x="${L - 8}" y="${y + 4}" text-anchor="end">${fmtRate(v)}</text></g>`;
  }
  const step = spanS <= 40 ? 5 : spanS <= 80 ? 10 : 30;
  for (let s = spanS % step; s <= spanS; s += step) {
    const x = sx(x0 + s * 1000);
    const label = s === spanS ? "now" : `-${spanS - s}s`;
    out += `<g class="axis"><text x="${x}" y="${H - 8}" text-anchor="middle">${label}</text></g>`;
  }
  if (h.at_ms.length < 2) {
    out += `<text x="${(L + W - R) / 2}" y="${H / 2}" text-anchor="middle" fill="#94a3b8" font-size="13">Collecting samples…</text>`;
  }
  for (const s of series) {
    const pts = h.at_ms.map((t, i) => `${sx(t).toFixed(1)},${sy(s.values[i] || 0).toFixed(1)}`);
    if (pts.length >= 2) out += `<path class="series" data-operator="${esc(s.name)}" stroke="${s.colour}" d="M${pts.join(" L")}"/>`;
  }
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("height", H);
  svg.innerHTML = out;
  $("#rates-legend").innerHTML = series.map((s) =>
    `<span><span class="sw" style="background:${s.colour}"></span>${esc(s.name)}<b>${fmtRate(s.values.length ? s.values[s.values.length - 1] : null)}/s</b></span>`).join("");
}

// ---------- tables ----------

function ratioCell(x, colour) {
  if (x == null) return `<td class="num muted">—</td>`;
  return `<td class="num"><span class="bar"><i style="width:${Math.round(x * 100)}%;background:${colour}"></i></span>${fmtPct(x)}</td>`;
}

// Microseconds as "850 µs", "12.3 ms", "1.20 s".
function fmtMicros(us) {
  if (us == null) return "—";
  if (us < 1e3) return `${Math.round(us)} µs`;
  if (us < 1e6) return `${(us / 1e3).toFixed(us < 1e4 ? 2 : 1)} ms`;
  return `${(us / 1e6).toFixed(2)} s`;
}

// p50 / p99 / max of a latency summary, or a dash.
function latencyCell(l) {
  if (!l) return `<td class="num muted latency">—</td>`;
  return `<td class="num latency" title="${fmtInt(l.count)} latency markers, last 30-60 s" data-p50="${l.p50_us}" data-p99="${l.p99_us}" data-max="${l.max_us}">${fmtMicros(l.p50_us)} / ${fmtMicros(l.p99_us)} / ${fmtMicros(l.max_us)}</td>`;
}

// Serialized bytes (total, and per second below it); a dash where nothing was serialized
// (records between operators of one process are passed as they are).
function bytesCell(cls, total, rate) {
  if (!total) return `<td class="num muted ${cls}" data-bytes="0" title="nothing serialized: no Kafka or network on this side">—</td>`;
  return `<td class="num ${cls}" data-bytes="${total}">${fmtBytes(total)}${rate == null ? "" : `<br><span class="muted">${fmtBytes(rate)}/s</span>`}</td>`;
}

function renderOperators(state, detail, metrics) {
  const plan = new Map(detail.operators.map((o) => [o.id, o]));
  const taskIdx = new Map(detail.tasks.map((t, i) => [t.id, i]));
  let rows = "";
  for (const m of metrics.operators) {
    const p = plan.get(m.id) || {};
    const open = state.expanded.has(m.id);
    const src = m.kind === "source";
    rows += `<tr data-operator="${esc(m.name)}">
      <td><button class="linkish" data-toggle="${m.id}" aria-label="subtasks">${open ? "▾" : "▸"}</button><strong>${esc(m.name)}</strong>${kindTag(m.kind)}</td>
      <td class="num">${m.parallelism}</td><td class="num">${taskIdx.has(p.task) ? taskIdx.get(p.task) : "—"}</td>
      <td class="num">${fmtInt(m.records_in)}</td><td class="num">${fmtInt(m.records_out)}</td>
      <td class="num">${fmtRate(m.records_in_per_sec)}</td><td class="num">${fmtRate(m.records_out_per_sec)}</td>
      ${bytesCell("bytes-in", m.bytes_in, m.bytes_in_per_sec)}${bytesCell("bytes-out", m.bytes_out, m.bytes_out_per_sec)}
      ${src ? `<td class="num muted">—</td>` : ratioCell(m.busy_ratio, "#f59e0b")}${ratioCell(m.backpressured_ratio, "#4338ca")}
      <td class="num mono">${esc(m.watermark == null ? "—" : fmtClock(m.watermark, true))}</td>${latencyCell(m.latency)}</tr>`;
    if (open) {
      for (const s of m.subtasks) {
        rows += `<tr class="sub"><td>subtask #${s.subtask}</td><td></td><td></td>
          <td class="num">${fmtInt(s.records_in)}</td><td class="num">${fmtInt(s.records_out)}</td>
          <td class="num">${fmtRate(s.records_in_per_sec)}</td><td class="num">${fmtRate(s.records_out_per_sec)}</td>
          ${bytesCell("bytes-in", s.bytes_in, s.bytes_in_per_sec)}${bytesCell("bytes-out", s.bytes_out, s.bytes_out_per_sec)}
          ${src ? `<td class="num muted">—</td>` : ratioCell(s.busy_ratio, "#f59e0b")}${ratioCell(s.backpressured_ratio, "#4338ca")}
          <td class="num mono">${esc(s.watermark == null ? "—" : fmtClock(s.watermark, true))}</td>${latencyCell(s.latency)}</tr>`;
      }
    }
  }
  $("#operators-table").innerHTML = `<table id="operators"><thead><tr><th>Operator</th><th class="num">Parallelism</th><th class="num">Task</th>
    <th class="num">Records in</th><th class="num">Records out</th><th class="num">In/s</th><th class="num">Out/s</th>
    <th class="num" title="serialized bytes read from Kafka or received from another process">Bytes in</th><th class="num" title="serialized bytes written to Kafka or object storage, or sent to another process">Bytes out</th>
    <th class="num">Busy</th><th class="num">Backpressured</th><th class="num">Watermark</th><th class="num" title="record latency from the sources (latency markers), last 30-60 s">Latency p50 / p99 / max</th></tr></thead><tbody>${rows}</tbody></table>`;
}

function renderWatermarks(w) {
  if (!w.operators.length) { $("#watermarks-table").innerHTML = empty("No operators", ""); return; }
  const rows = w.operators.map((o) => {
    const held = o.held_back_by
      ? `${esc(o.held_back_by.operator)} <span class="chip">#${o.held_back_by.subtask}</span>`
      : `<span class="muted">—</span>`;
    const chips = o.subtasks.map((s) =>
      `<span class="chip${s.is_minimum && o.subtasks.length > 1 ? " min" : ""}" title="subtask ${s.subtask}">#${s.subtask} ${esc(fmtWatermark(s.watermark, s.state))}</span>`).join("");
    return `<tr data-operator="${esc(o.name)}"><td><strong>${esc(o.name)}</strong>${kindTag(o.kind)}</td>
      <td class="mono">${esc(fmtWatermark(o.watermark, o.state))}</td><td class="num">${fmtLag(o.lag_ms)}</td>
      <td>${held}</td><td>${chips}</td></tr>`;
  }).join("");
  $("#watermarks-table").innerHTML = `<table id="watermarks"><thead><tr><th>Operator</th><th>Watermark (min)</th><th class="num">Lag</th>
    <th>Held back by</th><th>Subtasks</th></tr></thead><tbody>${rows}</tbody></table>`;
}

function renderCheckpoints(c) {
  const dur = (ms) => ms < 1000 ? `${ms} ms` : fmtDuration(ms);
  const cfg = c.config ? ` · every ${c.config.interval_ms ? dur(c.config.interval_ms) : "— (on demand)"}, timeout ${dur(c.config.timeout_ms)}, `
    + `keeps ${c.config.retained} · ${c.config.storage}` : "";
  $("#checkpoint-counts").textContent = `${c.counts.completed} completed · ${c.counts.failed} failed · ${c.counts.in_progress} in progress${cfg}`;
  $("#checkpoint-chart").style.display = c.checkpoints.length ? "" : "none";
  if (!c.checkpoints.length) {
    $("#checkpoints-table").innerHTML = empty("No checkpoints yet", " Checkpoints this job takes appear here, newest first.");
    return;
  }
  renderCheckpointChart(c.checkpoints);
  const rows = c.checkpoints.slice().reverse().map((k) => `<tr>
    <td class="num">${k.id}</td><td><span class="badge ${k.status === "COMPLETED" ? "FINISHED" : k.status === "FAILED" ? "FAILED" : "RUNNING"}">${esc(k.status)}</span></td>
    <td>${fmtClock(k.trigger_ms)}</td><td class="num">${fmtInt(k.duration_ms)} ms</td>
    <td class="num" title="${esc(taskBreakdown(k))}">${fmtInt(Math.round((k.alignment_us || 0) / 1000))} ms</td>
    <td class="num" title="${esc(taskBreakdown(k))}">${fmtInt(Math.round((k.sync_us || 0) / 1000))} ms</td><td class="num">${fmtInt(Math.round((k.upload_us || 0) / 1000))} ms</td>
    <td class="num">${fmtBytes(k.size_bytes)}</td><td class="num">${fmtBytes(k.incremental_bytes)}</td>
    <td>${k.failure ? `<span class="mono">${esc(k.failure)}</span>` : ""}</td></tr>`).join("");
  $("#checkpoints-table").innerHTML = `<table id="checkpoints"><thead><tr><th class="num">ID</th><th>Status</th><th>Triggered</th>
    <th class="num">Duration</th><th class="num" title="Longest barrier alignment of a task with several inputs (hover a cell: per task)">Alignment</th><th class="num" title="Slowest subtask: time records waited at the barrier (write-through, RocksDB flush + checkpoint)">Sync</th>
    <th class="num" title="Slowest subtask: upload of new files, off the task thread">Upload</th>
    <th class="num">Size</th><th class="num">Incremental</th><th>Failure</th></tr></thead><tbody>${rows}</tbody></table>`;
}

/** The last 60 checkpoints' durations as bars (sync part darker), failed ones in red. */
function renderCheckpointChart(list) {
  const svg = $("#checkpoint-chart");
  const ks = list.slice(-60);
  const W = Math.max(320, Math.round(svg.clientWidth || svg.parentNode.clientWidth || 600));
  const H = 140, L = 52, R = 8, T = 10, B = 22;
  const max = niceMax(Math.max(1, ...ks.map((k) => k.duration_ms)));
  const sy = (v) => T + (1 - v / max) * (H - T - B);
  const bw = (W - L - R) / Math.max(ks.length, 1);
  let out = "";
  for (let i = 0; i <= 2; i++) {
    const v = (max * i) / 2, y = sy(v);
    out += `<line class="grid" x1="${L}" x2="${W - R}" y1="${y}" y2="${y}"/><g class="axis"><text x="${L - 6}" y="${y + 4}" text-anchor="end">${fmtInt(v)} ms</text></g>`;
  }
  ks.forEach((k, i) => {
    const x = L + i * bw + bw * 0.15, w = Math.max(1, bw * 0.7);
    const colour = k.status === "FAILED" ? "#dc2626" : k.status === "COMPLETED" ? "#38bdf8" : "#94a3b8";
    const sync = Math.min(k.duration_ms, (k.sync_us || 0) / 1000);
    out += `<rect class="ckpt-bar" data-id="${k.id}" x="${x.toFixed(1)}" y="${sy(k.duration_ms).toFixed(1)}" width="${w.toFixed(1)}" height="${(sy(0) - sy(k.duration_ms)).toFixed(1)}" fill="${colour}"><title>#${k.id} ${esc(k.status)}: ${fmtInt(k.duration_ms)} ms (sync ${fmtInt(Math.round(sync))} ms)</title></rect>`;
    if (sync > 0) out += `<rect x="${x.toFixed(1)}" y="${sy(sync).toFixed(1)}" width="${w.toFixed(1)}" height="${(sy(0) - sy(sync)).toFixed(1)}" fill="#1e3a8a" opacity=".6"/>`;
  });
  if (ks.length) {
    out += `<g class="axis"><text x="${L}" y="${H - 6}">#${ks[0].id}</text><text x="${W - R}" y="${H - 6}" text-anchor="end">#${ks[ks.length - 1].id}</text></g>`;
  }
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("height", H);
  svg.innerHTML = out;
}

/** Per task subtask: alignment / sync / upload, for a cell's tooltip. */
function taskBreakdown(k) {
  return (k.tasks || []).map((t) => `${t.operators.join(" → ")} #${t.subtask}: align ${Math.round(t.alignment_us / 1000)} ms, `
    + `sync ${Math.round(t.sync_us / 1000)} ms, upload ${Math.round(t.upload_us / 1000)} ms`).join("\n");
}

function renderFailures(failures) {
  if (!failures.length) {
    $("#failures").innerHTML = empty("No failures", " Task failures appear here with their cause.");
    return;
  }
  $("#failures").innerHTML = failures.slice().reverse().map((f) =>
    `<div class="failure"><span class="muted">${fmtDateTime(f.at_ms)}</span><pre>${esc(f.cause)}</pre></div>`).join("");
}

// ---------- routing ----------

function route() {
  const m = location.pathname.match(/^\/jobs\/(.+)$/);
  if (m) {
    let name;
    try { name = decodeURIComponent(m[1]); } catch (e) { name = m[1]; }
    jobPage(name);
  } else {
    overviewPage();
  }
}

window.addEventListener("popstate", route);
route();
