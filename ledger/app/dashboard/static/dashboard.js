// tpu-ledger dashboard: live updates without reloading. The only script the page runs
// (the Content-Security-Policy allows no other): it listens to /api/stream (Server-Sent
// Events from the ledger's tail, below the root path the page names in data-root) and,
// when an event concerns this page, fetches the page again and swaps its live parts
// ([data-live]) in place. A job page only reacts to its own job's events; the other pages
// to any event.
"use strict";
(() => {
  const body = document.body;
  const status = document.getElementById("live-status");
  if (!("EventSource" in window) || !document.querySelector("[data-live]")) return;
  const job = body.dataset.job || null;
  let position = Number(body.dataset.position || 0);
  let timer = null;
  let inflight = false;
  let again = false;

  const say = (text, state) => {
    if (!status) return;
    status.textContent = text;
    status.className = "live " + state;
  };

  async function refresh() {
    if (inflight) { again = true; return; }
    inflight = true;
    try {
      const response = await fetch(window.location.href, { cache: "no-store", headers: { Accept: "text/html" } });
      if (!response.ok) throw new Error("HTTP " + response.status);
      const doc = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = doc.querySelectorAll("[data-live]");
      const old = document.querySelectorAll("[data-live]");
      if (fresh.length === old.length) {
        old.forEach((element, i) => element.replaceWith(document.adoptNode(fresh[i])));
      }
      position = Number(doc.body.dataset.position || position);
      body.dataset.position = String(position);
      say("live", "on");
    } catch (error) {
      say("update failed", "off");
    } finally {
      inflight = false;
      if (again) { again = false; schedule(); }
    }
  }

  function schedule() {
    if (timer === null) timer = setTimeout(() => { timer = null; refresh(); }, 120);
  }

  const source = new EventSource((body.dataset.root || "") + "/api/stream?after=" + position);
  source.addEventListener("open", () => say("live", "on"));
  source.addEventListener("error", () => say("reconnecting", "off"));
  source.addEventListener("reset", schedule);
  source.addEventListener("ledger", (message) => {
    const batch = JSON.parse(message.data);
    if (job && batch.streams && !batch.streams.includes(job)) return;
    schedule();
  });
})();
