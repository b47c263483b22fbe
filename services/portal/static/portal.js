// taugrid portal: one page, no build step. Routes: #/runs, #/runs/<id>, #/queues, #/nodes, #/usage.
"use strict";
const view = document.getElementById("view");
const errorBox = document.getElementById("error");
let cleanup = [];  // closers of the current page's streams and timers

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function when(t) { return t ? new Date(t * 1000).toLocaleString() : ""; }
function badge(state) { return `<span class="state ${esc(state)}">${esc(state)}</span>`; }
function showError(message) { errorBox.hidden = !message; errorBox.textContent = message || ""; }

async function api(path, options) {
  const res = await fetch(path, {credentials: "same-origin", ...options});
  const body = await res.json().catch(() => ({}));
  if (!res.ok) {
    const err = new Error(body.error ? body.error + (body.fix ? " — " + body.fix : "") : res.statusText);
    err.status = res.status;
    throw err;
  }
  return body;
}

function table(headers, rows) {
  return `<table><thead><tr>${headers.map(h => `<th>${esc(h)}</th>`).join("")}</tr></thead>` +
    `<tbody>${rows.join("") || `<tr><td colspan="${headers.length}" class="muted">nothing yet</td></tr>`}</tbody></table>`;
}

// ------------------------------------------------------------------ runs
async function runsPage() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  view.innerHTML = `<h2>Runs</h2>
    <form class="filters" id="filters">
      <select name="state"><option value="">any state</option>${["queued", "admitted", "running", "succeeded",
        "failed", "cancelled", "rejected"].map(s => `<option${params.get("state") === s ? " selected" : ""}>${s}</option>`).join("")}</select>
      <input name="workspace" placeholder="workspace" value="${esc(params.get("workspace"))}">
      <input name="user" placeholder="user" value="${esc(params.get("user"))}">
      <input name="q" placeholder="run id contains" value="${esc(params.get("q"))}">
      <button>Filter</button>
    </form><div id="runs"></div><p class="pager" id="pager"></p>`;
  document.getElementById("filters").onsubmit = ev => {
    ev.preventDefault();
    const q = new URLSearchParams([...new FormData(ev.target)].filter(([, v]) => v));
    location.hash = "#/runs" + (q.toString() ? "?" + q : "");
  };
  const query = new URLSearchParams([...params].filter(([, v]) => v)).toString();
  const filtersOnly = new URLSearchParams([...params].filter(([k, v]) => v && k !== "cursor"));
  const load = async () => {
    const got = await api("/api/runs" + (query ? "?" + query : ""));
    const runs = got.runs;
    const pageLink = cursor => {
      const q = new URLSearchParams(filtersOnly);
      if (cursor) q.set("cursor", cursor);
      return "#/runs" + (q.toString() ? "?" + q : "");
    };
    document.getElementById("pager").innerHTML =
      (params.get("cursor") ? `<a href="${esc(pageLink(""))}" id="newest">newest runs</a> ` : "") +
      (got.next ? `<a href="${esc(pageLink(got.next))}" id="older">older runs →</a>` : "");
    document.getElementById("runs").innerHTML = table(
      ["run", "state", "workspace", "user", "queue", "attempt", "node", "submitted", "reason"],
      runs.map(r => `<tr><td class="nowrap"><a href="#/runs/${encodeURIComponent(r.run_id)}">${esc(r.run_id)}</a></td>` +
        `<td class="nowrap">${badge(r.state)}${r.position != null && r.state === "queued" ? ` #${r.position + 1}` : ""}</td>` +
        `<td>${esc(r.workspace)}</td><td>${esc(r.user)}</td><td>${esc(r.queue)}</td><td class="num">${r.attempt}</td>` +
        `<td>${esc(r.node)}</td><td class="nowrap">${when(r.created)}</td><td>${esc(r.reason)}</td></tr>`));
  };
  await load();
  const timer = setInterval(() => load().catch(e => showError(e.message)), 3000);
  cleanup.push(() => clearInterval(timer));
}

