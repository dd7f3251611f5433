"use strict";
// One job: facts, actions, live curves (committed rows, then the live points past them), the attempt
// timeline, checkpoints, artifacts, the log (followed) and the report. Polls every 2 s while it runs.
baton.nav("");
const jobId = decodeURIComponent(location.pathname.split("/").pop());
const api = "/api/jobs/" + encodeURIComponent(jobId);
const charts = {};
let logChunks = 0, terminal = false;

function facts(s, source) {
  const total = s.total_steps ? ` / ${s.total_steps}` : "";
  const waiting = ["queued", "retrying"].includes(s.state);
  const items = [["state", baton.state(s.state, s.yielded)], ["team", s.team], ["submitted by", s.submitted_by || "-"], ["priority", baton.num(s.priority)], ["queue", s.queue],
    ["attempt", `${s.attempt ?? ""}${s.lost ? ` (${s.lost} lost)` : ""}`], ["step", s.step === null || s.step === undefined ? "" : `${s.step}${total}`],
    [s.state === "running" ? "worker" : "last worker", s.worker || ""], [s.monitor ? `best ${s.monitor}` : "best", baton.num(s.best_value)],
    ["loss", baton.num(s.loss)], ["learning rate", baton.num(s.lr)],
    ["waiting", s.waiting || ""], ["last event", waiting ? s.last_event || "" : ""],
    ["record", source === "store" ? "from the store only (Redis holds none)" : "Redis"]];
  if (s.error) items.push(["error", s.error]);
  document.getElementById("facts").replaceChildren(...items.filter(([, v]) => v !== "").map(([k, v]) =>
    baton.el("div", { "data-fact": k }, baton.el("span", {}, k), v)));
}

const WHY = { lost: " (its worker stopped renewing it: killed, or its machine or network lost)",
  lapsed: " (Redis was unreachable: not counted as a loss)" };

function timeline(rows, source) {
  const body = document.querySelector("#timeline tbody");
  if (!rows.length) {
    body.replaceChildren(baton.el("tr", {}, baton.el("td", { colspan: "8", class: "muted" }, source === "store"
      ? "a job's events are kept in Redis, which holds no record of this one" : "no events yet")));
    return;
  }
  body.replaceChildren(...rows.map((e) => baton.el("tr", { "data-kind": e.kind },
    baton.el("td", {}, baton.when(e.t)), baton.el("td", {}, e.kind), baton.el("td", {}, baton.num(e.attempt)),
    baton.el("td", {}, e.worker), baton.el("td", {}, baton.num(e.step)),
    baton.el("td", {}, e.gap_s === undefined ? "" : `${e.gap_s.toFixed(1)} s (${e.after})`),
    baton.el("td", {}, e.redone === undefined ? "" : `at least ${e.redone}`), baton.el("td", { class: "wrap" }, e.text + (WHY[e.kind] || "")))));
}

function checkpoints(rows) {
  document.querySelector("#checkpoints tbody").replaceChildren(...rows.map((c) => baton.el("tr", {},
    baton.el("td", {}, String(c.step)), baton.el("td", {}, c.kind),
    baton.el("td", {}, String(c.attempt)), baton.el("td", {}, baton.size(c.size)), baton.el("td", {}, baton.when(c.created_at)),
    baton.el("td", {}, [c.latest ? "latest" : "", c.best ? `best (${c.metric} ${baton.num(c.value)})` : ""].filter(Boolean).join(", ")))));
}

function artifacts(items) {
  const list = document.getElementById("artifacts");
  list.replaceChildren(...items.map((a) => baton.el("li", {},
    baton.el("a", { href: `${api}/artifacts/${a.which}`, download: a.file, "data-which": a.which }, a.file), ` (${a.which}, ${baton.size(a.size)})`)));
  if (!items.length) list.replaceChildren(baton.el("li", { class: "muted" }, "none yet"));
}

