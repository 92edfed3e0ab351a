// The layerserve console: chat, the life of each request, the stack now. Plain JS, no build.
// The API key (when the stack has keys) lives in sessionStorage only: gone with the tab.
"use strict";

const $ = (selector) => document.querySelector(selector);
const KEY_ITEM = "layerserve.key";
const state = {
  messages: [], controller: null, view: "chat", selected: null, shownSpans: -1, timers: {},
};

function headers() {
  const key = sessionStorage.getItem(KEY_ITEM);
  const h = { "Content-Type": "application/json" };
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

async function api(path, options = {}) {
  const response = await fetch(path, { headers: headers(), ...options });
  if (response.status === 401) {
    askForKey("That key was refused.");
    throw new Error("unauthorized");
  }
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error((body.error && body.error.message) || response.statusText);
  }
  return response;
}

function askForKey(message) {
  sessionStorage.removeItem(KEY_ITEM);
  $("#key-form").hidden = false;
  $("#key-error").textContent = message || "";
  $("#key-input").focus();
}

async function start() {
  const session = await (await fetch("/console/session.json")).json();
  if (session.keys_required && !sessionStorage.getItem(KEY_ITEM)) {
    askForKey("");
    return;
  }
  await loadModels();
  const info = await (await api("/console/api/info")).json();
  $("#who").textContent = "key: " + info.key;
  $("#trace-info").textContent = "Traces: " + info.traces + "." +
    (info.prompts ? " Prompts are shown (LAYERSERVE_LOG_PROMPTS=1)." : "");
}

async function loadModels() {
  const models = await (await api("/v1/models")).json();
  const select = $("#model");
  select.replaceChildren(...models.data.map((m) => new Option(m.id, m.id)));
}

// ---- chat ----

function addTurn(role, text) {
  const li = document.createElement("li");
  const who = document.createElement("span");
  who.className = "role";
  who.textContent = role;
  const content = document.createElement("span");
  content.className = "content";
  content.textContent = text;
  li.append(who, content);
  $("#conversation").append(li);
  return li;
}

function numberOr(id, fallback) {
  const value = parseFloat($(id).value);
  return Number.isFinite(value) ? value : fallback;
}

async function send(event) {
  event.preventDefault();
  const text = $("#prompt").value.trim();
  if (!text || state.controller) return;
  $("#prompt").value = "";
  $("#chat-error").textContent = "";
  state.messages.push({ role: "user", content: text });
  addTurn("user", text);
  const li = addTurn("assistant", "");
  li.classList.add("streaming");
  const content = li.querySelector(".content");
  const stats = document.createElement("span");
  stats.className = "stats";
  li.append(stats);
  state.controller = new AbortController();
  $("#stop").disabled = false;
  $("#send").disabled = true;
  const body = {
    model: $("#model").value,
    messages: state.messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: numberOr("#temperature", 0.7),
    top_p: numberOr("#top-p", 1),
    max_tokens: Math.round(numberOr("#max-tokens", 256)),
  };
  const t0 = performance.now();
  const timing = { first: null, last: null, usage: null, id: "", outcome: "" };
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST", body: JSON.stringify(body), signal: state.controller.signal,
    });
    timing.id = response.headers.get("X-Request-Id") || "";
    await readStream(response, (chunk) => {
      if (chunk.usage) timing.usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const delta = (choice.delta && choice.delta.content) || "";
        if (delta) {
          timing.first = timing.first ?? performance.now();
          timing.last = performance.now();
          content.textContent += delta;
        }
        if (choice.finish_reason) timing.outcome = choice.finish_reason;
      }
      showStats(stats, t0, timing);
    });
  } catch (err) {
    if (err.name === "AbortError") timing.outcome = "stopped";
    else if (err.message !== "unauthorized") $("#chat-error").textContent = err.message;
  }
  state.messages.push({ role: "assistant", content: content.textContent });
  li.classList.remove("streaming");
  li.dataset.outcome = timing.outcome || "error";
  showStats(stats, t0, timing);
  state.controller = null;
  $("#stop").disabled = true;
  $("#send").disabled = false;
  $("#prompt").focus();
}