const MARKS = {done: "✔", active: "●", pending: "○", warning: "!", failed: "✘", skipped: "-"};
const TERMINAL = ["succeeded", "failed", "rejected", "cancelled"];

async function runPage(runId) {
  view.innerHTML = `<h2>Run <code>${esc(runId)}</code> <span id="run-state"></span>
      <button id="cancel" hidden>Cancel</button></h2>
    <div id="summary" class="muted"></div>
    <div class="grid">
      <div><h3>Phases</h3><ul class="phases" id="phases"></ul><h3>Pods</h3><div id="pods"></div>
        <div id="topology"></div></div>
      <div><h3>Events</h3><div id="events-box">${table(["time", "event", "detail"], [])}</div></div>
    </div>
    <h3>Logs <span class="muted" id="log-count"></span></h3><pre class="logs" id="logs"></pre>
    <h3>Outputs</h3><div id="outputs" class="muted">listed when the run is sealed</div>
    <h3>Evidence</h3><div id="evidence" class="muted">sealed when the run ends</div>`;
  const events = [];
  let evidenceShown = false;
  const render = record => {
    document.getElementById("run-state").innerHTML = badge(record.state);
    document.getElementById("summary").textContent = `workspace ${record.workspace} · user ${record.user || "?"} · ` +
      `attempt ${record.attempt}` + (record.node ? ` · node ${record.node}` : "") +
      (record.reason ? ` · ${record.reason}` : "") + (record.message ? `: ${record.message}` : "") +
      (record.resized ? ` · ${record.size} pods (last resize: ${record.resized})` : "");  // an elastic run
    document.getElementById("phases").innerHTML = record.phases.map(p =>
      `<li class="${esc(p.status)}" data-phase="${esc(p.name)}"><span class="mark">${MARKS[p.status] || "?"}</span>` +
      `${esc(p.name)} <span class="muted">${esc(p.detail)}</span>${p.hint ? ` <em>tip: ${esc(p.hint)}</em>` : ""}</li>`).join("");
    document.getElementById("pods").innerHTML = record.pods.length ? table(["pod", "node", "phase"],
      record.pods.map(p => `<tr><td>${esc(p.name)}</td><td class="nowrap">${esc(p.node)}</td>` +
        `<td class="nowrap">${esc(p.pod_phase || p.phase)}</td></tr>`))
      : `<span class="muted">none</span>`;
    // where admission placed the attempt by topology: each domain of a TAS pod set with the ranks it holds
    document.getElementById("topology").innerHTML = (record.topology || []).map(ps => {
      let first = 0;
      const rows = ps.domains.map(d => {
        const ranks = d.count === 1 ? `${first}` : `${first}-${first + d.count - 1}`;
        first += d.count;
        return `<tr><td class="nowrap">${esc(d.values.join(" / "))}</td><td class="num">${ranks}</td></tr>`;
      });
      return `<h3>Topology <span class="muted">${esc(ps.pod_set)}: ${esc(ps.levels.join(" / "))}</span></h3>` +
        table(["domain", "ranks"], rows);
    }).join("");
    const cancel = document.getElementById("cancel");
    cancel.hidden = TERMINAL.includes(record.state) || record.cancel_requested;
    if (TERMINAL.includes(record.state) && record.evidence_digest && !evidenceShown) {
      evidenceShown = true;
      showEvidence(runId).catch(e => showError(e.message));
    }
  };
  let seenSeq = 0;  // the newest event the stream has shown
  let behind = 0;
  const refresh = async () => {
    const record = await api(`/api/runs/${encodeURIComponent(runId)}`);
    render(record);
    // The stream reads RUNS, the record is run_record's projection of it, which can lag: a record older than the
    // events already shown is read again shortly, so the state shown catches up (not at the next event, which
    // may be the run's end, seconds later).
    if (record.last_seq < seenSeq && behind++ < 20 && !pending) {
      pending = setTimeout(() => { pending = null; refresh().catch(e => showError(e.message)); }, 250);
    } else if (record.last_seq >= seenSeq) behind = 0;
  };
  let pending = null;  // one record refresh at a time, however fast events come
  await refresh();
  document.getElementById("cancel").onclick = async () => {
    if (!confirm(`Cancel ${runId}?`)) return;
    try {
      const got = await api(`/api/runs/${encodeURIComponent(runId)}/cancel`, {method: "POST", headers: {"X-Tau-Portal": "1"}});
      showError(got.cancelled ? "" : got.message);
    } catch (e) { showError(e.message); }
    await refresh();
  };
  const logs = document.getElementById("logs");
  let lineCount = 0;
  const source = new EventSource(`/api/runs/${encodeURIComponent(runId)}/stream`);
  source.addEventListener("run", msg => {
    const ev = JSON.parse(msg.data);
    events.push(ev);
    seenSeq = Math.max(seenSeq, ev.seq || 0);
    document.getElementById("events-box").innerHTML = table(["time", "event", "detail"], events.map(e =>
      `<tr data-type="${esc(e.type)}"><td class="nowrap">${esc(e.time.slice(11, 23))}</td>` +
      `<td class="nowrap">${esc(e.type)}</td><td>${esc(e.detail)}</td></tr>`));
    if (!pending) pending = setTimeout(() => { pending = null; refresh().catch(e => showError(e.message)); }, 150);
  });
  source.addEventListener("log", msg => {
    const chunk = JSON.parse(msg.data);
    const atBottom = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 4;
    logs.append(document.createTextNode(chunk.lines.join("\n") + "\n"));
    lineCount += chunk.lines.length;
    document.getElementById("log-count").textContent = `${lineCount} line(s)`;
    if (atBottom) logs.scrollTop = logs.scrollHeight;
  });
  source.addEventListener("end", () => { source.close(); setTimeout(() => refresh().catch(() => {}), 300); });
  source.addEventListener("error", msg => { if (msg.data) showError(JSON.parse(msg.data).error); });
  cleanup.push(() => source.close());
}

