// Thaw's console: reads the controller's /v1/state and /v1/events with the operator's
// token (kept for this tab only) and redraws every two seconds. Nothing here changes
// anything. A failed read says why in the status line and leaves the last view in place.
"use strict";

const EVERY_MS = 2000;
const EVENTS_SHOWN = 30;
const PHASES = ["queued", "instance_acquired", "snapshot_restored", "weights_loaded", "engine_ready", "first_token"];

function token() { return sessionStorage.getItem("thaw-token") || ""; }

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "-" : String(text);
  return td;
}

function fill(id, rows) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...rows.map((cells) => {
    const tr = document.createElement("tr");
    tr.append(...cells.map(cell));
    return tr;
  }));
}

function ago(now, at) { return at ? `${Math.round(now - at)} s ago` : null; }

function counts(obj) {
  const parts = Object.entries(obj || {}).filter(([, n]) => n).map(([k, n]) => `${n} ${k}`);
  return parts.length ? parts.join(", ") : "none";
}

function phases(record) {
  if (!record) return null;
  return PHASES.filter((p) => p in record.phases_s).map((p) => `${p} ${record.phases_s[p].toFixed(2)}`).join(" · ");
}

function draw(state, events) {
  const now = state.now;
  fill("models", state.models.map((m) => {
    const cold = m.last_cold_start;
    return [m.name, counts(m.replicas), m.queued, m.in_flight,
            cold ? `${cold.total_s.toFixed(2)} s, ${ago(now, cold.at)}` : null, cold ? cold.tier : null,
            phases(cold), m.error];
  }));
  fill("pools", state.shapes.map((s) => [
    s.shape, counts(s.counts), `${s.standby_min}-${s.standby_max}`, s.standby_target, s.standby_granted,
    `${s.spend_usd_per_hour.toFixed(2)} / ${s.budget_usd_per_hour === null ? "none" : s.budget_usd_per_hour.toFixed(2)}`,
    s.backoff_until && s.backoff_until > now ? `paused: ${s.backoff_reason}` : "open"]));
  fill("workers", state.workers.map((w) => [w.id, w.state, w.model, Math.round(w.age_s)]));
  fill("events", events.slice(-EVENTS_SHOWN).reverse().map((e) => [
    ago(now, e.at), e.kind, e.reason, e.model, e.worker_id, e.outcome]));
}

function say(state, text) {
  const el = document.getElementById("status");
  el.dataset.state = state;
  el.textContent = text;
}

async function read(path) {
  const r = await fetch(path, {headers: {Authorization: `Bearer ${token()}`}, cache: "no-store"});
  if (r.status === 401) throw new Error("the token was refused");
  if (r.status === 503 && r.headers.get("x-thaw-leader")) {
    throw new Error(`this controller follows; the leader is ${r.headers.get("x-thaw-leader")}`);
  }
  if (!r.ok) throw new Error(`${path} answered ${r.status}`);
  return r.json();
}

async function refresh() {
  if (!token()) { say("idle", "give a token to connect"); return; }
  try {
    const [state, events] = await Promise.all([read("/v1/state"), read("/v1/events")]);
    draw(state, events.events);
    say("live", `live: ${state.models.length} models, ${state.workers.length} workers` +
        (state.adopted ? "" : " (adopting the fleet)"));
  } catch (err) {
    // A fetch that cannot connect is a TypeError: the controller is gone.
    say("error", err instanceof TypeError ? "the controller does not answer" : `error: ${err.message}`);
  }
}

// A token in the address's fragment (console#token=...; never sent to the server) is
// taken for this tab and dropped from the address.
const given = new URLSearchParams(location.hash.slice(1)).get("token");
if (given) {
  sessionStorage.setItem("thaw-token", given);
  history.replaceState(null, "", location.pathname);
}

document.getElementById("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem("thaw-token", document.getElementById("token").value);
  refresh();
});
refresh();
setInterval(refresh, EVERY_MS);
