// The life of one request: its spans from every service on one time axis, numbers first.
// LayerserveTimeline.render(container, trace) with trace as GET /console/api/traces/{id} gives.
"use strict";

const LayerserveTimeline = (() => {
  const SERVICES = ["gateway", "tokenizer", "scheduler", "worker"];

  function serviceOf(span) {
    return SERVICES.find((s) => span.service.includes(s)) || "other";
  }

  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
      if (key === "class") node.className = value;
      else if (key.startsWith("data-") || key.startsWith("aria-")) node.setAttribute(key, value);
      else node[key] = value;
    }
    for (const child of children) node.append(child);
    return node;
  }

  const ms = (ns) => (ns / 1e6).toFixed(ns < 1e7 ? 2 : 1);

  // Depth-first, children in start order; spans whose parent is not here (an engine step's
  // root, which links this request) start trees of their own.
  function ordered(spans) {
    const ids = new Set(spans.map((s) => s.span_id));
    const children = new Map();
    const roots = [];
    for (const span of spans) {
      if (ids.has(span.parent_id)) {
        if (!children.has(span.parent_id)) children.set(span.parent_id, []);
        children.get(span.parent_id).push(span);
      } else {
        roots.push(span);
      }
    }
    const out = [];
    const visit = (span, depth) => {
      out.push([span, depth]);
      for (const child of children.get(span.span_id) || []) visit(child, depth + 1);
    };
    const byStart = (a, b) => a.start_ns - b.start_ns;
    roots.sort(byStart).forEach((root) => visit(root, 0));
    for (const list of children.values()) list.sort(byStart);
    return out;
  }

  // Count and time per (service, span name): where the request's time went, in one table.
  function summary(spans) {
    const rows = new Map();
    for (const span of spans) {
      const key = serviceOf(span) + "\u0000" + span.name;
      const row = rows.get(key) || { service: serviceOf(span), name: span.name, n: 0, ns: 0 };
      row.n += 1;
      row.ns += span.end_ns - span.start_ns;
      rows.set(key, row);
    }
    const table = el("table", { class: "summary" },
      el("thead", {}, el("tr", {}, el("th", {}, "service"), el("th", {}, "span"),
        el("th", { class: "num" }, "count"), el("th", { class: "num" }, "total ms"))));
    const body = el("tbody");
    const sorted = [...rows.values()].sort(
      (a, b) => SERVICES.indexOf(a.service) - SERVICES.indexOf(b.service) || b.ns - a.ns);
    for (const row of sorted) {
      body.append(el("tr", { "data-service": row.service },
        el("td", {}, el("span", { class: "dot svc-" + row.service }), row.service),
        el("td", {}, row.name), el("td", { class: "num" }, String(row.n)),
        el("td", { class: "num" }, ms(row.ns))));
    }
    table.append(body);
    return el("div", { class: "table-scroll" }, table);
  }

  function attributes(span) {
    const body = el("tbody");
    const entries = Object.entries(span.attributes).sort();
    entries.unshift(["service", span.service], ["start (ms from trace start)", span.offset]);
    if (span.error) entries.unshift(["error", span.error]);
    for (const [key, value] of entries) {
      const text = typeof value === "string" ? value : JSON.stringify(value);
      body.append(el("tr", {}, el("td", {}, key), el("td", {}, text)));
    }
    return el("table", { class: "attrs" }, body);
  }

  // A few numbers beside a span's name, so that the timeline reads without opening rows.
  const BRIEF = [
    ["layerserve.step.running_sequences", "running"],
    ["layerserve.step.new_sequences", "new"],
    ["layerserve.step.tokens", "tok"],
    ["layerserve.prefill.tokens", "tok"],
    ["layerserve.cached_prefix_tokens", "cached"],
    ["layerserve.predicted_cached_prefix_tokens", "predicted"],
    ["gen_ai.usage.output_tokens", "out"],
  ];

  function brief(span) {
    return BRIEF.filter(([key]) => key in span.attributes)
      .map(([key, label]) => `${label} ${span.attributes[key]}`).join(", ");
  }

  function row(span, depth, t0, total) {
    const service = serviceOf(span);
    const bar = el("span", { class: "span-bar" });
    bar.style.left = ((100 * (span.start_ns - t0)) / total).toFixed(3) + "%";
    bar.style.width = ((100 * (span.end_ns - span.start_ns)) / total).toFixed(3) + "%";
    const numbers = brief(span);
    const name = el("span", { class: "span-name" }, span.name);
    if (numbers) name.append(el("span", { class: "muted" }, " " + numbers));
    name.style.paddingLeft = depth * 0.75 + "rem";
    const button = el("button", {
      type: "button",
      class: "span-row svc-" + service + (span.error ? " span-error" : ""),
      "aria-expanded": "false",
      "data-service": service,
      "data-name": span.name,
      title: span.service + ": " + span.name,
    }, name, el("span", { class: "span-track" }, bar),
    el("span", { class: "span-ms" }, ms(span.end_ns - span.start_ns)));
    span.offset = ms(span.start_ns - t0);
    let details = null;
    button.addEventListener("click", () => {
      const open = button.getAttribute("aria-expanded") === "true";
      button.setAttribute("aria-expanded", String(!open));
      if (open) { details.remove(); return; }
      details = attributes(span);
      button.after(details);
    });
    return button;
  }

  function render(container, trace) {
    const spans = trace.spans;
    container.replaceChildren();
    const t0 = Math.min(...spans.map((s) => s.start_ns));
    const t1 = Math.max(...spans.map((s) => s.end_ns));
    const total = Math.max(t1 - t0, 1);
    const head = el("p", {},
      el("strong", {}, trace.request_id || trace.trace_id), " ",
      `${ms(total)} ms, ${spans.length} spans` +
      (trace.dropped_spans ? ` (${trace.dropped_spans} more not kept)` : "") + " ",
      el("span", { class: "muted" }, "trace " + trace.trace_id));
    container.append(head);
    if (trace.prompt) container.append(el("p", { class: "muted" }, "prompt: " + trace.prompt));
    if (!spans.length) {
      container.append(el("p", { class: "muted" }, "No spans yet: they arrive within a second."));
      return;
    }
    container.append(summary(spans));
    const legend = el("p", { class: "legend" });
    for (const s of SERVICES) legend.append(el("span", { class: "dot svc-" + s }), s);
    container.append(legend);
    const timeline = el("div", { class: "timeline" });
    for (const [span, depth] of ordered(spans)) timeline.append(row(span, depth, t0, total));
    container.append(timeline);
  }

  return { render, serviceOf };
})();