async function showEvidence(runId) {
  const box = document.getElementById("evidence");
  box.textContent = "verifying …";
  const ev = await api(`/api/runs/${encodeURIComponent(runId)}/evidence`);
  if (!ev.sealed) { box.textContent = "not sealed yet"; return; }
  showOutputs(ev.outputs);
  const v = ev.verify;
  const identity = ev.bundle.identity || {};
  box.classList.remove("muted");
  box.innerHTML = `<p id="verify" class="${v.ok ? "ok" : "bad"}">${v.ok ? "✔ verified" : "✘ verification failed"}: ` +
    `${v.entries} ledger entries, ${v.audit_events} audited events, bundle sha256 ${esc((v.digest || "").slice(0, 16))}…</p>` +
    (v.problems && v.problems.length ? `<ul>${v.problems.map(p => `<li>${esc(p)}</li>`).join("")}</ul>` : "") +
    table(["field", "value"], [
      ["terminal state", ev.bundle.terminal_state], ["config sha256", ev.bundle.config_sha256],
      ["source digest", ev.bundle.source_digest], ["platform revision", ev.bundle.platform_revision],
      ["signed by", `${identity.user || ""} ${identity.signer || ""}`],
      ...(ev.bundle.accounting ? [["accounting", `queued ${ev.bundle.accounting.queued_s}s, ran ` +
        `${ev.bundle.accounting.running_s}s, ${ev.bundle.accounting.gpu_seconds} GPU-s, est. cost ${ev.bundle.accounting.cost}`]] : [])
    ].map(([k, val]) =>
        `<tr><td>${esc(k)}</td><td><code>${esc(val)}</code></td></tr>`));
}