function chart(id, title, series, data) {
  const node = document.getElementById(id);
  const width = Math.max(300, node.clientWidth - 12);
  if (!charts[id] || charts[id].series.length !== series.length + 1) {
    if (charts[id]) charts[id].destroy();
    const tick = (u, values) => values.map((v) => (v === null ? "" : String(+v.toPrecision(3))));
    // the y axis as wide as its longest label (a learning rate's 0.000125 or 1.25e-7 is not clipped)
    const wide = (u, values) => 18 + 7 * Math.max(4, ...(values || []).map((v) => String(v).length));
    const opts = { title, width, height: 240, scales: { x: { time: false } }, legend: { live: false },
      axes: [{}, { values: tick, size: wide }],
      series: [{ label: "step" }, ...series.map((s) => ({ spanGaps: true, points: { show: false }, ...s }))] };
    charts[id] = new uPlot(opts, data, node);
  } else {
    charts[id].setData(data);
  }
  node.dataset.points = String(data[0].length);
}

// The curves' data, column by column, each in step order: rows arrive past the last step held.
const curve = { trainStep: [], trainLoss: [], valStep: [], lrStep: [], lr: [], val: {}, live: [], lastStep: -1 };

function align(tables) {
  // One x (the steps of every table, merged) and each table's columns on it (null where it has no point).
  const at = tables.map(() => 0), x = [], ys = tables.map((t) => t.ys.map(() => []));
  for (;;) {
    let next = Infinity;
    tables.forEach((t, i) => { if (at[i] < t.x.length && t.x[at[i]] < next) next = t.x[at[i]]; });
    if (next === Infinity) break;
    x.push(next);
    tables.forEach((t, i) => {
      const hit = at[i] < t.x.length && t.x[at[i]] === next;
      t.ys.forEach((column, j) => ys[i][j].push(hit ? column[at[i]] : null));
      if (hit) at[i]++;
    });
  }
  return [x, ...ys.flat()];
}

function draw() {
  const live = curve.live.filter((p) => p.step > curve.lastStep);
  const liveTable = { x: live.map((p) => p.step), ys: [live.map((p) => p.loss)] };
  chart("loss", "loss", [{ label: "train loss", stroke: "#2563eb" }, { label: "val loss", stroke: "#dc2626", points: { show: true } },
    { label: "train loss (live)", stroke: "#93c5fd" }],
    align([{ x: curve.trainStep, ys: [curve.trainLoss] }, { x: curve.valStep, ys: [curve.val.val_loss || curve.valStep.map(() => null)] }, liveTable]));
  chart("lr", "learning rate", [{ label: "lr", stroke: "#059669" }, { label: "lr (live)", stroke: "#6ee7b7" }],
    align([{ x: curve.lrStep, ys: [curve.lr] }, { x: live.map((p) => p.step), ys: [live.map((p) => p.lr)] }]));
  const names = Object.keys(curve.val).filter((n) => n !== "val_loss").sort();
  const colors = ["#7c3aed", "#ea580c", "#0891b2", "#65a30d", "#db2777"];
  chart("val", "validation metrics", names.map((n, i) => ({ label: n, stroke: colors[i % colors.length], points: { show: true } })),
    [curve.valStep, ...names.map((n) => curve.val[n])]);
  document.getElementById("loss").dataset.trainPoints = String(curve.trainStep.length + live.length);
  window.batonChartsDrawn = window.batonChartsDrawn || performance.now();
}

const everyRow = new URLSearchParams(location.search).get("rows") === "all";

