// DOM helpers. Every piece of data becomes a text node: nothing here parses HTML.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [key, value] of Object.entries(attrs)) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") el.className = value;
      else if (key === "dataset") Object.assign(el.dataset, value);
      else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else if (key === "text") el.textContent = String(value);
      else el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

export function $(selector, root = document) {
  return root.querySelector(selector);
}

export function fmtInt(n) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US");
}

export function fmtTime(sec) {
  if (sec === null || sec === undefined) return "never";
  const d = new Date(sec * 1000);
  return d.toLocaleString(undefined, {
    year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit",
  });
}

export function fmtAgo(sec) {
  if (sec === null || sec === undefined) return "never";
  const s = Math.max(0, Date.now() / 1000 - sec);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

export function fmtBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KB`;
  return `${(n / 1024 / 1024).toFixed(1)} MB`;
}

// Text of a chat message's content: a string, null, or OpenAI content parts.
export function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((part) => {
      if (part && typeof part === "object") {
        if (typeof part.text === "string") return part.text;
        if (part.type) return `[${part.type}]`;
      }
      return typeof part === "string" ? part : JSON.stringify(part);
    }).join("\n");
  }
  return JSON.stringify(content);
}

export function prettyArgs(args) {
  if (args === null || args === undefined) return "";
  if (typeof args === "string") {
    try {
      return JSON.stringify(JSON.parse(args), null, 2);
    } catch {
      return args;
    }
  }
  return JSON.stringify(args, null, 2);
}

// A search snippet: the daemon marks matches with ** ... **; matches become <mark>.
export function snippetNodes(snippet) {
  const parts = String(snippet).split("**");
  return parts.map((text, i) => (i % 2 === 1 ? h("mark", null, text) : document.createTextNode(text)));
}

// Long text shown cut, with a button that shows the rest. Megabytes stay out of the DOM
// until asked for, and even then go in as one text node.
export function longText(text, { lines = 12, chars = 2000, cls = "body" } = {}) {
  const box = h("div", { class: cls });
  let cut = text.length > chars ? chars : -1;
  const nl = nthIndex(text, "\n", lines);
  if (nl !== -1 && (cut === -1 || nl < cut)) cut = nl;
  if (cut === -1) {
    box.textContent = text;
    return box;
  }
  const pre = h("div", { class: "text" }, text.slice(0, cut));
  const rest = text.length - cut;
  const more = h("button", { class: "link expand", type: "button" },
    `Show all (${fmtInt(rest)} more characters, ${fmtBytes(new Blob([text]).size)})`);
  let open = false;
  more.addEventListener("click", () => {
    open = !open;
    pre.textContent = open ? text : text.slice(0, cut);
    more.textContent = open ? "Show less" : `Show all (${fmtInt(rest)} more characters)`;
    box.classList.toggle("expanded", open);
  });
  box.classList.add("collapsed");
  append(box, [pre, more]);
  return box;
}

function nthIndex(text, needle, n) {
  let i = -1;
  for (let k = 0; k < n; k++) {
    i = text.indexOf(needle, i + 1);
    if (i === -1) return -1;
  }
  return i;
}
