// Caudal web UI: the job page's "Kafka consumer lag" card, from /api/v1/jobs/<name>/kafka.
// Loaded before app.js, whose helpers ($, esc, fmtInt, fmtRate, niceMax, empty, PALETTE,
// HISTORY_SECS) it uses when it runs. The card stays hidden for jobs without a Kafka source.
"use strict";

// The card's markup, placed by app.js on the job page.
function kafkaCardHtml() {
  return `<section class="card" id="kafka-card" hidden>
      <div class="card-head"><h2>Kafka</h2><span class="hint">consumer lag: records per partition between its end offset and the last completed checkpoint, last ${HISTORY_SECS / 60} minutes</span></div>
      <div id="kafka-lag-part">
        <div class="chart-wrap"><svg id="kafka-chart" role="img" aria-label="Consumer lag per partition over time"></svg></div>
        <div id="kafka-legend" class="series-legend"></div>
        <div id="kafka-table"></div>
      </div>
      <div id="kafka-health"></div>
      <div id="kafka-clients"></div>
    </section>`;
}

// One line per partition, named "partition" (or "topic/partition" when a job reads several topics).
function kafkaSeries(kafka) {
  const topics = new Set(kafka.sources.flatMap((s) => s.partitions.map((p) => p.topic)));
  const out = [];
  for (const s of kafka.sources) {
    for (const p of s.partitions) {
      out.push({
        source: s.operator,
        topic: p.topic,
        partition: p.partition,
        name: topics.size > 1 ? `${p.topic}/${p.partition}` : `partition ${p.partition}`,
        colour: PALETTE[out.length % PALETTE.length],
        p,
      });
    }
  }
  return out;
}

function renderKafka(kafka) {
  const card = $("#kafka-card");
  if (!card) return;
  card.hidden = !kafka.sources.length && !kafka.health.length;
  renderKafkaHealth(kafka);
  renderKafkaClients(kafka);
  $("#kafka-lag-part").hidden = !kafka.sources.length;
  if (!kafka.sources.length) return;
  const series = kafkaSeries(kafka);
  renderKafkaChart(kafka, series);
  $("#kafka-legend").innerHTML = series.map((s) =>
    `<span><span class="sw" style="background:${s.colour}"></span>${esc(s.name)}<b>${fmtInt(s.p.lag)}</b></span>`).join("");
  const maxLag = Math.max(1, ...series.map((s) => s.p.lag || 0));
  const rows = series.map((s) => `<tr data-topic="${esc(s.topic)}" data-partition="${s.partition}">
      <td>${esc(s.source)}</td><td class="mono">${esc(s.topic)}</td><td class="num">${s.partition}</td>
      <td class="num">${fmtInt(s.p.end_offset)}</td><td class="num">${fmtInt(s.p.checkpointed_offset)}</td>
      <td class="num kafka-lag">${s.p.lag == null ? `<span class="muted">—</span>` :
        `<span class="bar"><i style="width:${Math.round((100 * s.p.lag) / maxLag)}%;background:${s.colour}"></i></span>${fmtInt(s.p.lag)}`}</td>
      <td class="mono kafka-wm">${s.p.watermark == null ? `<span class="muted">—</span>` : esc(fmtWatermark(s.p.watermark, "ACTIVE"))}</td>
      <td class="num kafka-behind">${fmtSpan(s.p.behind_ms)}</td><td class="num kafka-catch-up">${fmtSpan(s.p.catch_up_ms)}</td></tr>`).join("");
  // Known once every partition's lag is: the sum of some would read as "caught up" while a
  // partition's end offset is still unknown.
  const lags = series.map((s) => s.p.lag);
  const total = !lags.length || lags.some((l) => l == null) ? null : lags.reduce((a, l) => a + l, 0);
  $("#kafka-table").innerHTML = `<table id="kafka"><thead><tr><th>Source</th><th>Topic</th><th class="num">Partition</th>
    <th class="num">End offset</th><th class="num">Checkpointed offset</th><th class="num">Lag</th><th title="The partition's watermark in the source">Watermark</th>
    <th class="num" title="now minus the partition's watermark">Behind (event time)</th><th class="num" title="the lag at the rate checkpoints covered the partition over the last 30 s">Caught up in</th></tr></thead><tbody>${rows}</tbody>
    <tfoot><tr><td colspan="5">Total</td><td class="num" id="kafka-total">${fmtInt(total)}</td><td></td></tr></tfoot></table>`;
}

