// Caudal web UI: the job page's "Operator state" card, from /api/v1/jobs/<name>/state and
// /api/v1/jobs/<name>/operators/<operator>/state{,/keys,/sizes}. Loaded before app.js, whose
// helpers ($, esc, fmtInt, fmtBytes, fmtClock, api, jobUrl, toast, empty) it uses when it runs.
// The card stays hidden for jobs without keyed state. Lookups, listings and sizes are asked
// for by the user (each one is answered by the task thread between batches), never polled.
"use strict";

function stateCardHtml() {
  return `<section class="card" id="state-card" hidden>
      <div class="card-head"><h2>Operator state</h2><span class="hint">live keyed state, read by the task between batches</span></div>
      <div class="state-tools">
        <label>Operator <select id="state-operator"></select></label>
        <form id="state-lookup-form" class="state-form"><label>Key <input id="state-key" placeholder="e.g. 7" autocomplete="off"></label>
          <button class="btn" id="state-lookup-btn" type="submit">Look up</button></form>
        <form id="state-list-form" class="state-form"><label>Key group <input id="state-kg" type="number" min="0" value="0"></label>
          <button class="btn" id="state-list-btn" type="submit">List keys</button></form>
        <button class="btn" id="state-sizes-btn" type="button">Refresh sizes</button>
      </div>
      <div id="state-result"></div>
      <div class="chart-wrap"><svg id="state-sizes" role="img" aria-label="Entries per key group"></svg></div>
      <div id="state-sizes-total" class="hint pad-x"></div>
      <div id="state-keys"></div>
    </section>`;
}

// The panel's own state: which operator, the listing's cursor.
const statePanel = { job: null, operator: null, operators: [], cursor: null, keyGroup: null };

function stateBase() {
  return jobUrl(statePanel.job) + "/operators/" + encodeURIComponent(statePanel.operator) + "/state";
}

function initStatePanel(job) {
  statePanel.job = job;
  $("#state-operator").addEventListener("change", (ev) => {
    statePanel.operator = ev.target.value;
    loadStateSizes();
  });
  $("#state-lookup-form").addEventListener("submit", (ev) => { ev.preventDefault(); lookupState(); });
  $("#state-list-form").addEventListener("submit", (ev) => { ev.preventDefault(); listStateKeys(Number($("#state-kg").value), null); });
  $("#state-sizes-btn").addEventListener("click", () => loadStateSizes());
  $("#state-keys").addEventListener("click", (ev) => {
    if (ev.target.closest("#state-next")) listStateKeys(statePanel.keyGroup, statePanel.cursor);
    const k = ev.target.closest("[data-key]");
    if (k) { ev.preventDefault(); $("#state-key").value = k.dataset.key; lookupState(); }
  });
  $("#state-sizes").addEventListener("click", (ev) => {
    const bar = ev.target.closest("[data-kg]");
    if (!bar) return;
    $("#state-kg").value = bar.dataset.kg;
    listStateKeys(Number(bar.dataset.kg), null);
  });
}

// Called on every poll with /state: shows the card and fills the operator list.
function renderStateOverview(overview) {
  const card = $("#state-card");
  if (!card) return;
  card.hidden = !overview.operators.length;
  const names = overview.operators.map((o) => o.operator);
  if (JSON.stringify(names) !== JSON.stringify(statePanel.operators)) {
    statePanel.operators = names;
    $("#state-operator").innerHTML = names.map((n) => `<option>${esc(n)}</option>`).join("");
    if (!names.includes(statePanel.operator)) {
      statePanel.operator = names[0] || null;
      if (statePanel.operator) loadStateSizes();
    }
    $("#state-operator").value = statePanel.operator || "";
  }
}

function windowRows(windows) {
  const fields = [...new Set(windows.flatMap((w) => Object.keys(w.accumulator || {})))];
  const head = `<tr><th>Window</th><th>Fired</th>${fields.map((f) => `<th class="num">${esc(f)}</th>`).join("")}</tr>`;
  const fmt = (v) => (typeof v === "number" ? (Number.isInteger(v) ? fmtInt(v) : v.toFixed(3)) : esc(JSON.stringify(v)));
  const rows = windows.map((w) => `<tr class="state-window"><td class="mono">${fmtClock(w.start)} – ${fmtClock(w.end)}</td>
      <td>${w.fired ? "yes" : "no"}</td>${fields.map((f) => `<td class="num" data-field="${esc(f)}">${fmt(w.accumulator[f])}</td>`).join("")}</tr>`);
  return `<table class="state-windows"><thead>${head}</thead><tbody>${rows.join("")}</tbody></table>`;
}

