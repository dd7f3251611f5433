"use strict";
baton.nav("/");
const view = { sort: "created_at", order: "desc", offset: 0, limit: 50 };

async function load() {
  const params = new URLSearchParams({ sort: view.sort, order: view.order, offset: view.offset, limit: view.limit });
  for (const key of ["state", "team", "queue", "name"]) {
    const value = document.getElementById("f-" + key).value.trim();
    if (value) params.set(key, value);
  }
  const body = document.querySelector("#jobs tbody");
  try {
    const page = await baton.get("/api/jobs?" + params);
    body.replaceChildren(...page.jobs.map(row));
    const last = Math.min(page.offset + page.limit, page.total);
    document.getElementById("page").textContent = page.total ? `${page.offset + 1}-${last} of ${page.total}` : "no jobs";
    document.getElementById("prev").disabled = page.offset === 0;
    document.getElementById("next").disabled = last >= page.total;
    document.getElementById("banner").replaceChildren();
  } catch (error) {
    baton.say(document.getElementById("banner"), error);
  }
}

function row(job) {
  const total = job.total_steps ? ` / ${job.total_steps}` : "";
  return baton.el("tr", { "data-id": job.id },
    baton.el("td", {}, baton.el("a", { href: "/jobs/" + encodeURIComponent(job.id) }, job.name || job.id),
      baton.el("div", { class: "muted" }, job.id)),
    baton.el("td", {}, baton.state(job.state, job.yielded)), baton.el("td", {}, job.team), baton.el("td", {}, job.submitted_by || ""),
    baton.el("td", {}, baton.num(job.priority)),
    baton.el("td", {}, job.queue), baton.el("td", {}, baton.num(job.attempt)),
    baton.el("td", {}, job.step === null || job.step === undefined ? "" : baton.num(job.step) + total),
    baton.el("td", {}, job.monitor || ""), baton.el("td", {}, baton.num(job.best_value)),
    baton.el("td", {}, job.state === "running" ? job.worker || "" : ""), baton.el("td", {}, baton.when(job.created_at)));
}

for (const th of document.querySelectorAll("th.sort")) {
  th.addEventListener("click", () => {
    view.order = view.sort === th.dataset.key && view.order === "desc" ? "asc" : "desc";
    view.sort = th.dataset.key; view.offset = 0; load();
  });
}
for (const input of document.querySelectorAll(".filters select, .filters input")) {
  input.addEventListener("change", () => { view.offset = 0; load(); });
}
document.getElementById("prev").addEventListener("click", () => { view.offset = Math.max(0, view.offset - view.limit); load(); });
document.getElementById("next").addEventListener("click", () => { view.offset += view.limit; load(); });
async function poll() { await load(); setTimeout(poll, 5000); }  // (one request at a time, however slow)
poll();
