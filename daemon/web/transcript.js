// The transcript: the session's whole archive, oldest at the top, opened at the newest.
// Only a window of it lives in the DOM (at most MAX_WINDOW messages): scrolling up pages
// older messages in with archive/read beforeId and drops the newest ones, scrolling down
// pages them back, so memory stays bounded however far back a person reads.

import { contentText, fmtInt, fmtTime, h, longText, prettyArgs, clear } from "./dom.js";

const NEWEST = 9007199254740991;
const PAGE = 100;
export const MAX_WINDOW = 600;
const EDGE_PX = 900;
const ROLE_LABELS = { user: "User", assistant: "Assistant", system: "System", tool: "Tool result" };

// A page's messages, each with its #N: its place in the session, the number summary
// lines cite (archive ids are shown apart, as "msg N").
function numbered(res) {
  const first = res.firstOrdinal;
  res.messages.forEach((m, i) => { m.ordinal = first == null ? null : first + i; });
  return res.messages;
}

export class Transcript {
  constructor(api, scroller, list, { onNewBelow, isInContext }) {
    this.api = api;
    this.scroller = scroller;
    this.list = list;
    this.onNewBelow = onNewBelow;
    this.isInContext = isInContext;
    this.sid = null;
    this.items = [];
    this.els = new Map();
    this.toolNames = new Map();
    this.unnamed = new Set();
    this.hasOlder = false;
    this.hasNewer = false;
    this.busy = false;
    this.generation = 0;
    scroller.addEventListener("scroll", () => this.onScroll(), { passive: true });
  }

  reset(sid) {
    this.sid = sid;
    this.generation++;
    this.items = [];
    this.els.clear();
    this.toolNames.clear();
    this.unnamed.clear();
    this.hasOlder = this.hasNewer = false;
    clear(this.list);
  }

  get lastId() {
    return this.items.length ? this.items[this.items.length - 1].id : 0;
  }

  atBottom() {
    const s = this.scroller;
    return s.scrollHeight - s.scrollTop - s.clientHeight < 40;
  }

  scrollToBottom() {
    this.scroller.scrollTop = this.scroller.scrollHeight;
  }

  async openNewest() {
    const gen = this.generation;
    const res = await this.api.archiveRead(this.sid, { beforeId: NEWEST, limit: PAGE });
    if (gen !== this.generation) return;
    this.setWindow(numbered(res), res.nextBeforeId !== null, false);
    this.scrollToBottom();
  }

  async jumpTo(id) {
    id = Number(id);
    if (!this.els.has(id)) {
      const gen = this.generation;
      const half = PAGE / 2;
      const [older, newer] = await Promise.all([
        this.api.archiveRead(this.sid, { beforeId: id + 1, limit: half }),
        this.api.archiveRead(this.sid, { afterId: id, limit: half }),
      ]);
      if (gen !== this.generation) return false;
      this.setWindow([...numbered(older), ...numbered(newer)], older.nextBeforeId !== null,
        newer.nextAfterId !== null);
    }
    const el = this.els.get(id);
    if (!el) return false;
    for (const old of this.list.querySelectorAll(".msg.target")) old.classList.remove("target");
    el.classList.add("target");
    el.scrollIntoView({ block: "center" });
    return true;
  }

  setWindow(messages, hasOlder, hasNewer) {
    this.items = [];
    this.els.clear();
    this.toolNames.clear();
    this.unnamed.clear();
    clear(this.list);
    this.hasOlder = hasOlder;
    this.hasNewer = hasNewer;
    this.list.append(...messages.map((m) => this.add(m)));
    this.items = messages.slice();
    this.updateEdges();
  }

  updateEdges() {
    this.list.dataset.hasOlder = String(this.hasOlder);
    this.list.dataset.hasNewer = String(this.hasNewer);
    if (!this.hasOlder && this.items.length) this.list.dataset.start = "true";
    else delete this.list.dataset.start;
  }

  onScroll() {
    if (this.busy || !this.sid) return;
    const s = this.scroller;
    if (s.scrollTop < EDGE_PX && this.hasOlder) this.loadOlder();
    else if (s.scrollHeight - s.scrollTop - s.clientHeight < EDGE_PX && this.hasNewer) this.loadNewer();
    this.onNewBelow(this.atBottom() && !this.hasNewer ? 0 : -1);
  }

  async loadOlder() {
    if (this.busy || !this.items.length) return;
    this.busy = true;
    const gen = this.generation;
    try {
      const res = await this.api.archiveRead(this.sid, {
        beforeId: this.items[0].id, limit: PAGE });
      if (gen !== this.generation) return;
      const s = this.scroller;
      const before = s.scrollHeight;
      this.list.prepend(...numbered(res).map((m) => this.add(m)));
      this.items = res.messages.concat(this.items);
      // keep what the reader looks at where it is
      s.scrollTop += s.scrollHeight - before;
      this.hasOlder = res.nextBeforeId !== null;
      this.trim("newest");
      this.updateEdges();
    } finally {
      this.busy = false;
    }
  }

