// One search box over archive/search: this session or all, English and Chinese. Matches
// come back marked with ** in the snippet and become <mark> elements, never markup.

import { $, clear, fmtTime, h, snippetNodes } from "./dom.js";

export class Search {
  constructor(api, currentSession, onOpen) {
    this.api = api;
    this.currentSession = currentSession;
    this.onOpen = onOpen;
    this.seq = 0;
  }

  async run() {
    const query = $("#search-input").value.trim();
    const box = $("#search-results");
    if (!query) return this.close();
    const seq = ++this.seq;
    const sid = this.currentSession();
    const options = { limit: 30 };
    if ($("#search-scope").value === "session" && sid) options.sessionId = sid;
    let res;
    try {
      res = await this.api.archiveSearch(query, options);
    } catch (err) {
      if (seq !== this.seq) return;
      clear(box).append(this.head(err.message));
      box.hidden = false;
      return;
    }
    if (seq !== this.seq) return;
    const hits = res.hits;
    const where = options.sessionId ? "in this session" : "in all sessions";
    clear(box).append(this.head(
      `${hits.length} hit${hits.length === 1 ? "" : "s"} for “${query}” ${where}`));
    if (res.matched === "any") {
      box.append(h("p", { class: "search-note" },
        "No message has every word: these have some of them, best first."));
    }
    for (const hit of hits) box.append(this.hit(hit, sid));
    box.hidden = false;
  }

  head(text) {
    return h("div", { class: "search-head" }, text,
      h("button", { type: "button", class: "icon", onclick: () => this.close(), "aria-label": "Close" }, "✕"));
  }

  hit(hit, sid) {
    const href = `/s/${encodeURIComponent(hit.sessionId)}#m${hit.messageId}`;
    return h("a", { class: "hit", href, dataset: { messageId: String(hit.messageId) },
      onclick: (e) => { e.preventDefault(); this.close(); this.onOpen(hit); } },
    h("div", { class: "meta" }, `${hit.role} · ${hit.ordinal == null ? "" : `#${hit.ordinal} · `}msg ${hit.messageId} · ${fmtTime(hit.createdAt)} · `,
      h("span", { class: hit.inActiveContext ? "badge in" : "badge out" },
        hit.inActiveContext ? "in context" : "archived only"),
      hit.supersededBy ? h("span", { class: "badge out" }, ` superseded by msg ${hit.supersededBy}`) : "",
      hit.sessionId !== sid ? ` · ${hit.sessionId}` : ""),
    h("div", { class: "snippet" }, snippetNodes(hit.snippet)));
  }

  close() {
    const box = $("#search-results");
    box.hidden = true;
    clear(box);
  }
}
