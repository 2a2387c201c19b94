// ctxd's web page: the session list, and one session live (numbers, transcript, active
// context, compaction, approvals, a message box), over the daemon's JSON-RPC WebSocket.

import { $, clear, fmtAgo, fmtInt, fmtTime, h, longText, prettyArgs } from "./dom.js";
import { renderHistory, renderPins, renderSummary, renderSystem, renderTail } from "./panel.js";
import { Methods } from "./methods.js";
import { Rpc } from "./rpc.js";
import { Search } from "./search.js";
import { Transcript } from "./transcript.js";

const S = {
  sid: null,
  session: null,
  status: null,
  context: null,
  ctxIds: new Set(),
  ctxMax: 0,
  explain: null,
  approvals: new Map(),
  compacting: false,
  progressShown: false,
  listCursor: null,
  listCount: 0,
  unseen: 0,
};

const rpc = new Rpc({ onState: setConn, onNotification: onEvent, onOpen: catchUp });
// the protocol's calls, generated from its schema (methods.js)
const api = new Methods(rpc);
let transcript;
// a hit of this session scrolls to its message; another session's opens that session there
const finder = new Search(api, () => S.sid, (hit) => {
  if (hit.sessionId === S.sid) {
    history.replaceState(null, "", `#m${hit.messageId}`);
    jump(hit.messageId);
  } else {
    go(`/s/${encodeURIComponent(hit.sessionId)}#m${hit.messageId}`);
  }
});
const closeSearch = () => finder.close();

// connection state

function setConn(state, detail) {
  const el = $("#conn");
  const text = {
    connecting: "connecting…", live: "● live", reconnecting: "reconnecting…",
    offline: "daemon unreachable, retrying…", error: `error: ${detail}`,
    moved: "daemon unreachable: if it restarted, run `ctxd ui` again (retrying…)",
    loggedOut: "logged out: run `ctxd ui` for a new link",
  }[state];
  el.textContent = text;
  el.title = state === "loggedOut" && detail ? detail : "";
  el.className = `conn ${state}`;
  document.body.dataset.conn = state;
  updateGates();
}

// routing: / is the session list, /s/<sessionId> one session, #m<id> a message in it

function route() {
  const m = location.pathname.match(/^\/s\/([^/]+)$/);
  closeSearch();
  // a connection lost half-way is not an error: catchUp() redoes the work on reconnect
  const done = m ? openSession(decodeURIComponent(m[1])) : openList();
  done.catch((err) => {
    S.opening = null;
    console.warn("opening the page:", err.message);
  });
}

function go(path) {
  history.pushState(null, "", path);
  route();
}

// the session list

async function openList() {
  if (S.sid) api.sessionUnsubscribe(S.sid).catch(() => {});
  S.sid = null;
  if (transcript) transcript.reset(null);
  document.title = "Sessions · ctxd";
  $("#crumb").textContent = "";
  $("#session-view").hidden = true;
  $("#message-view").hidden = true;
  $("#sessions-view").hidden = false;
  $("#search-scope").value = "all";
  await loadSessions(true);
}

async function loadSessions(fresh) {
  const title = $("#session-filter").value.trim() || undefined;
  const options = { limit: fresh ? Math.max(50, Math.min(S.listCount, 1000)) : 50, title };
  if (!fresh) options.cursor = S.listCursor;
  const res = await api.sessionList(options);
  if (S.sid) return;
  const body = $("#sessions tbody");
  if (fresh) clear(body);
  for (const s of res.sessions) {
    const st = s.status;
    const href = `/s/${encodeURIComponent(s.sessionId)}`;
    const link = h("a", { href, onclick: (ev) => { ev.preventDefault(); go(href); } },
      s.title || s.sessionId);
    body.append(h("tr", { dataset: { sessionId: s.sessionId } },
      h("td", null, link, h("div", { class: "meta" }, s.sessionId)),
      h("td", { title: fmtTime(s.lastActivityAt) }, fmtAgo(s.lastActivityAt)),
      h("td", null, fmtInt(st.archiveMessages)),
      h("td", null, `${fmtInt(st.activeMessages)} · ${fmtInt(st.estimatedTokens)} tok`),
      h("td", { class: st.pendingApprovals ? "warn" : "" }, fmtInt(st.pendingApprovals)),
      h("td", null, fmtTime(s.createdAt))));
  }
  S.listCursor = res.nextCursor;
  S.listCount = body.children.length;
  $("#sessions-more").hidden = !res.nextCursor;
  $("#sessions-empty").hidden = S.listCount > 0;
}