  async loadNewer() {
    if (this.busy || !this.items.length) return;
    this.busy = true;
    const gen = this.generation;
    try {
      const res = await this.api.archiveRead(this.sid, {
        afterId: this.lastId, limit: PAGE });
      if (gen !== this.generation) return;
      this.appendMessages(numbered(res));
      this.hasNewer = res.nextAfterId !== null;
      this.trim("oldest");
      this.updateEdges();
    } finally {
      this.busy = false;
    }
  }

  // New messages at the end (live appends or paging down); keeps the reader in place.
  appendMessages(messages) {
    const fresh = messages.filter((m) => !this.els.has(m.id));
    if (!fresh.length) return;
    this.list.append(...fresh.map((m) => this.add(m)));
    this.items.push(...fresh);
  }

  // Called for session/didAppend: fetch what is new when the window shows the newest.
  async catchUp() {
    if (this.hasNewer || !this.sid) return;
    const gen = this.generation;
    const stick = this.atBottom();
    let added = 0;
    for (;;) {
      const res = await this.api.archiveRead(this.sid, {
        afterId: this.lastId, limit: PAGE });
      if (gen !== this.generation) return;
      this.appendMessages(numbered(res));
      added += res.messages.length;
      if (res.nextAfterId === null) break;
    }
    if (stick) {
      this.trim("oldest");
      this.scrollToBottom();
    } else if (added) {
      this.onNewBelow(added);
    }
    this.updateEdges();
  }

  trim(which) {
    const excess = this.items.length - MAX_WINDOW;
    if (excess <= 0) return;
    const s = this.scroller;
    if (which === "newest") {
      for (const m of this.items.splice(this.items.length - excess)) this.drop(m.id);
      this.hasNewer = true;
    } else {
      const keep = this.els.get(this.items[excess].id);
      const top = keep.offsetTop;
      for (const m of this.items.splice(0, excess)) this.drop(m.id);
      s.scrollTop -= top - keep.offsetTop;
      this.hasOlder = true;
    }
  }

  drop(id) {
    const el = this.els.get(id);
    if (el) {
      el.remove();
      for (const label of el.querySelectorAll(".tool-of")) this.unnamed.delete(label);
    }
    this.els.delete(id);
  }

  refreshMarks() {
    for (const [id, el] of this.els) this.mark(el, id);
  }

  mark(el, id) {
    const inCtx = this.isInContext(id);
    el.classList.toggle("in-context", inCtx);
    el.classList.toggle("archived-only", !inCtx);
    const badge = el.querySelector(".ctx-mark");
    if (badge) badge.textContent = inCtx ? "in context" : "archived only";
  }

  add(m) {
    const role = m.role || "?";
    const head = h("header", { class: "msg-head" },
      h("span", { class: `role role-${role}` }, ROLE_LABELS[role] || role),
      m.name ? h("span", { class: "name" }, m.name) : null,
      h("span", { class: "ctx-mark" }),
      h("span", { class: "meta" }, `${m.ordinal == null ? "" : `#${m.ordinal} · `}msg ${m.id} · ${fmtInt(m.tokens)} tokens · ${fmtTime(m.createdAt)}`),
    );
    const el = h("article", { class: `msg role-${role}`, dataset: { id: String(m.id) } }, head);
    const text = contentText(m.content);
    if (role === "tool") {
      const call = this.toolNames.get(m.tool_call_id);
      const of = h("span", { class: "tool-of" }, `${call ? call.name : "tool"} · call ${m.tool_call_id || "?"}`);
      if (!call) {
        // its call is older than the window: named when a page brings the call in
        of.dataset.callId = m.tool_call_id || "";
        this.unnamed.add(of);
      }
      head.insertBefore(of, head.children[1]);
      el.append(longText(text, { lines: 8, chars: 1200 }));
    } else if (text) {
      el.append(longText(text, { lines: 40, chars: 8000 }));
    }
    for (const call of m.tool_calls || []) {
      const fn = call.function || {};
      this.toolNames.set(call.id, { name: fn.name, messageId: m.id });
      for (const label of this.unnamed) {
        if (label.dataset.callId === call.id) {
          label.textContent = `${fn.name || "tool"} · call ${call.id}`;
          this.unnamed.delete(label);
        }
      }
      el.append(h("div", { class: "tool-call" },
        h("div", { class: "tool-call-head" }, h("span", { class: "tool-icon" }, "⚙"),
          h("span", { class: "tool-name" }, fn.name || "(unnamed tool)"),
          h("span", { class: "meta" }, ` call ${call.id}`)),
        longText(prettyArgs(fn.arguments), { lines: 10, chars: 1500, cls: "args" })));
    }
    this.els.set(m.id, el);
    this.mark(el, m.id);
    return el;
  }
}