// Server-sent events over fetch: one JSON chunk per `data:` line, until [DONE].
async function readStream(response, onChunk) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffered += decoder.decode(value, { stream: true });
    const lines = buffered.split("\n");
    buffered = lines.pop();
    for (const line of lines) {
      if (!line.startsWith("data: ")) continue;
      const data = line.slice(6).trim();
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      onChunk(chunk);
    }
  }
}

function showStats(node, t0, timing) {
  const parts = [];
  if (timing.first !== null) parts.push(`TTFT ${(timing.first - t0).toFixed(0)} ms`);
  const u = timing.usage;
  if (u) {
    parts.push(`prompt ${u.prompt_tokens}`, `completion ${u.completion_tokens}`);
    const cached = u.prompt_tokens_details && u.prompt_tokens_details.cached_tokens;
    if (cached) parts.push(`cached ${cached}`);
    if (u.completion_tokens > 1 && timing.last > timing.first) {
      const rate = (u.completion_tokens - 1) / ((timing.last - timing.first) / 1000);
      parts.push(`${rate.toFixed(1)} tok/s`);
    }
  }
  if (timing.outcome) parts.push(timing.outcome);
  if (timing.id) parts.push(timing.id);
  node.textContent = parts.join(" · ");
}

function stop() {
  if (state.controller) state.controller.abort();
}

// ---- requests ----

async function refreshTraces() {
  const { data } = await (await api("/console/api/traces")).json();
  const body = $("#traces tbody");
  body.replaceChildren(...data.map(traceRow));
  // Drawn again only when spans came in since: a row being read stays where it is.
  const selected = data.find((t) => t.trace_id === state.selected);
  if (selected && selected.num_spans !== state.shownSpans) await showTrace(state.selected, false);
}

function traceRow(t) {
  const tr = document.createElement("tr");
  tr.tabIndex = 0;
  tr.dataset.traceId = t.trace_id;
  tr.setAttribute("aria-selected", String(t.trace_id === state.selected));
  const services = t.services.map((s) => s.replace("layerserve-", ""));
  const cells = [t.request_id || t.trace_id, t.duration_ms.toFixed(1), String(t.num_spans),
    String(services.length)];
  cells.forEach((text, i) => {
    const td = document.createElement("td");
    td.textContent = text;
    td.className = i === 0 ? "id" : "num";
    if (i === 3) td.title = services.join(", ");
    tr.append(td);
  });
  const open = () => showTrace(t.trace_id, true);
  tr.addEventListener("click", open);
  tr.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(); } });
  return tr;
}

async function showTrace(traceId, fresh) {
  const detail = $("#trace-detail");
  if (!fresh && detail.querySelector("[aria-expanded='true']")) return; // keep what is open
  state.selected = traceId;
  for (const tr of document.querySelectorAll("#traces tbody tr")) {
    tr.setAttribute("aria-selected", String(tr.dataset.traceId === traceId));
  }
  const trace = await (await api("/console/api/traces/" + traceId)).json();
  state.shownSpans = trace.num_spans;
  LayerserveTimeline.render(detail, trace);
}

// ---- stack ----

const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%");