function size(n) {
  const units = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  for (const [unit, f] of units) {
    if (n >= f) { const v = n / f; return `${v >= 100 ? v.toFixed(0) : v.toFixed(1).replace(/\.0$/, "")} ${unit}`; }
  }
  return `${n} B`;
}

function showOutputs(found) {  // the sealed output and checkpoint directories, as `tau outputs` lists them
  const box = document.getElementById("outputs");
  if (!found) return;
  box.classList.remove("muted");
  box.innerHTML = [["outputs", found.output_dir], ["checkpoints", found.checkpoint_dir]].filter(([, d]) => d && d.path)
    .map(([label, d]) => `<p id="${label}-dir"><strong>${label}</strong> <code>${esc(d.path)}</code>` +
      `${d.files.length ? "" : ' <span class="muted">nothing written</span>'}${d.truncated ? " (truncated)" : ""}</p>` +
      (d.files.length ? table(["file", "size", "sha256"], d.files.map(f => `<tr data-file="${esc(f.path)}">` +
        `<td>${esc(f.path)}</td><td class="num nowrap">${f.error ? esc(f.error) : size(f.size || 0)}</td>` +
        `<td><code>${esc((f.sha256 || "").slice(0, 16))}</code></td></tr>`)) : "")).join("");
}

// ------------------------------------------------------------------ queues, nodes, usage
function quota(values) {
  return Object.entries(values || {}).map(([r, v]) =>
    `${r.replace("nvidia.com/", "")}=${r === "memory" ? (v / 2 ** 30).toFixed(1) + "Gi" : v}`).join(" ") || "-";
}

async function queuesPage() {
  view.innerHTML = `<h2>Queues</h2><div id="queues"></div>`;
  const load = async () => {
    const snap = await api("/api/queues");
    const rows = (snap.queues || []).map(q => `<tr><td>${esc(q.cluster_queue)}</td><td>${esc(q.cohort || "-")}</td>` +
      `<td>${quota(q.nominal)}</td><td>${quota(q.used)}</td><td>${quota(q.borrowed)}</td><td>${quota(q.lent)}</td>` +
      `<td class="num">${q.admitted}</td><td class="num">${q.pending_count ?? q.pending.length}</td>` +
      `<td>${q.pending.map(p => `#${p.position + 1} ${p.run_id ? `<a href="#/runs/${encodeURIComponent(p.run_id)}">${esc(p.run_id)}</a>`
        : '<span class="muted">(another workspace)</span>'}`).join("<br>")}</td></tr>`);
    document.getElementById("queues").innerHTML = table(["cluster queue", "cohort", "nominal", "used", "borrowed",
      "lent", "admitted", "pending", "positions"], rows) +
      (snap.time ? `<p class="muted">snapshot ${((Date.now() / 1000) - snap.time).toFixed(1)} s old</p>` : "");
  };
  await load();
  const timer = setInterval(() => load().catch(e => showError(e.message)), 3000);
  cleanup.push(() => clearInterval(timer));
}