function renderKafkaChart(kafka, series) {
  const svg = $("#kafka-chart");
  const W = Math.max(480, Math.round(svg.clientWidth || svg.parentNode.clientWidth || 960));
  const H = 200, L = 58, R = 14, T = 12, B = 28;
  const at = kafka.history_at_ms, now = kafka.now_ms;
  // The time axis spans the data there is: 30 s at least, HISTORY_SECS at most.
  const first = at.length ? at[0] : now;
  const spanS = Math.min(HISTORY_SECS, Math.max(30, Math.ceil((now - first) / 10000) * 10));
  const x0 = now - spanS * 1000;
  const sx = (t) => L + ((t - x0) / (spanS * 1000)) * (W - L - R);
  // Records are whole: the axis reaches 5 at least and steps in whole numbers (5, 10, 20, 25…
  // split in 4 or 5).
  const max = niceMax(Math.max(4, ...series.flatMap((s) => s.p.lag_history.filter((v) => v != null))));
  const div = max % 4 === 0 ? 4 : 5;
  const sy = (v) => T + (1 - v / max) * (H - T - B);
  let out = "";
  for (let k = 0; k <= div; k++) {
    const v = (max * k) / div, y = sy(v);
    out += `<line class="grid" x1="${L}" x2="${W - R}" y1="${y}" y2="${y}"/><g class="axis"><text x="${L - 8}" y="${y + 4}" text-anchor="end">${fmtRate(v)}</text></g>`;
  }
  const step = spanS <= 40 ? 5 : spanS <= 80 ? 10 : 30;
  for (let s = spanS % step; s <= spanS; s += step) {
    const label = s === spanS ? "now" : `-${spanS - s}s`;
    out += `<g class="axis"><text x="${sx(x0 + s * 1000)}" y="${H - 8}" text-anchor="middle">${label}</text></g>`;
  }
  if (at.length < 2) {
    out += `<text x="${(L + W - R) / 2}" y="${H / 2}" text-anchor="middle" fill="#94a3b8" font-size="13">Collecting samples…</text>`;
  }
  for (const s of series) {
    // Unknown points (before the first statistics) break the line.
    let d = "", pen = "M";
    s.p.lag_history.forEach((v, i) => {
      if (v == null || at[i] < x0) { pen = "M"; return; }
      d += `${pen}${sx(at[i]).toFixed(1)},${sy(v).toFixed(1)} `;
      pen = "L";
    });
    if (d) out += `<path class="series" data-topic="${esc(s.topic)}" data-partition="${s.partition}" stroke="${s.colour}" d="${d.trim()}"/>`;
  }
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("height", H);
  svg.innerHTML = out;
}

// Broker health seen from the client: replicas and in-sync replicas per partition.
function renderKafkaHealth(kafka) {
  const n = (v) => (v == null ? `<span class="muted">—</span>` : v);
  const rows = kafka.health.flatMap((h) => h.partitions.map((p) => {
    const state = p.under_replicated == null ? `<span class="muted">unknown</span>` :
      p.under_replicated ? `<span class="health bad">under-replicated</span>` : `<span class="health ok">in sync</span>`;
    return `<tr data-topic="${esc(h.topic)}" data-partition="${p.partition}" data-kind="${esc(h.kind)}"><td>${esc(h.operator)} ${kindTag(h.kind)}</td>
      <td class="mono">${esc(h.topic)}</td><td class="num">${p.partition}</td><td class="num">${n(p.leader)}</td>
      <td class="num">${n(p.replicas)}</td><td class="num">${n(p.in_sync_replicas)}</td>
      <td class="num isr-shrinks">${n(p.isr_shrinks)}</td><td class="num isr-expands">${n(p.isr_expands)}</td><td>${state}</td></tr>`;
  })).join("");
  const under = kafka.under_replicated_partitions;
  $("#kafka-health").innerHTML = !kafka.health.length ? "" : `<p class="pad-x"><b>Broker health</b> <span class="muted">(cluster metadata, every 10 s)</span>:
      ${under ? `<span class="health bad">${under} under-replicated partition${under > 1 ? "s" : ""}</span>` : `<span class="health ok">every partition in sync</span>`}</p>
    <table id="kafka-health-table"><thead><tr><th>Operator</th><th>Topic</th><th class="num">Partition</th><th class="num">Leader</th>
      <th class="num">Replicas</th><th class="num">In sync</th><th class="num" title="times the in-sync replicas shrank since the job started">ISR shrinks</th>
      <th class="num" title="times the in-sync replicas expanded again">ISR expands</th><th>State</th></tr></thead><tbody>${rows}</tbody></table>` + renderKafkaProducers(kafka);
}

// ---------- pending sink transactions (/api/v1/jobs/<name>/transactions) ----------

function transactionsCardHtml() {
  return `<section class="card" id="txn-card" hidden>
      <div class="card-head"><h2>Kafka sink transactions</h2><span class="hint">open and pre-committed transactions of the exactly-once sinks; age against transaction.timeout.ms</span></div>
      <div id="txn-table"></div>
    </section>`;
}

const TXN_STATES = { open: "open", pre_committed: "pre-committed · awaiting checkpoint", committing: "committing" };

