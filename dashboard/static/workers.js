"use strict";
// Every worker heard from in the last day: alive or not, the queues it serves, the job it runs, when it
// last announced itself, drained or not; drain and undrain (with the token).
baton.nav("/workers");

function row(w) {
  const toggle = baton.el("button", { onclick: async () => {
    try { await baton.act(`/api/workers/${encodeURIComponent(w.name)}/drain`, { drained: !w.drained }); load(); }
    catch (error) { baton.say(document.getElementById("banner"), error); }
  } }, w.drained ? "undrain" : "drain");
  return baton.el("tr", { "data-name": w.name }, baton.el("td", {}, w.name), baton.el("td", {}, w.alive ? "alive" : "gone"),
    baton.el("td", {}, w.queues.join(", ")), baton.el("td", {}, w.job ? baton.el("a", { href: "/jobs/" + encodeURIComponent(w.job) }, w.job) : ""),
    baton.el("td", {}, baton.ago(w.last_seen)), baton.el("td", {}, w.drained ? "drained" : ""), baton.el("td", {}, w.alive && actionsAllowed ? toggle : ""));
}

async function load() {
  try {
    const answer = await baton.get("/api/workers");
    document.querySelector("#workers tbody").replaceChildren(...answer.workers.map(row));
    document.getElementById("banner").replaceChildren();
  } catch (error) { baton.say(document.getElementById("banner"), error); }
}
let actionsAllowed = true;
baton.get("/api/info").then((info) => { actionsAllowed = info.actions; }).catch(() => {}).finally(poll);
async function poll() { await load(); setTimeout(poll, 3000); }  // (one request at a time, however slow)
