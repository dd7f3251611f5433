"use strict";
// The pool server's audit trail, newest first (an admin's token): who asked for what, on what, allowed or
// refused and why, from where. Filtered by user and age; read again every 5 s.
baton.nav("/audit");

function row(e) {
  return baton.el("tr", { class: e.result }, baton.el("td", {}, baton.when(e.at)), baton.el("td", {}, e.principal || "-"),
    baton.el("td", {}, e.action), baton.el("td", {}, e.target || "-"), baton.el("td", {}, e.result),
    baton.el("td", {}, e.reason), baton.el("td", {}, e.client));
}

async function load() {
  const query = new URLSearchParams({ limit: "500" });
  const user = document.getElementById("user").value.trim(), since = document.getElementById("since").value;
  if (user) query.set("user", user);
  if (since) query.set("since", String(Date.now() / 1000 - Number(since)));
  try {
    const answer = await baton.get("/api/audit?" + query);
    document.querySelector("#audit tbody").replaceChildren(...answer.entries.map(row));
    document.getElementById("banner").replaceChildren();
  } catch (error) {
    const notHere = String(error.message) === "Not Found";  // (baton ui: one person's dashboard keeps no trail)
    baton.say(document.getElementById("banner"), notHere ? "the audit trail is kept by the pool's server (baton server)" : error);
  }
}
for (const id of ["user", "since"]) document.getElementById(id).addEventListener("change", load);
async function poll() { await load(); setTimeout(poll, 5000); }  // (one request at a time, however slow)
poll();
