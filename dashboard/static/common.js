// What every page shares: the API calls (the token rides in the Authorization header, kept in this
// tab's sessionStorage, never in a cookie), the navigation bar, and small formatting helpers.
"use strict";
const baton = {
  token() { return sessionStorage.getItem("batonToken") || ""; },
  async get(path) {
    const headers = { "Accept": "application/json" };
    if (baton.token()) headers["Authorization"] = "Bearer " + baton.token();
    const response = await fetch(path, { headers });
    const body = await response.json().catch(() => ({}));
    if (response.status === 401) baton.signedOut = true;
    if (!response.ok) throw new Error(body.detail || response.statusText);
    return body;
  },
  async act(path, payload) {
    const headers = { "Content-Type": "application/json" };
    if (baton.token()) headers["Authorization"] = "Bearer " + baton.token();
    const response = await fetch(path, { method: "POST", headers, body: JSON.stringify(payload || {}) });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(response.status + ": " + (body.detail || response.statusText));
    return body;
  },
  el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value; else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else if (value !== undefined && value !== null) node.setAttribute(key, value);
    }
    for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(child ?? ""));
    return node;
  },
  when(t) { return t ? new Date(t * 1000).toLocaleString() : ""; },
  ago(t) {
    if (!t) return "";
    const s = Math.max(0, Date.now() / 1000 - t);
    return s < 90 ? `${s.toFixed(0)} s ago` : s < 5400 ? `${(s / 60).toFixed(0)} min ago` : `${(s / 3600).toFixed(1)} h ago`;
  },
  num(v, digits = 4) { return v === null || v === undefined ? "" : (Number.isInteger(v) ? String(v) : Number(v).toPrecision(digits)); },
  size(n) { return n > 1 << 20 ? (n / (1 << 20)).toFixed(1) + " MiB" : n > 1024 ? (n / 1024).toFixed(1) + " KiB" : n + " B"; },
  // a job waiting again after it yielded its worker (nothing lost) reads "queued (yielded)", not "retrying"
  state(s, yielded) {
    const shown = s === "retrying" && yielded && yielded !== "0" ? "queued (yielded)" : s;
    return baton.el("span", { class: "state " + (shown === s ? s : "yielded") }, shown);
  },
  nav(here) {
    const links = [["/", "Jobs"], ["/queue", "Queue"], ["/workers", "Workers"], ["/audit", "Audit"]];
    const input = baton.el("input", { type: "password", id: "token", placeholder: "your token", value: baton.token() });
    // (the pool's server asks it of every read too: a page that was refused reads again with it)
    input.addEventListener("change", () => {
      sessionStorage.setItem("batonToken", input.value);
      if (baton.signedOut) location.reload();
    });
    const bar = baton.el("nav", {}, baton.el("span", { class: "brand" }, "baton"),
      ...links.map(([href, text]) => baton.el("a", { href, class: href === here ? "here" : "" }, text)),
      baton.el("span", { class: "token" }, "token:", input));
    document.body.prepend(bar);
  },
  say(node, error) { node.textContent = String(error.message || error); node.className = "error"; },
};
