// JSON-RPC 2.0 over the daemon's WebSocket. The page logs in with its first message
// (`initialize`): the one-time secret of a `ctxd ui` link (#login=…), then the page key
// the daemon gave for it, kept in localStorage: only this origin (scheme, host and port)
// can read it, where a cookie would reach every port of the host; the tabs of this origin
// share it. Reconnects with backoff and tells the app to catch up.

const KEY_ITEM = "ctxd.pageKey";
const UNAUTHORIZED = -32001;
// failed connection attempts in a row before the page says the daemon may have moved
const UNREACHABLE_AFTER = 8;

// The login secret of the address (#login=…), taken once and dropped from the address
// bar and the history entry before anything else can see it.
function takeLogin() {
  const m = location.hash.match(/^#login=([A-Za-z0-9_.-]{1,200})$/);
  if (!m) return null;
  history.replaceState(history.state, "", location.pathname + location.search);
  return m[1];
}

function storedKey() {
  try {
    return localStorage.getItem(KEY_ITEM);
  } catch {
    return null;
  }
}

function storeKey(key) {
  try {
    localStorage.setItem(KEY_ITEM, key);
  } catch {
    // no storage: this tab logs in again after a reload
  }
}

// a refused key goes, unless another tab stored a newer one meanwhile
function dropKey(key) {
  try {
    if (localStorage.getItem(KEY_ITEM) === key) localStorage.removeItem(KEY_ITEM);
  } catch {
    // no storage: this tab logs in again after a reload
  }
}

export class RpcError extends Error {
  constructor(error) {
    super(error.message);
    this.code = error.code;
    this.data = error.data;
  }
}

export class Rpc {
  constructor({ onState, onNotification, onOpen }) {
    this.onState = onState;
    this.onNotification = onNotification;
    this.onOpen = onOpen;
    this.nextId = 1;
    this.pending = new Map();
    this.ws = null;
    this.delay = 250;
    this.failures = 0;
    this.waiters = [];
    this.open = false;
    this.stopped = false;
    this.login = takeLogin();
    // a new `ctxd ui` link opened in this tab: log in with it
    window.addEventListener("hashchange", () => {
      const login = takeLogin();
      if (!login) return;
      this.login = login;
      if (this.stopped && this.loggedOut) {
        this.stopped = this.loggedOut = false;
        this.connect();
      }
    });
  }

  url() {
    return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`;
  }

  credentials() {
    if (this.login) return { pageLogin: this.login };
    const key = storedKey();
    return key ? { pageKey: key } : null;
  }

  logOut(detail) {
    this.stopped = this.loggedOut = true;
    this.onState("loggedOut", detail);
  }

  connect() {
    if (this.stopped) return;
    const creds = this.credentials();
    if (!creds) {
      this.logOut();
      return;
    }
    this.onState("connecting");
    const ws = new WebSocket(this.url());
    this.ws = ws;
    ws.addEventListener("open", async () => {
      this.delay = 250;
      this.failures = 0;
      let res;
      try {
        res = await this.send("initialize", { clientName: "ctxd web page", ...creds });
      } catch (err) {
        if (err.code === UNAUTHORIZED) {
          // a used or expired link, a key the daemon does not know (it restarted)
          if (creds.pageLogin && this.login === creds.pageLogin) this.login = null;
          if (creds.pageKey) dropKey(creds.pageKey);
          this.logOut(err.message);
          ws.close();
        } else {
          this.onState("error", err.message);
        }
        return;
      }
      if (creds.pageLogin && this.login === creds.pageLogin) this.login = null;
      if (res.pageKey) storeKey(res.pageKey);
      this.open = true;
      this.onState("live");
      for (const resolve of this.waiters.splice(0)) resolve();
      try {
        await this.onOpen();
      } catch (err) {
        console.warn("catching up:", err.message); // lost again: the next open retries
      }
    });
    ws.addEventListener("message", (ev) => this.receive(ev.data));
    ws.addEventListener("close", () => this.lost(ws));
  }

  lost(ws) {
    if (ws !== this.ws) return;
    const wasOpen = this.open;
    this.open = false;
    for (const { reject } of this.pending.values()) reject(new Error("connection lost"));
    this.pending.clear();
    if (this.stopped) {
      this.onState(this.loggedOut ? "loggedOut" : "offline");
      return;
    }
    this.failures += 1;
    // a restarted daemon may listen on another port: this page cannot find it there
    this.onState(wasOpen ? "reconnecting" : this.failures >= UNREACHABLE_AFTER ? "moved" : "offline");
    setTimeout(() => this.connect(), this.delay);
    this.delay = Math.min(this.delay * 2, 2000);
  }

  receive(data) {
    let msg;
    try {
      msg = JSON.parse(data);
    } catch {
      return;
    }
    for (const m of Array.isArray(msg) ? msg : [msg]) {
      if (m && m.method && m.id === undefined) {
        this.onNotification(m.method, m.params || {});
      } else if (m && this.pending.has(m.id)) {
        const { resolve, reject } = this.pending.get(m.id);
        this.pending.delete(m.id);
        if (m.error) reject(new RpcError(m.error));
        else resolve(m.result);
      }
    }
  }

  send(method, params) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      // Closed under us (the daemon dropped a reader that fell too far behind) while
      // the events read before the close are still being handled: the close event comes
      // next and reconnects; this request fails like the others in flight.
      if (this.ws.readyState !== WebSocket.OPEN) {
        reject(new Error("connection lost"));
        return;
      }
      this.pending.set(id, { resolve, reject });
      this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    });
  }

  // A request; waits for the connection when it is down.
  async call(method, params = {}) {
    while (!this.open) {
      if (this.stopped) throw new Error("logged out");
      await new Promise((resolve) => this.waiters.push(resolve));
    }
    return this.send(method, params);
  }
}
