// The active context panel: leading system messages, pins, the summary by section with
// clickable source pointers, the exact tail, context/explain, and the compaction history
// with a chart of active tokens against the archive's size.

import { clear, contentText, fmtInt, fmtTime, h, longText } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

export function renderSystem(box, context) {
  clear(box);
  const items = [];
  for (let i = 0; i < context.messages.length; i++) {
    const m = context.messages[i];
    const id = context.messageIds[i];
    if (m.role !== "system" || id === null) break;
    items.push(h("div", { class: "sys-msg" },
      h("span", { class: "meta" }, `msg ${id}`), longText(contentText(m.content), { lines: 4, chars: 400 })));
  }
  box.append(...(items.length ? items : [h("p", { class: "empty" }, "No leading system messages.")]));
}

export function renderPins(box, pins, { onRemove }) {
  clear(box);
  if (!pins.length) box.append(h("p", { class: "empty" }, "No pins."));
  for (const pin of pins) {
    box.append(h("div", { class: "pin", dataset: { pinId: pin.pinId } },
      h("div", { class: "pin-text" }, pin.text),
      h("button", { class: "icon", type: "button", title: "Remove this pin",
        "aria-label": "Remove pin", onclick: () => onRemove(pin) }, "✕")));
  }
}

export function renderSummary(box, explain, { onJump, detailed }) {
  clear(box);
  const items = explain ? explain.items : [];
  if (!items.length) {
    box.append(h("p", { class: "empty" }, "No summary yet: nothing has been compacted."));
    return;
  }
  const sections = new Map();
  for (const item of items) {
    if (!sections.has(item.section)) sections.set(item.section, []);
    sections.get(item.section).push(item);
  }
  for (const [section, list] of sections) {
    const ul = h("ul", { class: "summary-items" });
    for (const item of list) {
      const pointers = h("span", { class: "pointers" });
      for (const src of item.sources || []) {
        pointers.append(h("button", {
          type: "button", class: src.broken ? "pointer broken" : "pointer",
          dataset: { id: String(src.id) },
          title: src.broken ? `msg ${src.id}: missing from the archive`
            : `msg ${src.id} · ${src.role}: ${src.snippet || ""}`,
          onclick: () => onJump(src.id) }, src.ordinal ? `#${src.ordinal}` : `msg ${src.id}`));
      }
      const li = h("li", { class: `summary-item status-${item.status || "active"}` },
        h("span", { class: "item-text" }, item.text), pointers);
      if (detailed) {
        const details = h("div", { class: "explain" }, h("div", { class: "meta" }, `status: ${item.status || "–"}`));
        for (const src of item.sources || []) {
          details.append(h("div", { class: "explain-src" },
            src.broken ? `msg ${src.id}: missing from the archive`
              : `${src.ordinal ? `#${src.ordinal} · ` : ""}msg ${src.id} ${src.role} · ${fmtTime(src.createdAt)}: ${src.snippet || ""}`));
        }
        li.append(details);
      }
      ul.append(li);
    }
    box.append(h("section", { class: "summary-section" }, h("h4", null, section.replace(/_/g, " ")), ul));
  }
  if (detailed && explain.provenance) {
    const p = explain.provenance;
    box.append(h("div", { class: "provenance meta" },
      `Covers #${p.coversFromOrdinal ?? "–"} to #${p.coversToOrdinal ?? "–"} (msg ${p.coversFrom ?? "–"} to ${p.coversTo ?? "–"}) · summarizer ${p.summarizer ?? "–"} · `
      + `${(p.compactionIds || []).length} compaction(s) · ${explain.brokenPointers} broken pointer(s)`));
  }
}

export function renderTail(box, context, { onJump }) {
  clear(box);
  const ids = context.messageIds;
  let start = ids.indexOf(null) + 1;
  if (start === 0) {
    // no summary message: the tail follows the leading system messages
    while (start < ids.length && context.messages[start].role === "system") start++;
  }
  const rows = [];
  // the tail is the archive's end: its last message is the session's #archiveMessages
  const total = context.status ? context.status.archiveMessages : null;
  const ordinal = (i) => (total == null ? null : total - (ids.length - 1 - i));
  for (let i = start; i < ids.length; i++) {
    const m = context.messages[i];
    const id = ids[i];
    if (id === null) continue;
    const text = contentText(m.content)
      || (m.tool_calls ? `→ ${m.tool_calls.map((c) => (c.function || {}).name).join(", ")}` : "");
    rows.push(h("button", { type: "button", class: "tail-row",
      dataset: { id: String(id), ordinal: String(ordinal(i)) }, onclick: () => onJump(id) },
    h("span", { class: `role role-${m.role}` }, m.role), ` #${ordinal(i)} · msg ${id} `,
    h("span", { class: "preview" }, text.slice(0, 120))));
  }
  box.append(h("p", { class: "meta" }, rows.length
    ? `${rows.length} messages, #${rows[0].dataset.ordinal} to #${rows[rows.length - 1].dataset.ordinal}, exactly as archived`
    : "The tail is empty."));
  box.append(h("div", { class: "tail-list" }, rows));
}

export function renderHistory(box, compactions, status) {
  clear(box);
  if (!compactions.length) {
    box.append(h("p", { class: "empty" }, "No compaction yet."));
    return;
  }
  box.append(chart(compactions, status));
  const table = h("table", { class: "history" },
    h("thead", null, h("tr", null, ...["When", "Trigger", "Result", "Messages", "Tokens"].map((t) => h("th", null, t)))));
  const body = h("tbody");
  for (const c of compactions) {
    const result = c.error ? `failed: ${c.error}` : c.effective ? "effective" : "not effective";
    body.append(h("tr", { class: c.effective ? "ok" : "no" },
      h("td", { title: fmtTime(c.startedAt) }, fmtTime(c.startedAt)),
      h("td", null, c.trigger),
      h("td", null, result),
      h("td", null, `${fmtInt(c.beforeMessages)} → ${fmtInt(c.afterMessages)}`),
      h("td", null, `${fmtInt(c.beforeTokens)} → ${fmtInt(c.afterTokens)}`)));
  }
  table.append(body);
  box.append(table);
}

// Active tokens (a sawtooth: before and after each compaction) and archived tokens,
// against the archive's size in messages, with the present as the last point.
function chart(compactions, status) {
  const W = 320, H = 150, L = 44, B = 22, T = 8, R = 8;
  const rows = compactions.slice().reverse();
  const active = [];
  const archive = [];
  for (const c of rows) {
    active.push([c.archiveMessages, c.beforeTokens], [c.archiveMessages, c.committed ? c.afterTokens : c.beforeTokens]);
    archive.push([c.archiveMessages, c.archiveTokens]);
  }
  if (status) active.push([status.archiveMessages, status.estimatedTokens]);
  const xs = [...active, ...archive].map((p) => p[0]);
  const ys = [...active, ...archive].map((p) => p[1]);
  const xmax = Math.max(1, ...xs), ymax = Math.max(1, ...ys);
  const px = (x) => L + (x / xmax) * (W - L - R);
  const py = (y) => H - B - (y / ymax) * (H - B - T);
  const path = (pts) => pts.map((p, i) => `${i ? "L" : "M"}${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join(" ");
  const last = rows[rows.length - 1];
  const saved = last && last.archiveTokens ? Math.round((1 - (status ? status.estimatedTokens : last.afterTokens) / Math.max(1, last.archiveTokens)) * 100) : null;
  return h("figure", { class: "chart" },
    svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "Active tokens against archive size", id: "history-chart" },
      svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }),
      svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }),
      svg("text", { x: L - 4, y: T + 8, class: "tick", "text-anchor": "end" }, compact(ymax)),
      svg("text", { x: L - 4, y: H - B, class: "tick", "text-anchor": "end" }, "0"),
      svg("text", { x: W - R, y: H - 6, class: "tick", "text-anchor": "end" }, `${compact(xmax)} msgs archived`),
      svg("path", { d: path(archive), class: "line archive" }),
      svg("path", { d: path(active), class: "line active" })),
    h("figcaption", null, h("span", { class: "key archive" }, "archived tokens"), " ",
      h("span", { class: "key active" }, "active tokens"),
      saved !== null ? ` · the context holds ${100 - saved}% of the archive's tokens` : ""));
}

function compact(n) {
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)}k`;
  return String(n);
}