function renderTransactions(t) {
  const card = $("#txn-card");
  if (!card) return;
  card.hidden = !t.sinks.length;
  if (!t.sinks.length) return;
  const rows = t.sinks.flatMap((s) => s.transactions.map((x) => {
    const pct = x.timeout_fraction == null ? null : Math.min(1, x.timeout_fraction);
    const colour = pct == null ? "#94a3b8" : pct > 0.8 ? "#dc2626" : pct > 0.5 ? "#d97706" : "#0d9488";
    return `<tr data-txn="${esc(x.transactional_id)}" data-state="${esc(x.state)}"><td>${esc(s.operator)}</td>
      <td class="mono">${esc(x.transactional_id)}</td><td class="num">${x.producer_id}</td><td class="num">${x.producer_epoch}</td>
      <td class="num">${x.checkpoint}</td><td><span class="txn-state ${esc(x.state)}">${esc(TXN_STATES[x.state] || x.state)}</span></td>
      <td class="num">${fmtInt(x.records)}</td>
      <td class="num txn-age">${x.age_ms == null ? `<span class="muted">—</span>` :
        `<span class="bar"><i style="width:${Math.round(100 * pct)}%;background:${colour}"></i></span>${fmtDuration(x.age_ms)} / ${fmtDuration(x.timeout_ms)}`}</td></tr>`;
  })).join("");
  const ids = t.sinks.reduce((a, s) => a + s.transactional_ids, 0);
  $("#txn-table").innerHTML = `<table id="transactions"><thead><tr><th>Sink</th><th>Transactional id</th><th class="num">Producer id</th>
    <th class="num">Epoch</th><th class="num">Checkpoint</th><th>State</th><th class="num">Records</th><th class="num">Age / timeout</th></tr></thead>
    <tbody>${rows || `<tr><td colspan="8" class="muted">No open or pending transactions (${ids} transactional ids in the pools).</td></tr>`}</tbody></table>`;
}

// What the sinks' producers see of each broker (librdkafka statistics, every second).
function renderKafkaProducers(kafka) {
  const producers = kafka.producers || [];
  if (!producers.length) return "";
  const ms = (v) => (v == null ? `<span class="muted">—</span>` : v.toFixed(1));
  const bad = (v) => (v > 0 ? `<span class="health bad">${v}</span>` : v);
  const rows = producers.map((p) => `<tr data-broker="${p.broker}"><td>${esc(p.operator)}</td><td class="num">${p.broker}</td>
      <td class="num">${ms(p.rtt_p50_ms)}</td><td class="num">${ms(p.rtt_p99_ms)}</td><td class="num">${p.requests}</td>
      <td class="num producer-errors">${bad(p.errors)}</td><td class="num">${bad(p.retries)}</td><td class="num">${bad(p.timeouts)}</td>
      <td class="num">${bad(p.disconnects)}</td></tr>`).join("");
  return `<p class="pad-x"><b>Producers</b> <span class="muted">(per sink and broker; latency of the last second, counts since the start)</span></p>
    <table id="kafka-producers-table"><thead><tr><th>Sink</th><th class="num">Broker</th><th class="num">Request p50 ms</th>
      <th class="num">p99 ms</th><th class="num">Requests</th><th class="num">Errors</th><th class="num">Retries</th>
      <th class="num">Timeouts</th><th class="num">Disconnects</th></tr></thead><tbody>${rows}</tbody></table>`;
}

// The effective settings of each source's consumer and sink's producers. They are fixed at
// start, so the list is drawn again only when it changes (an open <details> stays open).
let kafkaClientsShown = null;
function renderKafkaClients(kafka) {
  const clients = kafka.clients || [];
  const json = JSON.stringify(clients);
  const box = $("#kafka-clients");
  if (!box || (json === kafkaClientsShown && box.childElementCount)) return;
  kafkaClientsShown = json;
  const lists = clients.map((c) => {
    const rows = Object.entries(c.settings).map(([k, v]) =>
      `<tr data-setting="${esc(k)}"><td class="mono">${esc(k)}</td><td class="mono">${esc(v)}</td></tr>`).join("");
    return `<details class="kafka-client pad-x" data-operator="${esc(c.operator)}" data-client="${esc(c.client)}">
      <summary>${esc(c.operator)} <span class="muted">${esc(c.client)} · ${Object.keys(c.settings).length} settings</span></summary>
      <table><thead><tr><th>Setting</th><th>Effective value</th></tr></thead><tbody>${rows}</tbody></table></details>`;
  }).join("");
  box.innerHTML = !clients.length ? "" : `<p class="pad-x"><b>Client settings</b>
      <span class="muted">(what Caudal and --producer-property / --consumer-property set, and librdkafka's defaults of the rest that matter; secrets masked)</span></p>${lists}`;
}

// A span of milliseconds in words: 850 ms, 12.3 s, 4 min 10 s, 2 h 5 min; "—" when unknown.
function fmtSpan(ms) {
  if (ms == null) return `<span class="muted">—</span>`;
  if (ms < 1000) return `${ms} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}