async function refreshStack() {
  const s = await (await api("/console/api/stack")).json();
  const g = s.gateway;
  const numbers = [
    ["running", s.totals.running, "stack-running"],
    ["waiting", s.totals.waiting, "stack-waiting"],
    ["KV blocks used", `${s.totals.kv_used_blocks} / ${s.totals.kv_blocks}`, "stack-kv"],
    ["tokens/s", g.tokens_per_s === null ? "–" : g.tokens_per_s.toFixed(1), "stack-tps"],
    ["in flight (gateway)", g.requests_in_flight, "stack-inflight"],
    ["mean TTFT ms", g.mean_ttft_ms === null ? "–" : g.mean_ttft_ms.toFixed(0), "stack-ttft"],
  ];
  $("#stack-totals").replaceChildren(...numbers.map(([label, value, id]) => {
    const div = document.createElement("div");
    const dt = document.createElement("dt");
    dt.textContent = label;
    const dd = document.createElement("dd");
    dd.id = id;
    dd.textContent = String(value);
    div.append(dt, dd);
    return div;
  }));
  const workers = [];
  const models = [];
  const errors = [];
  for (const sched of s.schedulers) {
    if (sched.error) errors.push(`${sched.address}: ${sched.error}`);
    for (const w of sched.workers) {
      workers.push([sched.address, w.model, w.address, w.running, w.waiting,
        `${pct(w.kv_used)} (${w.kv_used_blocks}/${w.kv_blocks})`, pct(w.prefix_hit_rate), w.steps, w.preemptions]);
    }
    for (const m of sched.models) models.push([m.id, m.replicas, m.max_model_len]);
  }
  const yours = s.yours.map((r) => [r.request_id, r.path, r.age_s.toFixed(1)]);
  fillTable("#stack-yours", yours, new Set([2]));
  fillTable("#stack-workers", workers, new Set([3, 4, 7, 8]));
  fillTable("#stack-models", models, new Set([1, 2]));
  $("#stack-error").textContent = s.schedulers.length ? errors.join("; ")
    : "No scheduler address known (LAYERSERVE_SCHEDULER_ADDRESS): only the gateway's numbers.";
}

function fillTable(selector, rows, numeric) {
  $(selector + " tbody").replaceChildren(...rows.map((cells) => {
    const tr = document.createElement("tr");
    cells.forEach((value, i) => {
      const td = document.createElement("td");
      td.textContent = String(value);
      if (numeric.has(i)) td.className = "num";
      tr.append(td);
    });
    return tr;
  }));
}

// ---- views, keyboard ----

const REFRESH = { requests: [refreshTraces, 2000], stack: [refreshStack, 1000] };

function show(view) {
  state.view = view;
  for (const tab of document.querySelectorAll("[role=tab]")) {
    const on = tab.id === "tab-" + view;
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
    $("#" + tab.getAttribute("aria-controls")).hidden = !on;
  }
  for (const timer of Object.values(state.timers)) clearInterval(timer);
  state.timers = {};
  const refresh = REFRESH[view];
  if (refresh) {
    const [fn, every] = refresh;
    const tick = () => fn().catch((err) => console.warn("refresh:", err.message));
    tick();
    state.timers[view] = setInterval(tick, every);
  }
}

function onTabKey(event) {
  const tabs = [...document.querySelectorAll("[role=tab]")];
  const i = tabs.indexOf(event.target);
  const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
  if (i < 0 || !step) return;
  const next = tabs[(i + step + tabs.length) % tabs.length];
  next.focus();
  show(next.id.slice(4));
}

function wire() {
  for (const tab of document.querySelectorAll("[role=tab]")) {
    tab.addEventListener("click", () => show(tab.id.slice(4)));
    tab.addEventListener("keydown", onTabKey);
  }
  $("#chat-form").addEventListener("submit", send);
  $("#stop").addEventListener("click", stop);
  $("#clear").addEventListener("click", () => {
    state.messages = [];
    $("#conversation").replaceChildren();
  });
  $("#prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("#chat-form").requestSubmit(); }
  });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") stop(); });
  $("#key-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY_ITEM, $("#key-input").value.trim());
    $("#key-input").value = "";
    try {
      await start();
      $("#key-form").hidden = true;
      $("#prompt").focus();
    } catch (err) {
      if (err.message !== "unauthorized") $("#key-error").textContent = err.message;
    }
  });
}

wire();
start().catch((err) => {
  if (err.message !== "unauthorized") $("#chat-error").textContent = err.message;
});
