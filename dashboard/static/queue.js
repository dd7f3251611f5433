"use strict";
// Each queue: its waiting jobs in the order they will start (positions and reasons, as `baton queue`
// says them), its running jobs, and each team's use against its quota.
baton.nav("/queue");
const link = (id, name) => baton.el("span", {}, baton.el("a", { href: "/jobs/" + encodeURIComponent(id) }, name || id),
  name && name !== id ? baton.el("span", { class: "muted" }, " " + id) : "");

function section(q) {
  const waiting = baton.el("table", { class: "waiting", "data-queue": q.queue },
    baton.el("thead", {}, baton.el("tr", {}, ...["#", "job", "team", "by", "priority", "why it waits"].map((h) => baton.el("th", {}, h)))),
    baton.el("tbody", {}, ...q.waiting.map((w) => baton.el("tr", { "data-id": w.id },
      baton.el("td", { class: "position" }, String(w.position)), baton.el("td", {}, link(w.id, w.name)), baton.el("td", {}, w.team),
      baton.el("td", {}, w.submitted_by || "-"), baton.el("td", {}, String(w.priority)), baton.el("td", { class: "wrap reason" }, (w.reason || "").replaceAll("`", ""))))));
  const running = baton.el("table", { class: "running" },
    baton.el("thead", {}, baton.el("tr", {}, ...["job", "team", "by", "priority", "worker", "step", "attempt"].map((h) => baton.el("th", {}, h)))),
    baton.el("tbody", {}, ...q.running.map((r) => baton.el("tr", { "data-id": r.id },
      baton.el("td", {}, link(r.id, r.name)), baton.el("td", {}, r.team), baton.el("td", {}, r.submitted_by || "-"), baton.el("td", {}, String(r.priority)),
      baton.el("td", {}, r.worker || ""), baton.el("td", {}, r.step === null ? "" : `${r.step}${r.total_steps ? " / " + r.total_steps : ""}`),
      baton.el("td", {}, String(r.attempt))))));
  const teams = [...new Set([...Object.keys(q.usage), ...Object.keys(q.quotas)])].sort();
  const quota = baton.el("table", { class: "teams" },
    baton.el("thead", {}, baton.el("tr", {}, ...["team", "slots in use", "quota"].map((h) => baton.el("th", {}, h)))),
    baton.el("tbody", {}, ...teams.map((t) => baton.el("tr", {}, baton.el("td", {}, t), baton.el("td", {}, String(q.usage[t] || 0)),
      baton.el("td", {}, q.quotas[t] === undefined ? "none" : String(q.quotas[t]))))));
  const workers = `${q.workers.length} live worker(s)` + (q.drained.length ? `, ${q.drained.length} drained` : "");
  return baton.el("section", {}, baton.el("h2", {}, `queue ${q.queue}`), baton.el("p", { class: "muted" }, workers),
    baton.el("h3", {}, `waiting (${q.waiting.length})`), waiting, baton.el("h3", {}, `running (${q.running.length})`), running,
    ...(teams.length ? [baton.el("h3", {}, "teams"), quota] : []));
}

async function load() {
  try {
    const answer = await baton.get("/api/queue");
    document.getElementById("queues").replaceChildren(...answer.queues.map(section));
    if (!answer.queues.length) document.getElementById("queues").replaceChildren(baton.el("p", { class: "muted" }, "no queue has been used yet"));
    document.getElementById("banner").replaceChildren();
  } catch (error) { baton.say(document.getElementById("banner"), error); }
}
async function poll() { await load(); setTimeout(poll, 3000); }  // (one request at a time, however slow)
poll();