async function metrics() {
  const m = await baton.get(`${api}/metrics?since=${curve.lastStep}&max_rows=${everyRow ? 0 : 10000}`);
  if (m.stride > 1) {
    const note = document.getElementById("sampled");
    note.replaceChildren(`showing every ${m.stride}th of ${m.total_rows} rows (and the last) · `,
      baton.el("a", { href: "?rows=all" }, "show all"));
  }
  performance.mark("baton-metrics-received");
  for (const row of m.rows) {
    for (const [step, loss] of row.train_curve || []) { curve.trainStep.push(step); curve.trainLoss.push(loss); }
    const held = curve.valStep.length;
    curve.valStep.push(row.step);
    // the rate step by step where the row has it (lr_curve), else at the validation alone
    const rates = row.lr_curve && row.lr_curve.length ? row.lr_curve : [[row.step, row.lr ?? null]];
    for (const [step, lr] of rates) {
      if (curve.lrStep.length && step <= curve.lrStep[curve.lrStep.length - 1]) continue;
      curve.lrStep.push(step); curve.lr.push(lr);
    }
    for (const key in row) {
      if (!key.startsWith("val_")) continue;
      if (!curve.val[key]) curve.val[key] = new Array(held).fill(null);
      curve.val[key].push(row[key]);
    }
    for (const key in curve.val) if (curve.val[key].length < curve.valStep.length) curve.val[key].push(null);
    if (row.step > curve.lastStep) curve.lastStep = row.step;
  }
  const known = new Map(curve.live.map((p) => [p.step, p]));
  for (const point of m.live) known.set(point.step, point);
  curve.live = [...known.values()].filter((p) => p.step > curve.lastStep).sort((a, b) => a.step - b.step);
  performance.mark("baton-metrics-columns");
  draw();
}

async function log() {
  if (!document.getElementById("follow").checked && logChunks) return;
  const part = await baton.get(`${api}/log?since=${logChunks}`);
  if (part.chunks < logChunks) { logChunks = 0; document.getElementById("log").textContent = ""; return; }
  const pre = document.getElementById("log");
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent += part.text;
  logChunks = part.chunks;
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}

async function refresh() {
  try {
    const curves = metrics();  // (fetched beside the job's facts, not after them)
    const job = await baton.get(api);
    const s = job.status;
    document.getElementById("title").replaceChildren(s.name || jobId, baton.el("span", { class: "muted id" }, " " + jobId));
    document.title = `baton · ${s.name || jobId}`;
    const note = document.getElementById("store-note");
    note.textContent = job.store_note || ""; note.hidden = !job.store_note;
    facts(s, job.source); timeline(job.timeline, job.source); checkpoints(job.checkpoints); artifacts(job.artifacts);
    document.getElementById("spec").textContent = JSON.stringify(job.spec, null, 2);
    if (job.report) { const r = document.getElementById("report"); r.className = ""; r.textContent = JSON.stringify(job.report, null, 2); }
    document.getElementById("actions").hidden = job.source !== "redis" || !actionsAllowed;
    const ended = ["succeeded", "failed", "cancelled"].includes(s.state);
    document.getElementById("cancel").hidden = ended;
    document.getElementById("resume").hidden = !["failed", "cancelled", "paused"].includes(s.state);
    for (const id of ["priority", "set-priority"]) document.getElementById(id).hidden = ended;
    terminal = ["succeeded", "failed", "cancelled", "stored"].includes(s.state);
    await curves;
    await log();
    document.getElementById("banner").replaceChildren();
  } catch (error) {
    baton.say(document.getElementById("banner"), error);
  }
  setTimeout(refresh, terminal ? 15000 : 2000);
}

async function act(what, payload) {
  const result = document.getElementById("action-result");
  try {
    const answer = await baton.act(`${api}/${what}`, payload);
    result.className = "muted"; result.textContent = `${what}: ${answer.result ?? answer.attempt ?? answer.priority ?? "done"}`;
  } catch (error) { baton.say(result, error); }
}
document.getElementById("cancel").addEventListener("click", () => act("cancel"));
document.getElementById("resume").addEventListener("click", () => act("resume"));
document.getElementById("set-priority").addEventListener("click", () =>
  act("priority", { priority: parseInt(document.getElementById("priority").value, 10) }));
let actionsAllowed = true;
baton.get("/api/info").then((info) => {
  actionsAllowed = info.actions;
  if (!info.actions) document.getElementById("read-only").hidden = false;
}).catch(() => {}).finally(refresh);