async function nodesPage() {
  view.innerHTML = `<h2>Nodes</h2><div id="nodes"></div><h3>GPUs</h3><div id="gpus"></div>`;
  const load = async () => {
    const nodes = await api("/api/nodes");
    document.getElementById("nodes").innerHTML = table(["node", "GPUs", "health", "scheduling", "domain",
      "failing conditions", "your runs on it"], nodes.map(n => `<tr><td>${esc(n.node)}</td>` +
      `<td class="num">${n.gpus} (${esc(n.gpu_source)})</td>` +
      `<td>${badge(n.verdict)}${n.silent ? ` <span class="muted">silent ${Math.round(n.last_sample_age_s)} s</span>` : ""}</td>` +
      `<td>${n.cordoned ? "cordoned: " + esc(n.cordon_reason) : "schedulable"}</td>` +
      `<td class="nowrap">${esc(Object.values(n.domain || {}).join("/")) || "-"}</td>` +
      `<td>${Object.entries(n.conditions).map(([k, v]) => esc(k + " " + v)).join("<br>") || "-"}</td>` +
      `<td>${n.runs.map(r => `<a href="#/runs/${encodeURIComponent(r)}">${esc(r)}</a>`).join("<br>") || "-"}</td></tr>`));
    document.getElementById("gpus").innerHTML = table(["node", "GPU", "name", "temp °C", "util %", "memory MiB",
      "ECC uncorrected", "XIDs", "sampled"], nodes.flatMap(n => n.gpu_samples.map(g => `<tr><td>${esc(n.node)}</td>` +
      `<td class="num">${g.index}</td><td>${esc(g.name)}</td><td class="num">${g.temperature_c ?? "-"}</td>` +
      `<td class="num">${g.utilization_pct ?? "-"}</td><td class="num">${g.memory_used_mb} / ${g.memory_total_mb}</td>` +
      `<td class="num">${g.ecc_uncorrected ?? "-"}</td><td>${esc((g.xid_events || []).join(", ") || "-")}</td>` +
      `<td class="num">${Math.max(0, Math.round(Date.now() / 1000 - g.sampled_at))} s ago</td></tr>`)));
  };
  await load();
  const timer = setInterval(() => load().catch(e => showError(e.message)), 5000);
  cleanup.push(() => clearInterval(timer));
}

async function usagePage() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const by = params.get("by") || "user";
  view.innerHTML = `<h2>Usage</h2><form class="filters" id="usage-form">
      <select name="by">${["user", "workspace", "queue", "run"].map(b => `<option${b === by ? " selected" : ""}>${b}</option>`).join("")}</select>
      <input name="since" placeholder="since (30m, 12h, 7d)" value="${esc(params.get("since"))}"><button>Show</button>
    </form><div id="usage"></div>`;
  document.getElementById("usage-form").onsubmit = ev => {
    ev.preventDefault();
    location.hash = "#/usage?" + new URLSearchParams([...new FormData(ev.target)].filter(([, v]) => v));
  };
  const rows = await api("/api/usage?" + new URLSearchParams([["by", by], ...(params.get("since") ? [["since", params.get("since")]] : [])]));
  document.getElementById("usage").innerHTML = table([by, "runs", "GPU-hours", "queued", "running", "est. cost"],
    rows.map(r => `<tr><td>${esc(r[by])}</td><td class="num">${r.runs}</td><td class="num">${(r.gpu_seconds / 3600).toFixed(3)}</td>` +
      `<td class="num">${Math.round(r.queued_s)} s</td><td class="num">${Math.round(r.running_s)} s</td>` +
      `<td class="num">${Number(r.cost).toFixed(2)}</td></tr>`));
}

// ------------------------------------------------------------------ routing
async function route() {
  cleanup.forEach(f => f());
  cleanup = [];
  showError("");
  const path = location.hash.replace(/^#/, "").split("?")[0] || "/runs";
  const parts = path.split("/").filter(Boolean);
  document.querySelectorAll("nav a").forEach(a => a.classList.toggle("active", a.dataset.page === parts[0]));
  try {
    if (parts[0] === "runs" && parts[1]) await runPage(decodeURIComponent(parts[1]));
    else if (parts[0] === "queues") await queuesPage();
    else if (parts[0] === "nodes") await nodesPage();
    else if (parts[0] === "usage") await usagePage();
    else await runsPage();
  } catch (e) {
    if (e.status === 401) view.innerHTML = `<h2>Sign in</h2><p>Run <code>tau portal</code> and open the link it prints.</p>`;
    else if (e.status === 404) view.innerHTML = "";
    showError(e.message);
  }
}

async function start() {
  try {
    const me = await api("/api/me");
    document.getElementById("me").textContent = `${me.user} · ${me.role}` +
      (me.workspaces ? ` · ${me.workspaces.join(", ")}` : " · all workspaces");
  } catch (e) { /* the page itself says how to sign in */ }
  window.addEventListener("hashchange", route);
  await route();
}
start();