// one session

async function openSession(sid) {
  S.opening = sid;
  delete document.body.dataset.ready;
  if (S.sid && S.sid !== sid) api.sessionUnsubscribe(S.sid).catch(() => {});
  S.sid = sid;
  S.approvals = new Map();
  S.context = null;
  S.explain = null;
  S.ctxIds = new Set();
  S.ctxMax = 0;
  $("#sessions-view").hidden = true;
  $("#message-view").hidden = true;
  $("#session-view").hidden = false;
  $("#search-scope").value = "session";
  $("#compact-result").textContent = "";
  $("#compact-result").className = "";
  clear($("#approvals"));
  transcript.reset(sid);
  S.unseen = 0;
  S.session = null;
  $("#new-below").hidden = true;
  let got;
  try {
    got = await api.sessionGet(sid);
  } catch (err) {
    if (S.sid !== sid) return;
    S.opening = null;
    $("#session-view").hidden = true;
    $("#message-view").hidden = false;
    $("#message-text").textContent = err.message;
    return;
  }
  if (S.sid !== sid) return;
  S.session = got.session;
  const title = got.session.title || sid;
  $("#crumb").textContent = title;
  setStatus(got.status);
  const m = location.hash.match(/^#m(\d+)$/);
  // subscribed before reading, so nothing appended meanwhile is missed
  const subscribed = api.sessionSubscribe(sid);
  await Promise.all([subscribed, refreshContext(),
    subscribed.then(() => (m ? transcript.jumpTo(Number(m[1])) : transcript.openNewest()))]);
  document.body.dataset.ready = "true";
  performance.mark("ctxd-ready");
  S.opening = null;
  await Promise.all([refreshApprovals(), refreshPins(), refreshExplain(), refreshHistory()]);
}

// after (re)connecting: subscribe again and fetch whatever changed meanwhile
async function catchUp() {
  if (!transcript) return;
  if (!S.sid) {
    if (!$("#sessions-view").hidden) await loadSessions(true);
    return;
  }
  const sid = S.sid;
  if (!S.context || !document.body.dataset.ready) {
    // the connection dropped while the session was opening: open it again
    if (!S.opening) await openSession(sid);
    return;
  }
  await api.sessionSubscribe(sid);
  await Promise.all([refreshStatus(), refreshContext(), refreshApprovals(), refreshPins(),
    refreshExplain(), refreshHistory(), transcript.catchUp()]);
}

function setStatus(st) {
  S.status = st;
  $("#n-active").textContent = fmtInt(st.activeMessages);
  $("#n-tokens").textContent = fmtInt(st.estimatedTokens);
  $("#n-compactions").textContent = fmtInt(st.compactionCount);
  const last = $("#n-last");
  last.textContent = st.lastCompactedAt ? fmtAgo(st.lastCompactedAt) : "never";
  last.title = st.lastCompactedAt ? fmtTime(st.lastCompactedAt) : "";
  $("#n-archive").textContent = fmtInt(st.archiveMessages);
  $("#n-run").textContent = st.compacting ? "compacting" : st.activeRunId ? "running" : "idle";
  $("#n-run").title = st.activeRunId || "";
  $("#n-approvals").textContent = fmtInt(st.pendingApprovals);
  const name = (S.session && S.session.title) || S.sid;
  if (name) document.title = `${st.pendingApprovals ? `(${st.pendingApprovals}) ` : ""}${name} · ctxd`;
  $("#n-approvals").classList.toggle("warn", st.pendingApprovals > 0);
  $("#n-paused").textContent = st.autoCompactionPaused ? "paused (3 failures)" : "on";
  $("#n-paused").classList.toggle("warn", st.autoCompactionPaused);
  // the summarizer in use, and when and why it last failed (hover for the message)
  const summ = $("#n-summarizer");
  const failed = st.summarizerLastFailureAt;
  summ.textContent = (st.summarizer || "–") + (failed ? ` · failed ${fmtAgo(failed)}` : "");
  summ.title = failed ? `${fmtTime(failed)}: ${st.summarizerLastFailure || ""}` : "";
  summ.classList.toggle("warn", !!failed);
  updateGates();
}

// Coalesce bursts of events into one request per kind.
const due = new Map();
function soon(name, fn, ms = 60) {
  if (due.has(name)) return;
  due.set(name, setTimeout(async () => {
    due.delete(name);
    try {
      await fn();
    } catch (err) {
      console.warn(name, err);
    }
  }, ms));
}

async function refreshStatus() {
  const sid = S.sid;
  const st = await api.contextStatus(sid);
  if (sid === S.sid) setStatus(st);
}

async function refreshContext() {
  const sid = S.sid;
  const ctx = await api.contextGet(sid);
  if (sid !== S.sid) return;
  S.context = ctx;
  S.ctxIds = new Set(ctx.messageIds.filter((x) => x !== null));
  S.ctxMax = Math.max(0, ...S.ctxIds);
  setStatus(ctx.status);
  renderSystem($("#system-box"), ctx);
  renderTail($("#tail-box"), ctx, { onJump: jump });
  transcript.refreshMarks();
}

async function refreshPins() {
  const sid = S.sid;
  const res = await api.contextPinsList(sid);
  if (sid !== S.sid) return;
  renderPins($("#pins-box"), res.pins, {
    onRemove: async (pin) => {
      await api.contextPinsRemove(sid, pin.pinId);
      await Promise.all([refreshPins(), refreshStatus()]);
    },
  });
}

async function refreshExplain() {
  const sid = S.sid;
  const res = await api.contextExplain(sid);
  if (sid !== S.sid) return;
  S.explain = res;
  drawSummary();
}

function drawSummary() {
  renderSummary($("#summary-box"), S.explain, { onJump: jump, detailed: $("#explain-toggle").checked });
}

async function refreshHistory() {
  const sid = S.sid;
  const res = await api.contextCompactions(sid, { limit: 100 });
  if (sid !== S.sid) return;
  renderHistory($("#history-box"), res.compactions, S.status);
}

async function refreshApprovals() {
  const sid = S.sid;
  const res = await api.approvalList(sid, { status: "pending" });
  if (sid !== S.sid) return;
  S.approvals = new Map(res.approvals.map((a) => [a.approvalId, a]));
  drawApprovals();
}

function drawApprovals() {
  const box = clear($("#approvals"));
  for (const a of S.approvals.values()) {
    const reason = h("input", { class: "reason-input", placeholder: "Reason (optional, shown to the agent)",
      "aria-label": "Reason" });
    const note = h("p", { class: "reason" });
    const decide = async (decision) => {
      for (const b of card.querySelectorAll("button")) b.disabled = true;
      try {
        await api.approvalResolve(a.approvalId, decision,
          { reason: reason.value.trim() || undefined });
      } catch (err) {
        note.textContent = err.message;
      }
      await Promise.all([refreshApprovals(), refreshStatus()]);
    };
    const card = h("div", { class: "approval card", dataset: { approvalId: a.approvalId } },
      h("div", { class: "approval-head" }, h("strong", null, "Approval needed: "),
        h("span", { class: "tool-name" }, a.toolName || "(unnamed tool)"),
        h("span", { class: "meta" }, ` call ${a.toolCallId} · ${fmtAgo(a.createdAt)}`)),
      longText(prettyArgs(a.arguments), { lines: 20, chars: 4000, cls: "args approval-args" }),
      h("div", { class: "row" }, reason,
        h("button", { type: "button", class: "approve", onclick: () => decide("approved") }, "Approve"),
        h("button", { type: "button", class: "deny", onclick: () => decide("denied") }, "Deny")),
      note);
    box.append(card);
  }
  updateGates();
}

// Compact and the message box wait while a tool call awaits approval.
function updateGates() {
  const pending = S.approvals.size || (S.status ? S.status.pendingApprovals : 0);
  const live = document.body.dataset.conn === "live";
  let why = "";
  if (!live) why = "Not connected to the daemon.";
  else if (pending) why = `A tool call awaits approval (${pending} pending): approve or deny it first.`;
  const compactWhy = why || (S.compacting || (S.status && S.status.compacting) ? "A compaction is running." : "");
  $("#message-input").disabled = !!why;
  $("#send").disabled = !!why;
  $("#composer-reason").textContent = why;
  $("#compact-button").disabled = !!compactWhy;
  $("#compact-instructions").disabled = !!why;
  $("#compact-reason").textContent = compactWhy;
}

function isInContext(id) {
  return S.ctxIds.has(id) || id > S.ctxMax;
}

async function jump(id) {
  const ok = await transcript.jumpTo(id);
  if (!ok) $("#compact-result").textContent = `Message msg ${id} is not in this session's archive.`;
}

// notifications from the daemon, whoever caused them

function onEvent(method, p) {
  if (method === "$/progress") return progress(p);
  if (!S.sid || p.sessionId !== S.sid) {
    if (!S.sid) soon("list", () => loadSessions(true), 300);
    return;
  }
  switch (method) {
    case "session/didAppend":
      soon("append", () => transcript.catchUp(), 20);
      soon("status", refreshStatus);
      soon("context", refreshContext, 150);
      break;
    case "context/didCompact":
      soon("context", refreshContext, 20);
      soon("explain", refreshExplain, 20);
      soon("history", refreshHistory, 20);
      break;
    case "context/compactionFailed":
      $("#compact-result").textContent = `A ${p.trigger} compaction failed: ${p.error && p.error.message}`;
      soon("history", refreshHistory, 20);
      soon("status", refreshStatus);
      break;
    case "session/didMissEvents":
      // the daemon dropped events while this tab fell behind: re-read what it shows
      soon("missed", () => Promise.all([refreshStatus(), refreshContext(), refreshApprovals(),
        refreshPins(), refreshExplain(), refreshHistory(), transcript.catchUp()]), 20);
      break;
    case "approval/didRequest":
    case "approval/didResolve":
      soon("approvals", refreshApprovals, 10);
      soon("status", refreshStatus);
      break;
    default:
      soon("status", refreshStatus);
  }
}

// what the compaction panel shows: progress while one runs (whoever started it), then
// how it ended; a report that arrives after its compaction ended changes nothing
const ended = new Set();
function progress(p) {
  if (p.sessionId !== S.sid) return;
  const bar = $("#compact-progress");
  const out = $("#compact-result");
  const v = p.value || {};
  if (v.kind === "end") {
    if (ended.size > 100) ended.clear();
    ended.add(p.token);
    bar.hidden = true;
    S.compacting = false;
    // this tab's own request writes its detailed result; another's ends here
    if (S.progressShown) {
      out.textContent = `Compaction finished: ${v.message || "done"}.`;
      out.className = /^(effective|dry run)$/.test(v.message || "") ? "ok" : "no";
    }
    S.progressShown = false;
  } else if (!ended.has(p.token)) {
    bar.hidden = false;
    S.compacting = true;
    if (typeof v.percentage === "number") bar.value = v.percentage;
    else bar.removeAttribute("value");
    out.textContent = v.message || v.title || "Compacting…";
    out.className = "";
    S.progressShown = true;
  }
  updateGates();
}

// actions

async function compactNow() {
  const sid = S.sid;
  const instructions = $("#compact-instructions").value.trim() || undefined;
  const out = $("#compact-result");
  out.textContent = "Compacting…";
  out.className = "";
  S.compacting = true;
  updateGates();
  try {
    const r = await api.contextCompact(sid, { force: true, instructions });
    if (sid !== S.sid) return;
    S.progressShown = false;
    out.textContent = r.effective
      ? `Effective: ${fmtInt(r.before.messages)} → ${fmtInt(r.after.messages)} messages, `
        + `${fmtInt(r.before.tokens)} → ${fmtInt(r.after.tokens)} tokens.`
      : `Not effective, nothing committed: ${r.reason || "the context would not shrink"}.`;
    out.className = r.effective ? "ok" : "no";
  } catch (err) {
    S.progressShown = false;
    out.textContent = `Compaction failed: ${err.message}`;
    out.className = "no";
  } finally {
    S.compacting = false;
    $("#compact-progress").hidden = true;
    updateGates();
    await Promise.all([refreshStatus(), refreshContext(), refreshExplain(), refreshHistory()]);
  }
}

async function sendMessage(ev) {
  ev.preventDefault();
  const box = $("#message-input");
  const text = box.value;
  if (!text.trim() || box.disabled) return;
  try {
    await api.messagesAppend(S.sid, [{ role: "user", content: text }]);
    box.value = "";
    $("#composer-reason").textContent = "";
    transcript.scrollToBottom();
  } catch (err) {
    $("#composer-reason").textContent = err.message;
  }
}

async function addPin(ev) {
  ev.preventDefault();
  const input = $("#pin-input");
  const text = input.value.trim();
  if (!text) return;
  await api.contextPinsAdd(S.sid, text);
  input.value = "";
  await Promise.all([refreshPins(), refreshStatus()]);
}

// wiring

function start() {
  transcript = new Transcript(api, $("#transcript-scroller"), $("#transcript"), {
    isInContext,
    // n > 0: messages arrived below the reader; -1: the reader is away from the newest
    onNewBelow: (n) => {
      const b = $("#new-below");
      if (n > 0) S.unseen += n;
      else if (n === 0) S.unseen = 0;
      b.hidden = n === 0;
      b.textContent = S.unseen ? `${S.unseen} new message${S.unseen === 1 ? "" : "s"} ↓` : "Newest ↓";
    },
  });
  $("#new-below").addEventListener("click", async () => {
    $("#new-below").hidden = true;
    S.unseen = 0;
    if (transcript.hasNewer) await transcript.openNewest();
    else transcript.scrollToBottom();
  });
  document.addEventListener("keydown", (ev) => {
    const typing = /^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement.tagName);
    if (ev.key === "/" && !typing) {
      ev.preventDefault();
      $("#search-input").focus();
    }
  });
  $("#home").addEventListener("click", (ev) => { ev.preventDefault(); go("/"); });
  $("#sessions-more").addEventListener("click", () => loadSessions(false).catch(() => {}));
  let filterTimer = null;
  $("#session-filter").addEventListener("input", () => {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(() => { S.listCount = 0; loadSessions(true).catch(() => {}); }, 200);
  });
  $("#compact-button").addEventListener("click", compactNow);
  $("#composer").addEventListener("submit", sendMessage);
  $("#message-input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) sendMessage(ev);
  });
  $("#pin-form").addEventListener("submit", (ev) => addPin(ev).catch((err) => {
    $("#pin-input").setCustomValidity(err.message);
    $("#pin-input").reportValidity();
  }));
  $("#pin-input").addEventListener("input", () => $("#pin-input").setCustomValidity(""));
  $("#explain-toggle").addEventListener("change", drawSummary);
  $("#search-form").addEventListener("submit", (ev) => { ev.preventDefault(); finder.run(); });
  $("#search-scope").addEventListener("change", () => {
    if ($("#search-input").value.trim()) finder.run();
  });
  document.addEventListener("keydown", (ev) => { if (ev.key === "Escape") closeSearch(); });
  window.addEventListener("popstate", route);
  // the list has no events of its own: look again every few seconds while it is shown
  setInterval(() => {
    if (!S.sid && !$("#sessions-view").hidden && rpc.open) loadSessions(true).catch(() => {});
  }, 3000);
  setInterval(() => { if (S.status) setStatus(S.status); }, 15000);
  // for the console and the tests: the connection and the page's state
  window.ctxd = { rpc, api, state: S, transcript };
  rpc.connect();
  route();
}

start();