function entryValueHtml(e) {
  if (e.value && Array.isArray(e.value.windows)) return windowRows(e.value.windows);
  if (e.value != null) return `<pre class="mono">${esc(JSON.stringify(e.value, null, 2))}</pre>`;
  return `<span class="mono">${esc(e.value_hex || "")}</span> <span class="muted">(${fmtBytes(e.value_bytes)}, not decodable)</span>`;
}

async function lookupState() {
  const key = $("#state-key").value.trim();
  const out = $("#state-result");
  if (!key || !statePanel.operator) return;
  try {
    const r = await api(stateBase() + "?key=" + encodeURIComponent(key));
    out.innerHTML = `<div class="state-found" data-key="${esc(JSON.stringify(r.key))}">
        <p class="pad-x"><b>Key ${esc(JSON.stringify(r.key))}</b> · key group ${r.key_group} · subtask ${r.subtask}</p>
        ${r.entries.map((e) => `<div class="state-entry"><p class="pad-x muted">state <b>${esc(e.state)}</b> · ${fmtBytes(e.value_bytes)}</p>${entryValueHtml(e)}</div>`).join("")}
      </div>`;
  } catch (e) {
    out.innerHTML = `<p class="pad-x state-error">${esc(e.message)}</p>`;
  }
}

async function listStateKeys(kg, after) {
  if (!statePanel.operator) return;
  const out = $("#state-keys");
  try {
    const r = await api(stateBase() + "/keys?limit=20&key_group=" + kg + (after ? "&after=" + after : ""));
    statePanel.keyGroup = kg;
    statePanel.cursor = r.next;
    const rows = r.entries.map((e) => `<tr><td class="mono"><a href="#" data-key="${esc(e.key == null ? e.key_hex : JSON.stringify(e.key))}">${esc(e.key == null ? e.key_hex : JSON.stringify(e.key))}</a></td>
        <td>${esc(e.state)}</td><td class="num">${fmtBytes(e.value_bytes)}</td></tr>`).join("");
    out.innerHTML = `<p class="pad-x">Key group <b>${kg}</b> (subtask ${r.subtask})${after ? ", next page" : ""}: ${r.entries.length} entries</p>
      <table id="state-keys-table"><thead><tr><th>Key</th><th>State</th><th class="num">Value size</th></tr></thead><tbody>${rows ||
        `<tr><td colspan="3" class="muted">No entries in this key group.</td></tr>`}</tbody></table>
      ${r.next ? `<p class="pad-x"><button class="btn" id="state-next" type="button">Next page</button></p>` : ""}`;
  } catch (e) {
    out.innerHTML = `<p class="pad-x state-error">${esc(e.message)}</p>`;
  }
}

async function loadStateSizes() {
  if (!statePanel.operator) return;
  try {
    const r = await api(stateBase() + "/sizes");
    renderStateSizes(r);
  } catch (e) {
    $("#state-sizes-total").textContent = e.message;
  }
}

function renderStateSizes(r) {
  const svg = $("#state-sizes");
  const W = Math.max(480, Math.round(svg.clientWidth || svg.parentNode.clientWidth || 960));
  const H = 90, L = 8, R = 8, T = 6, B = 18;
  const n = r.key_groups.length || 1;
  const max = Math.max(1, ...r.key_groups.map((k) => k.entries));
  const bw = (W - L - R) / n;
  let out = "";
  r.key_groups.forEach((k, i) => {
    const h = ((H - T - B) * k.entries) / max;
    out += `<rect class="kg-bar" data-kg="${k.key_group}" x="${(L + i * bw).toFixed(1)}" y="${(H - B - h).toFixed(1)}" width="${Math.max(1, bw - 1).toFixed(1)}" height="${Math.max(h, 0.5).toFixed(1)}" fill="${PALETTE[k.subtask % PALETTE.length]}"><title>key group ${k.key_group} (subtask ${k.subtask}): ${k.entries} entries, ${k.bytes} bytes</title></rect>`;
  });
  out += `<g class="axis"><text x="${L}" y="${H - 4}">key group 0</text><text x="${W - R}" y="${H - 4}" text-anchor="end">${n - 1}</text></g>`;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("height", H);
  svg.innerHTML = out;
  $("#state-sizes-total").textContent = `${fmtInt(r.entries)} entries, ${fmtBytes(r.bytes)} over ${n} key groups · click a bar to list its keys`;
}
